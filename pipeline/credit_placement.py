"""Stage `credit_placement`: where each credit method puts its weight on the decisive-step task, against the
generator's truth, and what share of the GRPO-to-oracle accuracy gap it closes (pipeline.stats.credit_truth).

    python -m pipeline.credit_placement --rollouts SEED MODEL_DIR SAMPLES_JSONL [--rollouts ...]
        --runs METHOD SEED SAMPLES_JSONL [--runs ...] --benchmark eval_data/NAME.jsonl
        [--analysis-spec TA_SPEC] --methods METHODS [--floor grpo] [--ceiling oracle]
        [--max-rollouts 256] [--batch-size 16] [--resamples 2000] [--confidence 0.95] [--seed 0]
        --out-dir results/credit_placement/MODEL

Every method of METHODS that gives per-token advantages is scored on the same rollouts: those of ``--rollouts``
(one training seed's checkpoint and its evaluation samples each; the study's ``credit_truth.rollouts_of``
method), computed by the method itself on that checkpoint's model, as in training
(``pipeline.evaluation.offline_credit``), at the token analysis's saliency temperature and prompt format. A
method's placement is of its weights ``w_{i,t}``, or, for a method without weights (additive: KTAE), of its
per-token advantage relative to the rollout's, ``Â_{i,t} / A_i`` (for a multiplicative method the two are equal).

The unit is an item's group of samples, as in training: the whole group is weighed together (a group method
needs it), in its own batch (one prompt, the completions padded to the group's longest; a method splits it into
``--batch-size`` rows per forward and backward), so no rollout's weights depend on which other items were weighed
or on the batch size while it holds a group. Per seed, whole groups are taken in benchmark order until
``--max-rollouts`` rollouts whose advantage is not zero are held (GRPO's centred group reward over the item's
samples; a zero advantage carries no loss), and those rollouts are scored. A method's noise (OAR-G's, grail_shuffled's
permutations) is seeded per group, from ``--seed``, the training seed and the item (``offline_credit.group_seed``).
Each completion's per-token truth comes
from its problem (``pipeline.tasks.decisive.token_truth``), never from a model.

Each method gets two placements per sign: on every token, and outside the answer's box (the queried chain against
the filler chains). The second asks whether a method finds the decisive step of the reasoning: GRAIL's answer
override weights the box apart from everything else, and so does ``grail_shuffled``, which is therefore at chance
only outside the box.

Writes OUT_DIR/placement.json (per method: ``credit``, ``blame``, ``credit_outside_answer`` and
``blame_outside_answer``, each the mean AUROC with its seeds-then-rollouts interval; each run's accuracy; each
method's gap share from ``--floor`` to ``--ceiling`` with its interval) and OUT_DIR/placement.png (the placements,
with chance at ½, and the gap shares).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.core.io import InputError, atomic_save_figure, atomic_write_json, load_spec, read_jsonl, run_cli
from pipeline.core.progress import progress
from pipeline.core.specs import dataclass_from_mapping
from pipeline.evaluation.offline_credit import centred_advantages, credit_methods, method_result, relative_advantages
from pipeline.evaluation.token_weights import (
    Rollout,
    TokenAnalysisSpec,
    grouped_samples,
    prompt_ids,
    rollout_batch,
)
from pipeline.models.loading import load_model, load_tokenizer, working_dtype
from pipeline.stats.credit_truth import gap_share, placement
from pipeline.tasks.decisive import is_decisive_problem, token_truth

SIGNS = {"credit": 1, "blame": -1}
OUTSIDE_ANSWER = "_outside_answer"  # the scores with the answer's box left out: the queried chain against the rest


def outside_answer(weights: list[float], decisive: list[bool], in_answer: list[bool]) -> tuple[list, list]:
    """The weights and labels of the tokens outside the answer's box."""
    kept = [index for index, inside in enumerate(in_answer) if not inside]
    return [weights[i] for i in kept], [decisive[i] for i in kept]


