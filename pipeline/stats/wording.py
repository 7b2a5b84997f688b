"""The words of a study's significance results: the Markdown summary of the significance stage, and the key
comparisons and the paper's test as sentences and tables that the report quotes. The numbers are
``pipeline.stats.paired_tests``'s; only their wording is here.
"""

from __future__ import annotations

from statistics import fmean
from typing import Any

from pipeline.core.layout import BASELINE_METHOD
from pipeline.stats.paired_tests import (
    BOOTSTRAP_TEST,
    CONDITIONAL_TEST,
    SCIPY_TESTS,
    key_comparisons,
    paper_test,
    seed_aware_key_comparisons,
)
from pipeline.stats.seed_aware import ALL_MODELS


def _number(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}g}"


def paper_test_sentence(row: dict[str, Any] | None) -> str:
    """One line stating the paper's test result (or why it is absent), and what it does not account for."""
    if row is None:
        return "The paper's test (exact one-sided Wilcoxon, GRAIL > GRPO) was not run: one of the two is missing."
    return (
        f"**The paper's test** (exact one-sided Wilcoxon signed-rank, GRAIL > GRPO, {row['metric']}, over "
        f"{row['n']} (model, benchmark) pairs of seed means): W+ = {row['w_plus']:g}, W- = {row['w_minus']:g}, "
        f"p = {_number(row['p_value'])}. With n = {row['n']} pairs the smallest possible p is "
        f"{_number(0.5 ** row['n'])}. It takes the pairs as independent: it does not see that a model's pairs share "
        "its training runs, nor how much another training seed would move them."
    )


def key_comparisons_table(entries: list[dict[str, Any]]) -> str:
    """Markdown table of ``key_comparisons`` (paired over items)."""
    lines = [
        "| model | benchmark | comparison | metric | items | difference | 95 % CI | p (Wilcoxon) | p (Holm) "
        "| p (bootstrap) |",
        "|" + "---|" * 10,
    ]
    lines += [
        f"| {e['model']} | {e['benchmark']} | {e['comparison']} | {e['metric']} | {e['items']} | "
        f"{e['difference']:+.4f} | [{e['ci_low']:+.4f}, {e['ci_high']:+.4f}] | {_number(e['p_wilcoxon'])} "
        f"({'one' if e['alternative'] == 'greater' else 'two'}-sided) | {_number(e['p_wilcoxon_holm'])} | "
        f"{_number(e['p_bootstrap'])} |"
        for e in entries
    ]
    return "\n".join(lines)


def _signed(value: float, digits: int = 1) -> str:
    """+x.y, with 0 as +0.0 (never -0.0)."""
    return f"{round(value, digits) + 0.0:+.{digits}f}"


def _interval(low: float | None, high: float | None, scale: float = 100, digits: int = 1) -> str:
    return "–" if low is None else f"[{_signed(scale * low, digits)}, {_signed(scale * high, digits)}]"


def seed_aware_table(entries: list[dict[str, Any]]) -> str:
    """Markdown table of ``seed_aware_key_comparisons``: seed-aware columns first, then the item-level ones
    (conditional on these trained runs); differences in points."""
    lines = [
        "| model | benchmark | comparison | metric | runs | difference (points) | 95 % CI, runs and items | "
        "P(a > b) | p (permutation over runs) | 95 % CI, items only (these runs) | p (items, Holm) |",
        "|" + "---|" * 11,
    ]
    for e in entries:
        improvement = "–" if e["improvement"] is None else f"{e['improvement']:.2f}"
        if e["improvement_low"] is not None:
            improvement += f" [{e['improvement_low']:.2f}, {e['improvement_high']:.2f}]"
        permutation = "–"
        if e["p_permutation"] is not None:
            permutation = f"{_number(e['p_permutation'])} (min {_number(e['min_p'])})"
        lines.append(
            f"| {e['model']} | {e['benchmark']} | {e['comparison']} | {e['metric']} | {e['runs']} | "
            f"{_signed(100 * e['difference'])} | {_interval(e['ci_low'], e['ci_high'])} | {improvement} | "
            f"{permutation} | {_interval(e['items_ci_low'], e['items_ci_high'])} | {_number(e['p_items_holm'])} |"
        )
    return "\n".join(lines)


