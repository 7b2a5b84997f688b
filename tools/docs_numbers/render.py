"""Recorded summaries (``summary``) -> the generated blocks of the README and the docs.

Generated blocks sit between ``<!-- numbers: NAME -->`` and ``<!-- /numbers -->`` in ``PAGES``; NAME is a key of
``RENDERERS``. Accuracies are acc@k at the study's final checkpoint, mean over seeds (± sample sd), in points.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.core.io import InputError
from pipeline.core.layout import BASELINE_METHOD
from pipeline.core.repo import REPO_DIR
from pipeline.study.cost import GIB, PlannedJob
from pipeline.study.load import load_study
from pipeline.study.plan import estimate
from tools.docs_numbers.summary import (
    accuracy_metric,
    benchmarks,
    gain,
    item_test,
    mean_sd,
    mean_sd_text,
    provenance_line,
    run_scores,
    trained_methods,
)

PAGES = ("README.md", "docs/lab-notes.md", "docs/credit-methods.md", "docs/fidelity.md", "docs/cluster.md")
BLOCK = re.compile(r"(<!-- numbers: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /numbers -->)", re.DOTALL)
DISPLAY = {"grpo": "GRPO", "grail": "GRAIL", "oar_g": "OAR-G", BASELINE_METHOD: "base"}


def name(method: str) -> str:
    """A method as the docs write it (GRPO, GRAIL, OAR-G, base; any other in code style)."""
    return DISPLAY.get(method, f"`{method}`")


def p_text(p: float) -> str:
    """A p-value as the docs write it: two significant digits, scientific below 0.001."""
    return f"{p:.0e}" if p < 1e-3 else f"{p:.2g}"


def tiny_result(studies: dict[str, dict[str, Any]]) -> str:
    """The README's paragraph on the tiny study: gains over base in and out of distribution, pass@k, and what two
    seeds cannot show."""
    summary = studies["default"]
    metric = accuracy_metric(summary)
    k = metric.split("@")[1]
    inside, outside = benchmarks(summary)[:2]
    methods = trained_methods(summary)
    gains = [gain(summary, m, inside, metric) for m in methods]
    far = [gain(summary, m, outside, metric) for m in methods]
    passes = [gain(summary, m, inside, f"pass@{k}") for m in methods]
    base = run_scores(summary, BASELINE_METHOD, inside, metric)
    every_run_above = all(min(run_scores(summary, m, inside, metric)) > max(base) for m in methods)
    per_method = ", ".join(f"{name(m)} {mean_sd_text(run_scores(summary, m, inside, metric))}" for m in methods)
    return (
        f"{provenance_line(summary)}\n\n"
        f"The tiny study's own figure (`results/figures/scores_by_benchmark.png`, from a bare `snakemake --cores 2`). "
        f"{metric} on `{inside}` (400 items, mean ± sd over {len(base)} seeds): base "
        f"{mean_sd_text(base)}, {per_method}. RL learns there: every method's final model beats the warmed-up "
        f"`base` by {min(gains):.1f} to {max(gains):.1f} points of {metric} in distribution"
        f"{' in each of its runs' if every_run_above else ''} and by {min(far):+.1f} to {max(far):+.1f} out of range "
        f"(`{outside}`), while pass@{k} moves {min(passes):+.1f} to {max(passes):+.1f} (RL makes the answers "
        "consistent more than it teaches new ones). It shows nothing about GRAIL versus GRPO: with 2 (model, "
        "benchmark) pairs the paper's test cannot go below p = 0.25, with 2 runs per method the permutation test "
        "over runs cannot go below p = 1/3, and these differences lie inside the spread that the CPU's instruction "
        "set alone moved each method's runs before the kernel pin, 3-5 points "
        "([Fidelity](docs/fidelity.md#one-kernel-path), [Lab notes](docs/lab-notes.md))."
    )


def scores_against_base(studies: dict[str, dict[str, Any]], study: str) -> str:
    """Per benchmark and method: base and final acc@k, the difference with its 95 % paired-bootstrap interval over
    items, and the exact one-sided Wilcoxon p over items (method > base)."""
    summary = studies[study]
    metric = accuracy_metric(summary)
    lines = [
        provenance_line(summary),
        "",
        f"| benchmark | base {metric} | method | final {metric} | difference [95 % CI] | p |",
        "|---|---|---|---|---|---|",
    ]
    for benchmark in benchmarks(summary):
        base = mean_sd_text(run_scores(summary, BASELINE_METHOD, benchmark, metric))
        for method in trained_methods(summary):
            interval = item_test(summary, "paired_bootstrap", method, BASELINE_METHOD, benchmark)
            p = item_test(summary, "wilcoxon_items", method, BASELINE_METHOD, benchmark)["p_value"]
            lines.append(
                f"| {benchmark} | {base} | {name(method)} | "
                f"{mean_sd_text(run_scores(summary, method, benchmark, metric))} | "
                f"{100 * interval['statistic']:+.1f} [{100 * interval['ci_low']:+.1f}, {100 * interval['ci_high']:+.1f}]"
                f" points | {p_text(p)} |"
            )
    return "\n".join(lines)


def rewards_table(studies: dict[str, dict[str, Any]], study: str) -> str:
    """Per method: the mean logged training reward over the first and the last quarter of each run, seeds joined."""
    summary = studies[study]
    by_method: dict[str, list[dict[str, float]]] = {}
    for run, quarters in summary["rewards"].items():
        by_method.setdefault(run.split("/")[1], []).append(quarters)
    lines = ["| run | reward, first quarter | reward, last quarter | change |", "|---|---|---|---|"]
    for method, runs in by_method.items():
        seeds = " / ".join(str(i) for i in range(len(runs)))
        first = " / ".join(f"{run['first']:.3f}" for run in runs)
        last = " / ".join(f"{run['last']:.3f}" for run in runs)
        change = " / ".join(f"{run['last'] - run['first']:+.3f}" for run in runs)
        lines.append(f"| {name(method)} seed {seeds} | {first} | {last} | {change} |")
    return "\n".join(lines)


def scores_table(studies: dict[str, dict[str, Any]], study: str) -> str:
    """acc@k per method (base first) and benchmark, mean ± sd over seeds, and the runs' own scores."""
    summary = studies[study]
    metric = accuracy_metric(summary)
    names = benchmarks(summary)
    lines = [
        provenance_line(summary),
        "",
        "| method | " + " | ".join(f"{b} {metric}" for b in names) + " | runs (seed 0 / 1 / ...) |",
        "|---|" + "---|" * (len(names) + 1),
    ]
    for method in [BASELINE_METHOD, *trained_methods(summary)]:
        cells = [mean_sd_text(run_scores(summary, method, b, metric)) for b in names]
        runs = " / ".join(f"{100 * value:.1f}" for value in run_scores(summary, method, names[0], metric))
        lines.append(f"| {name(method)} | " + " | ".join(cells) + f" | {runs} |")
    return "\n".join(lines)