@dataclasses.dataclass
class ScoredRollout:
    """One rollout with a non-zero advantage: its tokens' truth and, once computed, each method's weights."""

    seed: int
    problem: str
    completion_ids: list[int]
    correct: bool
    advantage: float
    decisive: list[bool]
    in_answer: list[bool]  # the answer's box: GRAIL's answer override (and grail_shuffled's) weights it apart
    weights: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    @property
    def scored(self) -> bool:
        """Whether its placement counts: a non-zero advantage (a zero one carries no loss) and a token."""
        return self.advantage != 0 and bool(self.completion_ids)


@dataclasses.dataclass
class ScoredGroup:
    """An item's evaluation samples, whole: every rollout (empty ones too, as training sees them) and its reward;
    ``scored`` are those with a non-zero advantage and a token, whose placement counts."""

    item: str
    problem: str
    rollouts: list[ScoredRollout]
    rewards: list[float]

    @property
    def scored(self) -> list[ScoredRollout]:
        return [rollout for rollout in self.rollouts if rollout.scored]


def scored_groups(
    seed: int, samples: list[dict[str, Any]], problems: dict[str, str], tokenizer: Any, limit: int, where: Path
) -> list[ScoredGroup]:
    """Whole groups in benchmark order, those with a scored rollout, until ``limit`` scored rollouts are held."""
    chosen: list[ScoredGroup] = []
    held = 0
    for item, samples_of_item in grouped_samples(samples, problems, where).items():
        rewards = [float(sample["correct"]) for sample in samples_of_item]
        rollouts = []
        for sample, advantage in zip(samples_of_item, centred_advantages(rewards), strict=True):
            ids = tokenizer(sample["completion"], add_special_tokens=False)["input_ids"] if sample["completion"] else []
            truth = token_truth(tokenizer, problems[item], ids) if ids else None
            decisive, in_answer = (truth.decisive, truth.in_answer) if truth else ([], [])
            rollouts.append(
                ScoredRollout(seed, problems[item], ids, bool(sample["correct"]), advantage, decisive, in_answer)
            )
        group = ScoredGroup(item, problems[item], rollouts, rewards)
        if group.scored:
            chosen.append(group)
            held += len(group.scored)
        if held >= limit:
            break
    return chosen


def weigh(
    groups: list[ScoredGroup],
    model: Any,
    tokenizer: Any,
    analysis: TokenAnalysisSpec,
    methods: dict[str, Any],
) -> None:
    """Fill in every method's weights (``w``, or ``Â / A`` for a method without weights) of the scored rollouts,
    one whole group per batch."""
    for group in progress(groups, desc="weights", unit="group"):
        prompt = prompt_ids(tokenizer, group.problem, analysis)
        sampled = [Rollout(prompt, r.completion_ids, r.correct) for r in group.rollouts]
        advantages = [r.advantage for r in group.rollouts]
        batch = rollout_batch(sampled, advantages, tokenizer.pad_token_id)
        rewards = torch.tensor(group.rewards)
        for name, method in methods.items():
            result = method_result(method, model, tokenizer, batch, rewards, f"{group.rollouts[0].seed}/{group.item}")
            weights = result.weights
            if weights is None:
                weights = relative_advantages(result.advantages, batch["advantages"])
            for row, rollout in enumerate(group.rollouts):
                if rollout.scored:
                    rollout.weights[name] = weights[row, : len(rollout.completion_ids)].detach().tolist()


def run_accuracies(runs: Sequence[tuple[str, str, str]]) -> dict[str, dict[int, float]]:
    """Each run's accuracy (the mean of its samples' correctness), by method and training seed."""
    accuracies: dict[str, dict[int, float]] = defaultdict(dict)
    for method, seed, path in runs:
        correct = [float(row["correct"]) for row in read_jsonl(path)]
        if not correct:
            raise InputError(f"{path}: no evaluation samples")
        accuracies[method][int(seed)] = float(np.mean(correct))
    return dict(accuracies)


