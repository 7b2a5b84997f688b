"""Stage `token_viewer`: an HTML page that shows where each credit method puts its weight, token by token.

    python -m pipeline.token_viewer --rollouts LABEL MODEL_DIR SAMPLES_JSONL [--rollouts ...]
        --benchmark eval_data/NAME.jsonl [--analysis-spec TA_SPEC] [--methods METHODS]
        [--per-outcome 2] [--seed 0] --out results/token_weights.html

For each ``--rollouts`` (a run's checkpoint and its evaluation samples), ``--per-outcome`` correct and as many wrong
rollouts are chosen reproducibly from ``--seed`` (preferring rollouts whose group has mixed outcomes, i.e. a
non-zero advantage). METHODS maps a study's method names to their credit options (``credit``, the shared options
of ``pipeline.credit.settings.SharedCreditOptions`` and the method's own: ``grail_*``, ``credit_options``, ...).
Every method that weights tokens (a per-token or group method whose ``CreditResult`` has weights: GRAIL, OAR-G,
the controls, an out-of-tree one) gets a row per rollout, its weights computed by the method itself (the
trainer's code path, through ``pipeline.evaluation.offline_credit``) on that checkpoint's model, at the token
analysis's saliency temperature and with the prompt the rollouts were sampled from (TA_SPEC); the others (GRPO,
high_entropy, the additive KTAE) are named as having none. Each rollout is weighed within its item's whole group
of samples, one group per batch, as in training: a group method sees the group, and no rollout's weights depend
on the other rollouts shown. The advantage is GRPO's centred group reward ``A_i = r_i - mean_j r_j`` over the
item's evaluation samples (rewards unscaled, as upstream's ``dr_grpo`` settings); as in training, a rollout with a
zero advantage carries no loss and keeps weight 1.

Each token is coloured by its weight: the colour's opacity grows with the logarithm of the weight, from the
rollout's smallest weight (faint) to its largest (full), so a higher weight is always a stronger colour. The
boxed answer is outlined; hovering a token shows its weight under every method and the advantage.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.core.disk_full import output_space
from pipeline.core.io import InputError, atomic_write_text, load_spec, read_jsonl, run_cli
from pipeline.core.progress import progress
from pipeline.core.specs import dataclass_from_mapping
from pipeline.credit import find_boxed_spans
from pipeline.credit.method import CreditMethod
from pipeline.evaluation.offline_credit import centred_advantages, credit_methods, method_result
from pipeline.evaluation.token_weights import (
    Rollout,
    TokenAnalysisSpec,
    add_checkpoint_arguments,
    grouped_samples,
    prompt_ids,
    rollout_batch,
)
from pipeline.models.loading import load_model, load_tokenizer, working_dtype
from pipeline.stats.credit_truth import rollout_auroc
from pipeline.tasks.decisive import decisive_tokens, is_decisive_problem

# matplotlib's tab10, one colour per weighting method in the order METHODS lists them
METHOD_COLOURS = [(214, 39, 40), (31, 119, 180), (44, 160, 44), (148, 103, 189), (255, 127, 14), (140, 86, 75)]
MIN_OPACITY = 0.06


@dataclass
class ViewedRollout:
    """One chosen evaluation sample and, once computed, its per-token view."""

    id: str
    sample: int
    problem: str
    completion: str
    correct: bool
    advantage: float
    tokens: list[str] = dataclasses.field(default_factory=list)
    weights: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # per weighting method, per token
    boxed: tuple[int, int] | None = None  # [start, end) of the boxed answer in tokens
    decisive: list[bool] | None = None  # per token, on a decisive-step problem (pipeline.tasks.decisive)


# ----------------------------------------------------------------------------------------------- settings


# ----------------------------------------------------------------------------------------------- choice


def choose_rollouts(
    groups: dict[str, list[dict[str, Any]]], problems: dict[str, str], per_outcome: int, rng: random.Random
) -> list[ViewedRollout]:
    """``per_outcome`` correct and ``per_outcome`` wrong non-empty rollouts, those with a non-zero advantage first,
    each group drawn by ``rng``; fewer when the samples hold fewer."""
    candidates = []
    for item, group in groups.items():
        advantages = centred_advantages([float(sample["correct"]) for sample in group])
        candidates += [
            ViewedRollout(item, s["sample"], problems[item], s["completion"], bool(s["correct"]), advantage)
            for s, advantage in zip(group, advantages, strict=True)
            if s["completion"]
        ]
    chosen = []
    for outcome in (True, False):
        pool = [c for c in candidates if c.correct == outcome]
        informative = [c for c in pool if c.advantage != 0]
        rest = [c for c in pool if c.advantage == 0]
        picked = rng.sample(informative, min(per_outcome, len(informative)))
        picked += rng.sample(rest, min(per_outcome - len(picked), len(rest)))
        chosen += picked
    return chosen


# ----------------------------------------------------------------------------------------------- weights


def token_texts(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each token's text as the difference of decoded prefixes, so the texts concatenate to the decoded whole
    (decoding tokens one by one breaks characters split over several byte tokens)."""
    texts, previous = [], ""
    for end in range(1, len(ids) + 1):
        decoded = tokenizer.decode(ids[:end], skip_special_tokens=False)
        texts.append(decoded[len(previous) :] if decoded.startswith(previous) else decoded)
        previous = decoded
    return texts