def comparisons_table(studies: dict[str, dict[str, Any]], study: str, against: tuple[str, ...]) -> str:
    """Every trained method against each of ``against`` on the first benchmark, paired over items: difference,
    95 % bootstrap interval, two-sided Wilcoxon p and its Holm-corrected value (conditional on these runs)."""
    summary = studies[study]
    benchmark = benchmarks(summary)[0]
    lines = [
        f"| comparison ({benchmark}) | difference | 95 % CI (items) | p (items) | p (items, Holm) |",
        "|---|---|---|---|---|",
    ]
    holm = []
    for reference in against:
        for method in trained_methods(summary):
            if method in against[: against.index(reference) + 1]:
                continue
            interval = item_test(summary, "paired_bootstrap", method, reference, benchmark)
            wilcoxon = item_test(summary, "wilcoxon_items", method, reference, benchmark)
            holm.append(wilcoxon["p_holm"])
            lines.append(
                f"| {method} vs {reference} | {100 * interval['statistic']:+.1f} | "
                f"[{100 * interval['ci_low']:+.1f}, {100 * interval['ci_high']:+.1f}] | {p_text(wilcoxon['p_value'])} | "
                f"{p_text(wilcoxon['p_holm'])} |"
            )
    lines += ["", f"The smallest Holm-corrected p over items in this table: {p_text(min(holm))}."]
    return "\n".join(lines)