def summary(
    rollouts: list[ScoredRollout],
    weighting: list[str],
    accuracies: dict[str, dict[int, float]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """placement.json: the scores of every weighting method and the gap shares (module docstring)."""
    placements = {}
    for name in weighting:
        whole = [(r.seed, r.advantage, r.weights[name], r.decisive) for r in rollouts if name in r.weights]
        reasoning = [
            (r.seed, r.advantage, *outside_answer(r.weights[name], r.decisive, r.in_answer))
            for r in rollouts
            if name in r.weights
        ]
        placements[name] = {
            f"{label}{part}": dataclasses.asdict(
                placement(scored, sign, resamples=args.resamples, confidence=args.confidence, seed=args.seed)
            )
            for label, sign in SIGNS.items()
            for part, scored in (("", whole), (OUTSIDE_ANSWER, reasoning))
        }
    shares = {}
    if args.floor in accuracies and args.ceiling in accuracies:
        floor, ceiling = list(accuracies[args.floor].values()), list(accuracies[args.ceiling].values())
        shares = {
            method: dataclasses.asdict(
                gap_share(
                    list(runs.values()),
                    floor,
                    ceiling,
                    resamples=args.resamples,
                    confidence=args.confidence,
                    seed=args.seed,
                )
            )
            for method, runs in accuracies.items()
        }
    return {
        "benchmark": str(args.benchmark),
        "seeds": sorted({r.seed for r in rollouts}),
        "rollouts": len(rollouts),
        "decisive_token_share": float(np.mean([t for r in rollouts for t in r.decisive])) if rollouts else None,
        "confidence": args.confidence,
        "placement": placements,
        "accuracy": {method: {str(seed): value for seed, value in runs.items()} for method, runs in accuracies.items()},
        "floor": args.floor,
        "ceiling": args.ceiling,
        "gap_share": shares,
    }


def placement_figure(result: dict[str, Any]) -> Any:
    """Left: each method's credit and blame AUROC with intervals (chance ½, the truth's own 1). Right: each
    method's gap share with its interval (the floor 0, the ceiling 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 0.5 * max(len(result["placement"]), 3) + 1.8))
    names = list(result["placement"])
    series = [
        (-0.24, "credit", "o", "C0", True),
        (-0.08, f"credit{OUTSIDE_ANSWER}", "o", "C0", False),
        (0.08, "blame", "s", "C3", True),
        (0.24, f"blame{OUTSIDE_ANSWER}", "s", "C3", False),
    ]
    for offset, key, marker, colour, filled in series:
        shown = [(row, result["placement"][name][key]) for row, name in enumerate(names)]
        shown = [(row, score) for row, score in shown if score["mean"] is not None]
        if not shown:
            continue
        means = np.array([score["mean"] for _, score in shown])
        errors = np.array([[score["mean"] - score["low"], score["high"] - score["mean"]] for _, score in shown]).T
        sign = "A > 0" if key.startswith("credit") else "A < 0"
        where = "" if filled else ", box left out"
        label = f"{key.split('_')[0]} ({sign}{where})"
        left.errorbar(
            means,
            [row + offset for row, _ in shown],
            xerr=errors,
            fmt=marker,
            color=colour,
            capsize=3,
            label=label,
            markerfacecolor=colour if filled else "white",
        )
    left.axvline(0.5, color="grey", linestyle="--", linewidth=1)
    left.set_yticks(range(len(names)), names)
    left.set_xlim(0, 1.02)
    left.invert_yaxis()
    left.set_xlabel("AUROC of the weights against the decisive tokens (½: chance)")
    left.legend(loc="best", fontsize=8)
    shares = {name: share for name, share in result["gap_share"].items() if share["share"] is not None}
    if shares:
        share_names = list(shares)
        for row, name in enumerate(share_names):
            share = shares[name]
            error = None
            if share["low"] is not None:
                error = [[share["share"] - share["low"]], [share["high"] - share["share"]]]
            right.errorbar(share["share"], row, xerr=error, fmt="o", color="C2", capsize=3)
        right.set_yticks(range(len(share_names)), share_names)
        right.invert_yaxis()
        for value in (0, 1):
            right.axvline(value, color="grey", linestyle="--", linewidth=1)
        right.set_xlabel(f"share of the {result['floor']}-to-{result['ceiling']} accuracy gap closed")
    else:
        right.axis("off")
        right.text(
            0.5,
            0.5,
            f"no gap share: {result['ceiling']} does not beat {result['floor']}\n(or one of them is not in the study)",
            ha="center",
            va="center",
            fontsize=9,
        )
    figure.tight_layout()
    return figure


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipeline.credit_placement", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rollouts",
        nargs=3,
        action="append",
        required=True,
        metavar=("SEED", "MODEL_DIR", "SAMPLES_JSONL"),
        help="a training seed's checkpoint whose rollouts every method is scored on, and its evaluation samples",
    )
    parser.add_argument(
        "--runs",
        nargs=3,
        action="append",
        default=[],
        metavar=("METHOD", "SEED", "SAMPLES_JSONL"),
        help="a run's evaluation samples on the benchmark (its accuracy, for the gap share)",
    )
    parser.add_argument("--benchmark", required=True, type=Path, help="the decisive-step benchmark JSONL")
    parser.add_argument("--analysis-spec", default="{}", help="token-analysis settings: prompt format, temperature")
    parser.add_argument("--methods", required=True, help="method name -> its credit options (JSON/YAML)")
    parser.add_argument("--floor", default="grpo", help="the method that is 0 in the gap share")
    parser.add_argument("--ceiling", default="oracle", help="the method that is 1 in the gap share")
    parser.add_argument(
        "--max-rollouts", type=int, default=256, help="rollouts scored per seed (whole groups: at least this many)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=16, help="rollouts per forward and backward (within one item's group)"
    )
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--confidence", type=float, default=0.95, help="the intervals' level")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed and the methods' noise")
    parser.add_argument("--out-dir", required=True, type=Path, help="placement.json and placement.png go here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    for option in ("max_rollouts", "batch_size", "resamples"):
        if getattr(args, option) < 1:
            raise InputError(f"--{option.replace('_', '-')}: must be >= 1, got {getattr(args, option)}")
    analysis = dataclass_from_mapping(TokenAnalysisSpec, load_spec(args.analysis_spec), "token_analysis spec")
    methods, _ = credit_methods(load_spec(args.methods), analysis.temperature, args.seed, args.batch_size)
    problems = {row["id"]: row["problem"] for row in read_jsonl(args.benchmark)}
    if not problems or not all(map(is_decisive_problem, problems.values())):
        raise InputError(f"{args.benchmark}: not a decisive-step benchmark (pipeline.tasks.decisive)")
    rollouts: list[ScoredRollout] = []
    for seed, model_dir, samples in args.rollouts:
        tokenizer = load_tokenizer(model_dir)
        groups = scored_groups(int(seed), read_jsonl(samples), problems, tokenizer, args.max_rollouts, Path(samples))
        if groups:
            model = load_model(model_dir, dtype=working_dtype(model_dir)).eval()
            weigh(groups, model, tokenizer, analysis, methods)
        rollouts += [rollout for group in groups for rollout in group.scored]
    weighting = list(methods)
    result = summary(rollouts, weighting, run_accuracies(args.runs), args)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    atomic_save_figure(placement_figure(result), args.out_dir / "placement.png", dpi=120)
    atomic_write_json(args.out_dir / "placement.json", result)
    print(f"{args.out_dir}: {len(rollouts)} rollouts of {len(result['seeds'])} seeds, methods {', '.join(weighting)}")


if __name__ == "__main__":
    run_cli(main)