def compute_views(
    model: Any,
    tokenizer: Any,
    rollouts: list[ViewedRollout],
    groups: dict[str, list[dict[str, Any]]],
    analysis: TokenAnalysisSpec,
    methods: dict[str, CreditMethod],
) -> list[str]:
    """Fill in the tokens, every method's weights and the boxed span of ``rollouts``, each weighed within its
    item's whole group of samples (``groups``), one group per batch as in training; return the methods that gave
    no weights."""
    unweighted: set[str] = set()
    for item in dict.fromkeys(rollout.id for rollout in rollouts):
        samples, chosen = groups[item], [rollout for rollout in rollouts if rollout.id == item]
        prompt = prompt_ids(tokenizer, chosen[0].problem, analysis)
        completions = [tokenizer(s["completion"], add_special_tokens=False)["input_ids"] for s in samples]
        rewards = [float(s["correct"]) for s in samples]
        sampled = [Rollout(prompt, ids, bool(reward)) for ids, reward in zip(completions, rewards, strict=True)]
        batch = rollout_batch(sampled, centred_advantages(rewards), tokenizer.pad_token_id)
        computed = {
            name: method_result(method, model, tokenizer, batch, torch.tensor(rewards), item).weights
            for name, method in methods.items()
        }
        unweighted |= {name for name, values in computed.items() if values is None}
        # the outline marks the answer of the first weighting method (one per rollout, whatever the others use)
        which = next(iter(methods.values())).args.answer_span if methods else "first"
        spans = find_boxed_spans(tokenizer, batch["completion_ids"], batch["completion_mask"], which=which)
        rows = {sample["sample"]: row for row, sample in enumerate(samples)}
        for rollout in chosen:
            row, ids = rows[rollout.sample], completions[rows[rollout.sample]]
            rollout.tokens = token_texts(tokenizer, ids)
            if is_decisive_problem(rollout.problem):
                rollout.decisive = decisive_tokens(tokenizer, rollout.problem, ids)
            rollout.weights = {
                name: values[row, : len(ids)].tolist() for name, values in computed.items() if values is not None
            }
            start, _, end = (int(value) for value in spans[row])
            rollout.boxed = (start, end) if start >= 0 else None
    return [name for name in methods if name in unweighted]


# ----------------------------------------------------------------------------------------------- page


def opacity(weight: float, lowest: float, highest: float) -> float:
    """Colour opacity of ``weight`` among weights in [lowest, highest]: increasing in the weight, on a log scale
    (GRAIL's weights span 0.5 to 5), from MIN_OPACITY to 1; all equal weights get the middle value."""
    floor = 1e-6  # weights are positive on valid tokens; guard the logarithm all the same
    low, high, value = (math.log(max(w, floor)) for w in (lowest, highest, weight))
    if high - low < 1e-12:
        return 0.5
    return round(MIN_OPACITY + (1 - MIN_OPACITY) * (value - low) / (high - low), 4)


def colour(position: int) -> tuple[int, int, int]:
    """The colour of the ``position``-th weighting method."""
    return METHOD_COLOURS[position % len(METHOD_COLOURS)]