def controls_result(studies: dict[str, dict[str, Any]]) -> str:
    """The README's paragraph on the controls: each method's acc@k and its gap to GRPO."""
    summary = studies["ablations"]
    metric = accuracy_metric(summary)
    inside = benchmarks(summary)[0]
    base = mean_sd(run_scores(summary, BASELINE_METHOD, inside, metric))[0]
    grpo = mean_sd(run_scores(summary, "grpo", inside, metric))[0]
    others = [m for m in trained_methods(summary) if m != "grpo"]
    gaps = ", ".join(
        f"{name(m)} {mean_sd(run_scores(summary, m, inside, metric))[0]:.1f} % "
        f"({mean_sd(run_scores(summary, m, inside, metric))[0] - grpo:+.1f} against GRPO)"
        for m in others
    )
    gains = [gain(summary, m, inside, metric) for m in trained_methods(summary)]
    return (
        f"{provenance_line(summary)}\n\n"
        f"{metric} on the 400 in-distribution items, mean of the runs: `base` {base:.1f} %, GRPO {grpo:.1f} %, "
        f"{gaps}. Every method gains {min(gains):.1f}-{max(gains):.1f} points over `base`. Between the trained "
        "methods nothing is resolved once training counts as random: with 2 runs per method no permutation test "
        "over runs goes below p = 1/3, and the item-level tests ([Credit methods](docs/credit-methods.md"
        "#what-the-tiny-study-shows-measured)) say only that these trained models differ."
    )


def interval_text(mean: float | None, low: float | None, high: float | None, scale: float = 1, digits: int = 2) -> str:
    """``mean [low, high]`` (``-`` when undefined), each times ``scale``."""
    if mean is None:
        return "-"
    if low is None:
        return f"{mean * scale:.{digits}f}"
    return f"{mean * scale:.{digits}f} [{low * scale:.{digits}f}, {high * scale:.{digits}f}]"


def credit_bench_result(studies: dict[str, dict[str, Any]]) -> str:
    """docs/credit-methods.md's table of the credit comparison: per method, acc@k (mean ± sd over seeds), its
    difference to GRPO with the seed-aware bootstrap interval, its gap share, and where it puts its weight
    (credit and blame AUROC, over every token and with the box left out), all with intervals."""
    summary = studies["credit_bench"]
    metric = accuracy_metric(summary)
    benchmark = benchmarks(summary)[0]
    (model, placed), *_ = summary["placement"].items()
    against_grpo = {
        (row["method_a"] if row["method_b"] == "grpo" else row["method_b"]): row
        for row in summary["seed_tests"]
        if row["metric"] == metric and row["benchmark"] == benchmark and "grpo" in (row["method_a"], row["method_b"])
    }

    def difference(method: str) -> str:
        row = against_grpo.get(method)
        if row is None:
            return "-"
        sign = 1 if row["method_a"] == method else -1
        low, high = sorted((sign * row["ci_low"], sign * row["ci_high"])) if row["ci_low"] is not None else (None,) * 2
        return interval_text(sign * row["statistic"], low, high, scale=100, digits=1)

    header = (
        f"| method | {metric} (mean ± sd) | − GRPO, points [95 %] | gap share [95 %] | credit AUROC | blame AUROC "
        "| credit, box left out | blame, box left out |"
    )
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for method in trained_methods(summary):
        share = placed["gap_share"].get(method, {})
        scores = placed["placement"].get(method)
        cells = (
            ["-"] * 4
            if scores is None
            else [
                interval_text(*(scores[key][part] for part in ("mean", "low", "high")))
                for key in ("credit", "blame", "credit_outside_answer", "blame_outside_answer")
            ]
        )
        lines.append(
            f"| {name(method)} | {mean_sd_text(run_scores(summary, method, benchmark, metric))} | "
            f"{'' if method == 'grpo' else difference(method)} | "
            f"{interval_text(share.get('share'), share.get('low'), share.get('high'))} | {' | '.join(cells)} |"
        )
    return (
        f"{provenance_line(summary)}\n\n"
        f"{metric} on `{benchmark}` ({model} model); the placements on {placed['rollouts']} rollouts of the GRPO "
        f"runs (seeds {placed['seeds']}), {placed['decisive_token_share']:.0%} of their tokens decisive.\n\n"
        + "\n".join(lines)
    )