def seed_aware_sentence(entries: list[dict[str, Any]]) -> str | None:
    """The study-wide GRAIL-vs-GRPO result with training runs as random, in one paragraph (None without it)."""
    study = next((e for e in entries if e["comparison"] == "grail vs grpo" and e["model"] == ALL_MODELS), None)
    if study is None:
        return None
    text = (
        f"**GRAIL vs GRPO, with training as random** ({study['metric']}, average over {study['items']} "
        f"(model, benchmark) cells, {study['runs']} runs per model): {_signed(100 * study['difference'])} points"
    )
    if study["ci_low"] is None:
        text += (
            "; with one run of a method in some model the runs cannot be resampled, so there is no interval that "
            "counts the training seed: between-seed variance cannot be estimated, and the item-level intervals "
            "below only say how these particular runs compare"
        )
    else:
        text += (
            f", 95 % interval {_interval(study['ci_low'], study['ci_high'])} (stratified bootstrap over runs and "
            f"items), P(GRAIL > GRPO) = {study['improvement']:.2f} "
            f"{_interval(study['improvement_low'], study['improvement_high'], scale=1, digits=2)}"
        )
    if study["p_permutation"] is not None:
        text += (
            f"; permutation test over runs within models: p = {_number(study['p_permutation'])} "
            f"({study['arrangements']} labellings, smallest possible p {_number(study['min_p'])})"
        )
    return text + "."


def key_sections(rows: list[dict[str, Any]], heading: str) -> list[str]:
    """The answers to "did RL help, and did GRAIL beat GRPO": the seed-aware comparisons between trained
    methods, then each method against base over items; ``heading`` prefixes the two sub-headings."""
    parts = []
    trained = seed_aware_key_comparisons(rows)
    if trained:
        sentence = seed_aware_sentence(trained)
        parts += [
            f"{heading} Between trained methods: training runs and items resampled",
            *([sentence] if sentence else []),
            "Difference = mean over runs and items of acc_a - acc_b, in points. The 95 % interval and P(a > b) "
            "come from a stratified bootstrap that redraws the runs (training seeds) of each model and method and "
            "the items of each benchmark (rliable's definitions, docs/output.md); the permutation test relabels "
            "the runs (exact; with fewer than 3 runs of each method per cell only the study row has one). The "
            "last two columns resample the items only: they are conditional on these trained runs and say "
            "nothing about another training seed. With 2 runs per method the interval is too narrow (its "
            "simulated coverage is in docs/output.md); `–`: not estimable from this design.",
            seed_aware_table(trained),
        ]
    against_base = [e for e in key_comparisons(rows) if e["comparison"].endswith(f"vs {BASELINE_METHOD}")]
    if against_base:
        parts += [
            f"{heading} Against base: paired over items",
            "Per item, acc = mean correctness over samples and seeds; difference = mean over items of acc_a - acc_b"
            " (base: the warmed-up model before RL, which has no training seed). Wilcoxon: exact signed-rank test "
            "over items, one-sided (method > base), zero differences dropped, ties kept; Holm within its family; "
            "95 % paired-bootstrap interval of the difference.",
            key_comparisons_table(against_base),
        ]
    return parts