def token_span(rollout: ViewedRollout, index: int, rgb: tuple[int, int, int], weights: list[float]) -> str:
    alpha = opacity(weights[index], min(weights), max(weights))
    boxed = rollout.boxed is not None and rollout.boxed[0] <= index < rollout.boxed[1]
    decisive = rollout.decisive is not None and rollout.decisive[index]
    attributes = {
        "class": " ".join(["token", *(["boxed"] if boxed else []), *(["decisive"] if decisive else [])]),
        "data-index": str(index),
        "data-weight": f"{weights[index]:.6g}",
        "style": f"background-color: rgba({rgb[0]}, {rgb[1]}, {rgb[2]}, {alpha})",
    }
    rendered = " ".join(f'{name}="{html.escape(value)}"' for name, value in attributes.items())
    return f"<span {rendered}>{html.escape(rollout.tokens[index])}</span>"


def rollout_block(rollout: ViewedRollout) -> str:
    outcome = "correct" if rollout.correct else "wrong"
    lines = []
    for position, (method, weights) in enumerate(rollout.weights.items()):
        rgb = colour(position)
        tokens = "".join(token_span(rollout, index, rgb, weights) for index in range(len(rollout.tokens)))
        placement = ""
        auroc = rollout_auroc(weights, rollout.decisive) if rollout.decisive and rollout.advantage else None
        if auroc is not None:
            role = "credit" if rollout.advantage > 0 else "blame"
            placement = f'<span class="auroc" data-auroc="{auroc:.4f}">{role} AUROC {auroc:.2f}</span>'
        lines.append(
            f'<div class="weights" data-method="{html.escape(method)}"><span class="method">{html.escape(method)}'
            f'{placement}</span><span class="completion">{tokens}</span></div>'
        )
    shown = {method: [float(f"{w:.6g}") for w in weights] for method, weights in rollout.weights.items()}
    return (
        f'<div class="rollout {outcome}" data-id="{html.escape(rollout.id)}" data-sample="{rollout.sample}" '
        f'data-correct="{str(rollout.correct).lower()}" data-advantage="{rollout.advantage:+.6g}" '
        f'data-weights="{html.escape(json.dumps(shown))}">'
        f'<p class="meta"><b>{html.escape(rollout.id)}</b> sample {rollout.sample} · <b>{outcome}</b> · '
        f"advantage {rollout.advantage:+.3f}"
        + ("" if rollout.boxed else " · no complete \\boxed{}")
        + ("" if rollout.advantage else " · a zero advantage carries no loss: weight 1")
        + f'</p><p class="problem">{html.escape(rollout.problem)}</p>'
        + "".join(lines)
        + "</div>"
    )


