"""Stage `token_viewer`: an HTML page that shows where GRAIL (and OAR-G) put their weight, token by token.

    python -m pipeline.token_viewer --rollouts LABEL MODEL_DIR SAMPLES_JSONL [--rollouts ...]
        --benchmark eval_data/NAME.jsonl [--analysis-spec TA_SPEC] [--credit-spec CREDIT_SPEC]
        [--per-outcome 2] [--seed 0] --out results/token_weights.html

For each ``--rollouts`` (a run's checkpoint and its evaluation samples), ``--per-outcome`` correct and as many wrong
rollouts are chosen reproducibly from ``--seed`` (preferring rollouts whose group has mixed outcomes, i.e. a
non-zero advantage). Their weights are computed with the training core's own functions on that checkpoint's
model: ``find_boxed_spans``, ``saliency_scores`` and ``grail_weights`` (GRAIL), ``oar_g_weights`` (OAR-G), with
the trainer's options (CREDIT_SPEC: ``grail_*`` / ``oar_g_*`` / ``answer_span`` fields of ``GrailGRPOConfig``,
its defaults for the rest) and the prompt the rollouts were sampled from (TA_SPEC: the token analysis's prompt
format and saliency temperature). The advantage is GRPO's centred group reward ``A_i = r_i - mean_j r_j`` over the
item's evaluation samples (rewards unscaled, as upstream's ``dr_grpo`` settings).

Each token is coloured by its weight: the colour's opacity grows with the logarithm of the weight, from the
rollout's smallest weight (faint) to its largest (full), so a higher weight is always a stronger colour. The
boxed answer is outlined; hovering a token shows its weight under both methods, its saliency and the advantage.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import json
import math
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.config import CREDIT_PREFIXES
from pipeline.credit import answer_mask_from_spans, find_boxed_spans, grail_weights, oar_g_weights, saliency_scores
from pipeline.io import InputError, atomic_write_text, load_spec, read_jsonl, run_cli
from pipeline.loading import load_model, load_tokenizer
from pipeline.progress import progress
from pipeline.specs import dataclass_from_mapping
from pipeline.token_analysis import Rollout, TokenAnalysisSpec, add_checkpoint_arguments, collate, prompt_ids

GRAIL_OPTIONS = ("mean", "std", "w_min", "w_max", "symmetry")  # grail_weights' keywords = grail_<name> fields
OAR_G_OPTIONS = ("tau", "beta", "eps", "noise_std")  # oar_g_weights' keywords = oar_g_<name> fields
METHOD_COLOURS = {"GRAIL": (214, 39, 40), "OAR-G": (31, 119, 180)}
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
    grail: list[float] = dataclasses.field(default_factory=list)
    oar_g: list[float] = dataclasses.field(default_factory=list)
    saliency: list[float] = dataclasses.field(default_factory=list)
    boxed: tuple[int, int] | None = None  # [start, end) of the boxed answer in tokens


# ----------------------------------------------------------------------------------------------- settings


def credit_settings(credit_spec: Any) -> dict[str, Any]:
    """GrailGRPOConfig's credit options (``grail_*``, ``oar_g_*``, ``answer_span``) with CREDIT_SPEC's values;
    the defaults are read from the trainer's config class, so they are declared only there."""
    from pipeline.grpo_config import GrailGRPOConfig

    defaults = {
        field.name: field.default
        for field in dataclasses.fields(GrailGRPOConfig)
        if field.name.startswith(tuple(CREDIT_PREFIXES.values())) or field.name == "answer_span"
    }
    if not isinstance(credit_spec, dict):
        raise InputError(f"credit spec: expected a mapping of GrailGRPOConfig credit options, got {credit_spec!r}")
    unknown = sorted(set(credit_spec) - set(defaults))
    if unknown:
        raise InputError(f"credit spec: unknown key(s) {unknown} (allowed: {sorted(defaults)})")
    return {**defaults, **credit_spec}


# ----------------------------------------------------------------------------------------------- choice


def group_advantages(rewards: list[float]) -> list[float]:
    """GRPO's centred group reward ``A_i = r_i - mean_j r_j`` (no scaling)."""
    mean = sum(rewards) / len(rewards)
    return [reward - mean for reward in rewards]