def environment_text(environment: dict[str, Any]) -> str:
    """One run's environment as a list item: kernel variables in effect, CPU, torch and transformers."""
    variables = " ".join(f"`{k}={v}`" for k, v in sorted(environment["variables"].items())) or "none"
    libraries = environment["libraries"]
    return (
        f"- {', '.join(environment['kernel_paths'])} on {'; '.join(environment['cpus'])}, kernel variables {variables}, "
        f"torch {libraries.get('torch')}, transformers {libraries.get('transformers')}, vLLM {libraries.get('vllm')}"
    )


def kernel_pin_result(studies: dict[str, dict[str, Any]]) -> str:
    """The runs of the default study that gave the same outputs bit for bit under the pin."""
    summary = studies["default"]
    runs = [summary, *summary["reproduced_by"]]
    outputs = summary["reproduced_by"][0]["outputs"] if summary["reproduced_by"] else "all"
    return "\n".join(
        [
            provenance_line(summary),
            "",
            f"The default study under the pin gave the same outputs, bit for bit ({outputs} files: evaluation "
            "samples, warm-up and final weights, training logs without their wall-clock fields), in these "
            f"{len(runs)} runs (a variable limiting a library to AVX2 from outside is how an AVX2-only machine has "
            "them):",
            "",
            *[environment_text(run) for run in runs],
        ]
    )


def paper_disk(_studies: dict[str, dict[str, Any]]) -> str:
    """The paper study's checkpoints on disk: the preflight's own estimate (``pipeline.study.plan.estimate`` over
    its training runs), not a recorded run: no one runs the paper's study to write its docs."""
    paper = load_study([REPO_DIR / "configs" / "paper.yaml"])
    runs = [PlannedJob("train", wildcards=run) for run in paper.runs()]
    checkpoints = estimate(paper, runs, concurrent_gpus=1)["disk_bytes"]["checkpoints"]
    return (
        f"The paper's study writes up to {checkpoints / GIB:,.0f} GiB ({checkpoints / 1e12:.1f} TB) of checkpoints "
        "(the preflight's disk estimate: `pipeline.study.plan.estimate`)."
    )


RENDERERS: dict[str, Callable[[dict[str, dict[str, Any]]], str]] = {
    "tiny-result": tiny_result,
    "tiny-against-base": lambda studies: scores_against_base(studies, "default"),
    "tiny-rewards": lambda studies: rewards_table(studies, "default"),
    "ablations-scores": lambda studies: scores_table(studies, "ablations"),
    "ablations-comparisons": lambda studies: comparisons_table(studies, "ablations", ("grpo", "grail")),
    "controls-result": controls_result,
    "kernel-pin": kernel_pin_result,
    "credit-bench-result": credit_bench_result,
    "paper-disk": paper_disk,
}


def render_page(text: str, studies: dict[str, dict[str, Any]], page: str) -> str:
    """``text`` with every generated block rendered anew; an unknown block name is an InputError naming it."""

    def body(match: re.Match[str]) -> str:
        block = match.group("name")
        if block not in RENDERERS:
            raise InputError(f"{page}: unknown numbers block '{block}' (known: {', '.join(RENDERERS)})")
        return f"{match.group(1)}{RENDERERS[block](studies)}\n{match.group(4)}"

    return BLOCK.sub(body, text)


def stale_pages(studies: dict[str, dict[str, Any]], root: Path = REPO_DIR) -> list[str]:
    """The pages whose generated blocks differ from what the summaries render."""
    return [page for page in PAGES if (text := (root / page).read_text()) != render_page(text, studies, page)]