def markdown_report(rows: list[dict[str, Any]], checkpoint: str) -> str:
    """The paper's test and the key comparisons first, then the full grid: Wilcoxon rows per metric, item rows."""
    lines = [f"# Significance (checkpoint `{checkpoint}`)", "", paper_test_sentence(paper_test(rows)), ""]
    sections = key_sections(rows, "###")
    if sections:
        lines += ["## Did RL help, and did GRAIL beat GRPO", ""]
        lines += [line for part in sections for line in (part, "")]
    lines += [
        "## Full grid: Wilcoxon over (model, benchmark) pairs",
        "",
        "Wilcoxon signed-rank tests over (model, benchmark) pairs of seed-averaged scores, d = method_a - method_b.",
        "W+ is the rank sum of pairs where method_a is better; r = (W+ - W-)/(W+ + W-) (rank-biserial).",
        "`wilcox` drops zero differences; `zsplit` splits their ranks between W+ and W-. `exact` is scipy's",
        "exact test (untied null distribution), `approx` the normal approximation without continuity correction,",
        "`exact_conditional` the exact permutation test given the tied ranks. Holm adjusts within each",
        "(test, alternative, zero handling) family across method pairs and metrics.",
        "",
    ]
    wilcoxon = [row for row in rows if row["test"] in (*SCIPY_TESTS, CONDITIONAL_TEST)]
    header = "| method_a | method_b | test | zeros | alternative | n | W+ | W- | r | p | p (Holm) |"
    for metric in dict.fromkeys(row["metric"] for row in wilcoxon):
        lines += [f"### {metric}", "", header, "|" + "---|" * 11]
        for row in (r for r in wilcoxon if r["metric"] == metric):
            lines.append(
                f"| {row['method_a']} | {row['method_b']} | {row['test'].removeprefix('wilcoxon_')} | "
                f"{row['zero_method']} | {row['alternative']} | {row['n']} | {row['w_plus']:g} | "
                f"{row['w_minus']:g} | {_number(row['rank_biserial'])} | {_number(row['p_value'])} | "
                f"{_number(row['p_holm'])} |"
            )
        lines.append("")
    bootstrap = [row for row in rows if row["test"] == BOOTSTRAP_TEST]
    if bootstrap:
        first = bootstrap[0]
        lines += [
            "## Full grid: paired bootstrap over items",
            "",
            f"Mean per-item accuracy difference (method_a - method_b), {100 * first['confidence']:g} % percentile "
            f"interval from {first['resamples']} resamples (seed {first['seed']}); Holm across all rows below.",
            "",
            "| model | benchmark | method_a | method_b | metric | items | difference | CI | p | p (Holm) |",
            "|" + "---|" * 10,
        ]
        lines += [
            f"| {r['model']} | {r['benchmark']} | {r['method_a']} | {r['method_b']} | {r['metric']} | {r['n']} | "
            f"{r['statistic']:+.4f} | [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] | {_number(r['p_value'])} | "
            f"{_number(r['p_holm'])} |"
            for r in bootstrap
        ]
    return "\n".join(lines) + "\n"


PLACEMENT_NOTE = (
    "Where each method puts its weight on the decisive-step task, against the generator's truth: per rollout with a "
    "non-zero advantage, the AUROC of its token weights against the decisive tokens (the queried chain and the box), "
    "averaged separately for credit (A > 0) and blame (A < 0); ½ is chance, 1 every decisive token above every "
    'other. "Box left out" scores the tokens outside the answer\'s box alone (the queried chain against the filler '
    "chains): whether a method finds the decisive step of the reasoning, apart from the answer that GRAIL's answer "
    "override (and grail_shuffled's) weights on its own. All methods are scored on the same rollouts, with the "
    "seeds-then-rollouts bootstrap interval. The gap "
    "share is (method - floor) / (ceiling - floor) on the runs' mean accuracies, with a stratified bootstrap over runs."
)


def _scored(score: dict[str, Any]) -> str:
    """``mean [low, high]`` of a placement or gap-share entry (``-`` when undefined)."""
    mean = score.get("mean", score.get("share"))
    if mean is None:
        return "-"
    return f"{mean:.3f}" if score["low"] is None else f"{mean:.3f} [{score['low']:.3f}, {score['high']:.3f}]"


def placement_markdown(result: dict[str, Any]) -> list[str]:
    """pipeline.credit_placement's placement.json as a sentence and two tables: each weighting method's credit
    and blame AUROC, and each method's accuracy and gap share."""
    level = f"{result['confidence']:.0%}"
    share = result["decisive_token_share"]
    lines = [
        f"| method | credit AUROC [{level}] | blame AUROC [{level}] | credit, box left out | blame, box left out "
        "| rollouts (credit / blame) |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {name} | {_scored(scores['credit'])} | {_scored(scores['blame'])} | "
        f"{_scored(scores['credit_outside_answer'])} | {_scored(scores['blame_outside_answer'])} | "
        f"{scores['credit']['rollouts']} / {scores['blame']['rollouts']} |"
        for name, scores in result["placement"].items()
    ]
    parts = [
        f"{result['rollouts']} rollouts of seeds {result['seeds']}"
        + ("" if share is None else f"; {share:.0%} of their tokens are decisive")
        + ".",
        "\n".join(lines),
    ]
    if not result["gap_share"]:
        parts.append(
            f"No gap share: {result['ceiling']} does not beat {result['floor']}, or one of them is not in the study."
        )
        return parts
    shares = [f"| method | accuracy (mean over runs) | gap share [{level}] |", "|---|---|---|"]
    shares += [
        f"| {name} | {fmean(result['accuracy'][name].values()):.3f} | {_scored(entry)} |"
        for name, entry in result["gap_share"].items()
    ]
    parts.append("\n".join(shares))
    return parts