def choose_rollouts(
    samples: list[dict[str, Any]], problems: dict[str, str], per_outcome: int, rng: random.Random, where: Path
) -> list[ViewedRollout]:
    """``per_outcome`` correct and ``per_outcome`` wrong non-empty rollouts, those with a non-zero advantage first,
    each group drawn by ``rng``; fewer when the samples hold fewer."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for number, sample in enumerate(samples, start=1):
        if sample.get("id") not in problems:
            raise InputError(f"{where}:{number}: id {sample.get('id')!r} is not in the benchmark")
        groups[sample["id"]].append(sample)
    candidates = []
    for item, group in groups.items():
        advantages = group_advantages([float(sample["correct"]) for sample in group])
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


def options(credit: dict[str, Any], prefix: str, names: tuple[str, ...]) -> dict[str, Any]:
    """The keyword arguments of a credit function from the config fields ``prefix + name``."""
    return {name: credit[prefix + name] for name in names}


def compute_views(
    model: Any,
    tokenizer: Any,
    rollouts: list[ViewedRollout],
    analysis: TokenAnalysisSpec,
    credit: dict[str, Any],
    seed: int,
) -> None:
    """Fill in the tokens, GRAIL and OAR-G weights, saliency and boxed span of ``rollouts`` (one batch)."""
    batch = [
        Rollout(
            prompt_ids(tokenizer, rollout.problem, analysis),
            tokenizer(rollout.completion, add_special_tokens=False)["input_ids"],
            rollout.correct,
        )
        for rollout in rollouts
    ]
    input_ids, attention, completion_ids, completion_mask = collate(batch, tokenizer.pad_token_id)
    spans = find_boxed_spans(tokenizer, completion_ids, completion_mask, which=credit["answer_span"])
    answer_mask = answer_mask_from_spans(spans, completion_ids.shape[1])
    scores = saliency_scores(
        model,
        input_ids,
        attention,
        answer_mask,
        leaf=credit["grail_leaf"],
        temperature=analysis.temperature,
        position=credit["grail_position"],
    )
    advantages = torch.tensor([rollout.advantage for rollout in rollouts])
    grail = grail_weights(scores, completion_mask, advantages, spans, **options(credit, "grail_", GRAIL_OPTIONS))
    with torch.enable_grad():
        noise = torch.Generator().manual_seed(seed)
        oar_g = oar_g_weights(
            model,
            input_ids,
            attention,
            completion_mask,
            answer_mask,
            generator=noise,
            **options(credit, "oar_g_", OAR_G_OPTIONS),
        )
    for row, (rollout, sampled) in enumerate(zip(rollouts, batch, strict=True)):
        length = len(sampled.completion_ids)
        rollout.tokens = token_texts(tokenizer, sampled.completion_ids)
        rollout.grail = grail[row, :length].tolist()
        rollout.oar_g = oar_g[row, :length].tolist()
        rollout.saliency = scores[row, :length].tolist()
        start, _, end = (int(value) for value in spans[row])
        rollout.boxed = (start, end) if start >= 0 else None


# ----------------------------------------------------------------------------------------------- page


def opacity(weight: float, lowest: float, highest: float) -> float:
    """Colour opacity of ``weight`` among weights in [lowest, highest]: increasing in the weight, on a log scale
    (GRAIL's weights span 0.5 to 5), from MIN_OPACITY to 1; all equal weights get the middle value."""
    floor = 1e-6  # weights are positive on valid tokens; guard the logarithm all the same
    low, high, value = (math.log(max(w, floor)) for w in (lowest, highest, weight))
    if high - low < 1e-12:
        return 0.5
    return round(MIN_OPACITY + (1 - MIN_OPACITY) * (value - low) / (high - low), 4)


def token_span(rollout: ViewedRollout, index: int, method: str, weights: list[float]) -> str:
    red, green, blue = METHOD_COLOURS[method]
    alpha = opacity(weights[index], min(weights), max(weights))
    boxed = rollout.boxed is not None and rollout.boxed[0] <= index < rollout.boxed[1]
    attributes = {
        "class": "token boxed" if boxed else "token",
        "data-index": str(index),
        "data-weight": f"{weights[index]:.6g}",
        "data-grail": f"{rollout.grail[index]:.6g}",
        "data-oar-g": f"{rollout.oar_g[index]:.6g}",
        "data-saliency": f"{rollout.saliency[index]:.6g}",
        "data-advantage": f"{rollout.advantage:+.6g}",
        "style": f"background-color: rgba({red}, {green}, {blue}, {alpha})",
    }
    rendered = " ".join(f'{name}="{html.escape(value)}"' for name, value in attributes.items())
    return f"<span {rendered}>{html.escape(rollout.tokens[index])}</span>"


def rollout_block(rollout: ViewedRollout) -> str:
    outcome = "correct" if rollout.correct else "wrong"
    lines = []
    for method, weights in (("GRAIL", rollout.grail), ("OAR-G", rollout.oar_g)):
        tokens = "".join(token_span(rollout, index, method, weights) for index in range(len(rollout.tokens)))
        lines.append(
            f'<div class="weights" data-method="{method}"><span class="method">{method}</span>'
            f'<span class="completion">{tokens}</span></div>'
        )
    return (
        f'<div class="rollout {outcome}" data-id="{html.escape(rollout.id)}" data-sample="{rollout.sample}" '
        f'data-correct="{str(rollout.correct).lower()}">'
        f'<p class="meta"><b>{html.escape(rollout.id)}</b> sample {rollout.sample} · <b>{outcome}</b> · '
        f"advantage {rollout.advantage:+.3f}"
        + ("" if rollout.boxed else " · no complete \\boxed{} (GRAIL and OAR-G leave the weights at 1)")
        + f'</p><p class="problem">{html.escape(rollout.problem)}</p>'
        + "".join(lines)
        + "</div>"
    )


PAGE_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; max-width: 75em; color: #222; }
.rollout { border-top: 1px solid #ccc; padding: 0.6em 0; }
.problem { color: #555; font-size: 0.9em; white-space: pre-wrap; }
.weights { display: flex; gap: 0.8em; margin: 0.3em 0; }
.method { flex: 0 0 4em; font-weight: bold; font-size: 0.85em; }
.completion { font-family: ui-monospace, monospace; white-space: pre-wrap; line-height: 1.7; }
.token { cursor: default; }
.token.boxed { outline: 2px solid #2a2; outline-offset: -1px; }
#tooltip { position: fixed; display: none; background: #222; color: #fff; padding: 0.4em 0.6em;
           border-radius: 4px; font-size: 0.85em; pointer-events: none; white-space: pre; z-index: 10; }
"""

PAGE_SCRIPT = """
const tooltip = document.getElementById("tooltip");
document.querySelectorAll(".token").forEach((token) => {
  token.addEventListener("mouseover", (event) => {
    const d = token.dataset;
    tooltip.textContent = `token ${d.index}: ${JSON.stringify(token.textContent)}\\n` +
      `GRAIL weight ${d.grail}\\nOAR-G weight ${d.oarG}\\nsaliency ${d.saliency}\\nadvantage ${d.advantage}`;
    tooltip.style.left = `${event.clientX + 12}px`;
    tooltip.style.top = `${event.clientY + 12}px`;
    tooltip.style.display = "block";
  });
  token.addEventListener("mouseout", () => { tooltip.style.display = "none"; });
});
"""


def render_page(views: dict[str, list[ViewedRollout]], credit: dict[str, Any], seed: int) -> str:
    """The self-contained HTML page (no external resources: it opens from results/ and from Snakemake's report)."""
    sections = []
    for label, rollouts in views.items():
        body = "".join(rollout_block(rollout) for rollout in rollouts) or "<p>No non-empty rollouts.</p>"
        sections.append(f'<section data-label="{html.escape(label)}"><h2>{html.escape(label)}</h2>{body}</section>')
    settings = html.escape(json.dumps(credit, sort_keys=True))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Token weights</title><style>{PAGE_STYLE}</style></head>
<body>
<h1>Token weights</h1>
<p>Evaluation rollouts per run and checkpoint (correct and wrong, chosen with seed {seed}), each token coloured by
its weight: <span style="background-color: rgba(214, 39, 40, 0.6)">GRAIL</span> and
<span style="background-color: rgba(31, 119, 180, 0.6)">OAR-G</span>. A stronger colour is a higher weight (log
scale, from the rollout's lowest to its highest weight); the <span class="token boxed">boxed answer</span> is
outlined. Hover a token for its weights, its GRAIL saliency and the rollout's advantage. Weights are computed on
the checkpoint's model by the trainer's own functions with settings <code>{settings}</code>.</p>
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
    parser.add_argument("--credit-spec", default="{}", help="GrailGRPOConfig credit options (grail_*, oar_g_*)")
    parser.add_argument("--per-outcome", type=int, default=2, help="correct and wrong rollouts shown each")
    parser.add_argument("--seed", type=int, default=0, help="chooses the rollouts and OAR-G's noise")
    parser.add_argument("--out", required=True, type=Path, help="the HTML page")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.per_outcome < 1:
        raise InputError(f"--per-outcome: must be >= 1, got {args.per_outcome}")
    analysis = dataclass_from_mapping(TokenAnalysisSpec, load_spec(args.analysis_spec), "token_analysis spec")
    credit = credit_settings(load_spec(args.credit_spec))
    problems = {row["id"]: row["problem"] for row in read_jsonl(args.benchmark)}
    views = {}
    for label, model_dir, samples in progress(args.rollouts, desc="token weights", unit="checkpoint"):
        rng = random.Random(f"{args.seed}/{label}")
        rollouts = choose_rollouts(read_jsonl(samples), problems, args.per_outcome, rng, Path(samples))
        if rollouts:
            tokenizer = load_tokenizer(model_dir)
            model = load_model(model_dir, dtype=torch.float32).eval()
            compute_views(model, tokenizer, rollouts, analysis, credit, args.seed)
        views[label] = rollouts
    atomic_write_text(args.out, render_page(views, credit, args.seed))
    print(f"{args.out}: {sum(map(len, views.values()))} rollouts from {len(views)} checkpoints")


if __name__ == "__main__":
    run_cli(main)