PAGE_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; max-width: 75em; color: #222; }
.rollout { border-top: 1px solid #ccc; padding: 0.6em 0; }
.problem { color: #555; font-size: 0.9em; white-space: pre-wrap; }
.weights { display: flex; gap: 0.8em; margin: 0.3em 0; }
.method { flex: 0 0 8em; font-weight: bold; font-size: 0.85em; overflow-wrap: anywhere; }
.completion { font-family: ui-monospace, monospace; white-space: pre-wrap; line-height: 1.7; }
.token { cursor: default; }
.token.boxed { outline: 2px solid #2a2; outline-offset: -1px; }
.token.decisive { border-bottom: 2px solid #000; }
.auroc { display: block; font-weight: normal; color: #555; }
#tooltip { position: fixed; display: none; background: #222; color: #fff; padding: 0.4em 0.6em;
           border-radius: 4px; font-size: 0.85em; pointer-events: none; white-space: pre; z-index: 10; }
"""

PAGE_SCRIPT = """
const tooltip = document.getElementById("tooltip");
document.querySelectorAll(".token").forEach((token) => {
  token.addEventListener("mouseover", (event) => {
    const rollout = token.closest(".rollout").dataset;
    const index = Number(token.dataset.index);
    const weights = Object.entries(JSON.parse(rollout.weights)).map(([m, w]) => `${m} weight ${w[index]}`);
    tooltip.textContent = `token ${index}: ${JSON.stringify(token.textContent)}\\n` +
      `${weights.join("\\n")}\\nadvantage ${rollout.advantage}`;
    tooltip.style.left = `${event.clientX + 12}px`;
    tooltip.style.top = `${event.clientY + 12}px`;
    tooltip.style.display = "block";
  });
  token.addEventListener("mouseout", () => { tooltip.style.display = "none"; });
});
"""


def render_page(views: dict[str, list[ViewedRollout]], specs: dict[str, dict], unweighted: list[str], seed: int) -> str:
    """The self-contained HTML page (no external resources: it opens from results/ and from Snakemake's report)."""
    sections = []
    for label, rollouts in views.items():
        body = "".join(rollout_block(rollout) for rollout in rollouts) or "<p>No non-empty rollouts.</p>"
        sections.append(f'<section data-label="{html.escape(label)}"><h2>{html.escape(label)}</h2>{body}</section>')
    weighted = [name for name in specs if name not in unweighted]
    with_truth = any(rollout.decisive is not None for rollouts in views.values() for rollout in rollouts)
    truth = (
        ' On the decisive-step task, the <span class="token decisive">decisive tokens</span> (those that decide '
        "the reward: the queried chain and the box, from the generator) are underlined, and each method's row "
        "gives the AUROC of its weights against them: where it puts the credit (A &gt; 0) or the blame "
        "(A &lt; 0); ½ is chance."
        if with_truth
        else ""
    )
    legend = ", ".join(
        f'<span style="background-color: rgba({r}, {g}, {b}, 0.6)">{html.escape(name)}</span>'
        for name, (r, g, b) in zip(weighted, map(colour, range(len(weighted))), strict=True)
    )
    settings = html.escape(json.dumps({name: specs[name] for name in weighted}, sort_keys=True))
    others = (
        " Methods that weight no tokens (TRL's sequence advantage, or per-token advantages not of the form "
        "A<sub>i</sub> · w<sub>i,t</sub>): "
        f"{html.escape(', '.join(unweighted))}."
        if unweighted
        else ""
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Token weights</title><style>{PAGE_STYLE}</style></head>
<body>
<h1>Token weights</h1>
<p>Evaluation rollouts per run and checkpoint (correct and wrong, chosen with seed {seed}), each token coloured by
its weight under each credit method: {legend or "none of the study's methods weights tokens"}.{others} A stronger
colour is a higher weight (log scale, from the rollout's lowest to its highest weight); the
<span class="token boxed">boxed answer</span> is outlined.{truth} Hover a token for its weight under every method and the
rollout's advantage. Weights are computed on the checkpoint's model by the methods themselves, as in training,
with settings <code>{settings}</code>.</p>
{"".join(sections)}
<div id="tooltip"></div>
<script>{PAGE_SCRIPT}</script>
</body></html>
"""


# ----------------------------------------------------------------------------------------------- stage


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipeline.token_viewer", description=__doc__.splitlines()[0])
    add_checkpoint_arguments(parser, "--rollouts", "show")
    parser.add_argument("--analysis-spec", default="{}", help="token-analysis settings: prompt format, temperature")
    parser.add_argument(
        "--methods", default='{"grail": {"credit": "grail"}}', help="method name -> its credit options (JSON/YAML)"
    )
    parser.add_argument("--per-outcome", type=int, default=2, help="correct and wrong rollouts shown each")
    parser.add_argument("--seed", type=int, default=0, help="chooses the rollouts and the methods' noise")
    parser.add_argument("--out", required=True, type=Path, help="the HTML page")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.per_outcome < 1:
        raise InputError(f"--per-outcome: must be >= 1, got {args.per_outcome}")
    analysis = dataclass_from_mapping(TokenAnalysisSpec, load_spec(args.analysis_spec), "token_analysis spec")
    specs = load_spec(args.methods)
    methods, unweighted = credit_methods(specs, analysis.temperature, args.seed)
    problems = {row["id"]: row["problem"] for row in read_jsonl(args.benchmark)}
    views = {}
    for label, model_dir, samples in progress(args.rollouts, desc="token weights", unit="checkpoint"):
        rng = random.Random(f"{args.seed}/{label}")
        groups = grouped_samples(read_jsonl(samples), problems, Path(samples))
        rollouts = choose_rollouts(groups, problems, args.per_outcome, rng)
        if rollouts:
            tokenizer = load_tokenizer(model_dir)
            model = load_model(model_dir, dtype=working_dtype(model_dir)).eval()
            additive = compute_views(model, tokenizer, rollouts, groups, analysis, methods)
            unweighted += [name for name in additive if name not in unweighted]
        views[label] = rollouts
    page = render_page(views, specs, unweighted, args.seed)
    with output_space(Path(args.out), len(page.encode()), "the token viewer page"):
        atomic_write_text(args.out, page)
    print(f"{args.out}: {sum(map(len, views.values()))} rollouts from {len(views)} checkpoints")


if __name__ == "__main__":
    run_cli(main)
