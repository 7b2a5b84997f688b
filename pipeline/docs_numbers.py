"""The study numbers quoted in the README and the docs, generated from recorded runs rather than typed in.

    python -m pipeline.docs_numbers --record default results      # docs/numbers/default.json from a finished study
    python -m pipeline.docs_numbers                               # rewrite every generated block
    python -m pipeline.docs_numbers --check                       # exit 1 when a block is stale

A recorded summary (``docs/numbers/<study>.json``) keeps what a finished study's tables, significance tests,
training logs and provenance say, and what made them: the commit, the date, the kernel path and CPU of every run
and evaluation, the library versions, and the digest of the reference guard's numbers (``REFERENCE``, the CI
study's numbers; its header, which says where it was made, is left out). A test holds both ends: every generated
block equals what this module renders from the summaries, and every summary was recorded under the reference's
numbers as they are now. When a change moves the numbers, the reference is regenerated, that test fails, and the
studies are run and recorded again (docs/contributing.md, "Numbers").

Generated blocks sit between ``<!-- numbers: NAME -->`` and ``<!-- /numbers -->`` in ``PAGES``; NAME is a key of
``RENDERERS``. Accuracies are acc@k at the study's final checkpoint, mean over seeds (± sample sd), in points.

One module: a summary's format is written by ``record`` and read by every renderer, and a test holds the two ends
against each other; split, the format would live in two places.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.core.io import InputError, atomic_write_json, atomic_write_text, canonical_json, read_jsonl, run_cli
from pipeline.core.layout import (
    BASELINE_METHOD,
    CREDIT_PLACEMENT,
    FINAL_CHECKPOINT,
    SIGNIFICANCE,
    START_CHECKPOINT,
    TABLES_DIR,
)
from pipeline.core.repo import REPO_DIR
from pipeline.stats.scores import AVERAGE_BENCHMARKS
from pipeline.stats.seed_aware import SEED_BOOTSTRAP_TEST
from pipeline.study.cost import GIB, PlannedJob
from pipeline.study.load import load_study
from pipeline.study.plan import estimate

NUMBERS_DIR = REPO_DIR / "docs" / "numbers"
REFERENCE = REPO_DIR / "tests" / "reference" / "ci_study.json"
PAGES = ("README.md", "docs/lab-notes.md", "docs/credit-methods.md", "docs/fidelity.md", "docs/cluster.md")
BLOCK = re.compile(r"(<!-- numbers: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /numbers -->)", re.DOTALL)
ITEM_TESTS = ("paired_bootstrap", "wilcoxon_items")
DISPLAY = {"grpo": "GRPO", "grail": "GRAIL", "oar_g": "OAR-G", BASELINE_METHOD: "base"}


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def git_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_DIR, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def reward_quarters(metrics: list[dict[str, Any]]) -> dict[str, float]:
    """Mean logged reward over the first and the last quarter of a run's logged steps."""
    rewards = [row["reward"] for row in metrics if "reward" in row and "step" in row]
    if not rewards:
        raise InputError("a training log without reward rows")
    quarter = max(1, len(rewards) // 4)
    return {"first": sum(rewards[:quarter]) / quarter, "last": sum(rewards[-quarter:]) / quarter}


WALL_CLOCK = re.compile(r"time|runtime|per_second")


def outputs_digest(results_dir: Path) -> dict[str, str]:
    """SHA-256 of every output whose bits a kernel path could move: evaluation samples, the warm-up's and each run's
    final weights, and each run's training log without its wall-clock fields; by path under ``results_dir``."""
    digests = {}
    for path in sorted([*results_dir.glob("eval/**/*.jsonl"), *results_dir.glob("**/*.safetensors")]):
        if "checkpoints" not in path.parts and "set_aside" not in path.parts:
            digests[str(path.relative_to(results_dir))] = file_sha256(path)
    for path in sorted(results_dir.glob("runs/*/*/seed*/metrics.jsonl")):
        rows = [{k: v for k, v in row.items() if not WALL_CLOCK.search(k)} for row in read_jsonl(path)]
        digests[str(path.relative_to(results_dir))] = hashlib.sha256(json.dumps(rows).encode()).hexdigest()
    return digests


def provenance_records(results_dir: Path) -> list[dict[str, Any]]:
    """The provenance records of a finished study's training runs and evaluations."""
    paths = sorted(results_dir.glob("runs/*/*/seed*/provenance.json")) + sorted(
        results_dir.glob("eval/**/*.provenance.json")
    )
    if not paths:
        raise InputError(f"{results_dir}: no provenance files (not a finished study)")
    return [json.loads(path.read_text()) for path in paths]


def run_environment(results_dir: Path) -> dict[str, Any]:
    """What a study ran on: kernel paths, CPUs, the kernel variables in effect and the library versions."""
    records = provenance_records(results_dir)
    return {
        "kernel_paths": sorted(
            {f"{'pinned' if r['kernels']['kernel_pin'] else 'native'} {r['kernels']['capability']}" for r in records}
        ),
        "cpus": sorted({r["kernels"]["cpu_model"] for r in records}),
        "variables": records[0]["kernels"]["variables"],
        "libraries": records[0]["libraries"],
    }


def reproductions(results_dir: Path, others: list[Path]) -> list[dict[str, Any]]:
    """The environments of ``others``, each checked to hold the same outputs as ``results_dir`` bit for bit; an
    InputError names the files that differ."""
    expected = outputs_digest(results_dir)
    found = []
    for other in others:
        actual = outputs_digest(other)
        differing = sorted(path for path in expected.keys() | actual.keys() if expected.get(path) != actual.get(path))
        if differing:
            shown = ", ".join(differing[:5]) + (" ..." if len(differing) > 5 else "")
            raise InputError(f"{other}: {len(differing)} of {len(expected)} outputs differ from {results_dir}: {shown}")
        found.append(run_environment(other) | {"outputs": len(actual)})
    return found


def record(study: str, results_dir: Path, config: str, same_as: list[Path], commit: str) -> dict[str, Any]:
    """The summary of a finished study (module docstring), with the runs that reproduced it bit for bit."""
    scores = pd.read_csv(results_dir / TABLES_DIR / "scores.csv")
    wanted = scores["metric"].str.match(r"^(acc|pass)@\d+$") & scores["checkpoint"].isin(
        [FINAL_CHECKPOINT, START_CHECKPOINT]
    )
    significance = json.loads((results_dir / SIGNIFICANCE).read_text())
    runs = {
        "/".join(path.parent.parts[-3:]): reward_quarters(read_jsonl(path))
        for path in sorted(results_dir.glob("runs/*/*/seed*/metrics.jsonl"))
    }
    return {
        "study": study,
        "config": config,
        "recorded": datetime.date.today().isoformat(),
        "commit": commit,
        "reference_numbers_sha256": reference_numbers_sha256(REFERENCE),
        **run_environment(results_dir),
        "reproduced_by": reproductions(results_dir, same_as),
        "scores": scores[wanted].to_dict(orient="records"),
        "rewards": runs,
        "item_tests": [row for row in significance if row["test"] in ITEM_TESTS],
        "seed_tests": [row for row in significance if row["test"] == SEED_BOOTSTRAP_TEST],
        "placement": {
            path.parent.name: json.loads(path.read_text())
            for path in sorted(results_dir.glob(f"{CREDIT_PLACEMENT.format(model='*')}/placement.json"))
        },
    }


# --------------------------------------------------------------------------------------------- reading a summary


def accuracy_metric(summary: dict[str, Any]) -> str:
    """The study's acc@k (k = samples per item)."""
    return next(row["metric"] for row in summary["scores"] if row["metric"].startswith("acc@"))


def run_scores(summary: dict[str, Any], method: str, benchmark: str, metric: str) -> list[float]:
    """A method's per-seed scores as fractions (the baseline's at its start checkpoint), in seed order."""
    checkpoint = START_CHECKPOINT if method == BASELINE_METHOD else FINAL_CHECKPOINT
    rows = [
        row
        for row in summary["scores"]
        if (row["method"], row["benchmark"], row["metric"], row["checkpoint"])
        == (method, benchmark, metric, checkpoint)
    ]
    return [row["value"] for row in sorted(rows, key=lambda row: row["seed"])]


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample sd (ddof 1; NaN for one value) of fractions, in points: scaled after the mean, as the
    report's tables (pipeline.aggregate), so that the docs round as the report does."""
    series = pd.Series(values, dtype=float)
    return 100 * float(series.mean()), 100 * float(series.std())


def mean_sd_text(values: list[float]) -> str:
    """'mean ± sd' in points with one decimal, as the report's tables."""
    mean, sd = mean_sd(values)
    return f"{mean:.1f}" if math.isnan(sd) else f"{mean:.1f} ± {sd:.1f}"


def item_test(summary: dict[str, Any], test: str, method_a: str, method_b: str, benchmark: str) -> dict[str, Any]:
    """The item-level test row of ``method_a`` against ``method_b``, oriented so that a positive difference favours
    ``method_a`` (the report tests each unordered pair once)."""
    metric = accuracy_metric(summary)
    for row in summary["item_tests"]:
        if (row["test"], row["metric"], row["benchmark"]) != (test, metric, benchmark):
            continue
        if (row["method_a"], row["method_b"]) == (method_a, method_b):
            return row
        if (row["method_a"], row["method_b"]) == (method_b, method_a):
            flipped = {"statistic": -row["statistic"]}
            if "ci_low" in row:
                flipped |= {"ci_low": -row["ci_high"], "ci_high": -row["ci_low"]}
            return row | flipped
    raise InputError(f"{summary['study']}: no {test} row of {method_a} vs {method_b} on {benchmark} ({metric})")


def benchmarks(summary: dict[str, Any]) -> list[str]:
    """The study's benchmarks in table order, without the aggregate's averages over them."""
    names = (row["benchmark"] for row in summary["scores"] if row["benchmark"] not in AVERAGE_BENCHMARKS)
    return list(dict.fromkeys(names))


def trained_methods(summary: dict[str, Any]) -> list[str]:
    """The study's trained methods in table order (the baseline left out)."""
    return list(dict.fromkeys(row["method"] for row in summary["scores"] if row["method"] != BASELINE_METHOD))


def name(method: str) -> str:
    """A method as the docs write it (GRPO, GRAIL, OAR-G, base; any other in code style)."""
    return DISPLAY.get(method, f"`{method}`")


def p_text(p: float) -> str:
    """A p-value as the docs write it: two significant digits, scientific below 0.001."""
    return f"{p:.0e}" if p < 1e-3 else f"{p:.2g}"


def gain(summary: dict[str, Any], method: str, benchmark: str, metric: str) -> float:
    """Mean score of ``method`` minus the base's, in points."""
    return (
        mean_sd(run_scores(summary, method, benchmark, metric))[0]
        - mean_sd(run_scores(summary, BASELINE_METHOD, benchmark, metric))[0]
    )


def provenance_line(summary: dict[str, Any]) -> str:
    """Where a summary's numbers come from, for the top of each generated block."""
    return (
        f"*Generated from `docs/numbers/{summary['study']}.json`: `{summary['config']}` run at commit "
        f"{summary['commit']} ({summary['recorded']}), kernel path {', '.join(summary['kernel_paths'])}, CPU "
        f"{'; '.join(summary['cpus'])}; torch {summary['libraries'].get('torch')}, transformers "
        f"{summary['libraries'].get('transformers')}.*"
    )


# --------------------------------------------------------------------------------------------- renderers


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


# --------------------------------------------------------------------------------------------- pages


def load_studies(directory: Path = NUMBERS_DIR) -> dict[str, dict[str, Any]]:
    """Every recorded summary, by study name."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))}


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


def reference_numbers_sha256(reference: Path) -> str:
    """SHA-256 of the reference guard's numbers in canonical JSON: every section but the header, whose provenance
    (commit, CPU model, versions) can change while no number does."""
    numbers = {section: value for section, value in json.loads(reference.read_text()).items() if section != "header"}
    return hashlib.sha256(canonical_json(numbers).encode()).hexdigest()


def stale_summaries(studies: dict[str, dict[str, Any]], reference: Path = REFERENCE) -> list[str]:
    """The summaries recorded under other reference numbers than the current ones: the code's numbers moved since."""
    current = reference_numbers_sha256(reference)
    return [study for study, summary in studies.items() if summary["reference_numbers_sha256"] != current]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", nargs=2, metavar=("STUDY", "RESULTS_DIR"), help="record a finished study")
    parser.add_argument(
        "--same-as", nargs="*", type=Path, default=[], help="with --record: other runs of it, checked bit for bit"
    )
    parser.add_argument("--commit", default=None, help="with --record: the commit it ran (default: the checkout's)")
    parser.add_argument("--config", default=None, help="with --record: the config it ran (default configs/STUDY.yaml)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a generated block is stale")
    args = parser.parse_args(argv)
    if args.record:
        study, results_dir = args.record
        summary = record(
            study, Path(results_dir), args.config or f"configs/{study}.yaml", args.same_as, args.commit or git_commit()
        )
        atomic_write_json(NUMBERS_DIR / f"{study}.json", summary)
        print(f"recorded {NUMBERS_DIR / f'{study}.json'}")
    studies = load_studies()
    if args.check:
        stale = stale_pages(studies)
        if stale:
            print(f"stale numbers in {', '.join(stale)}: python -m pipeline.docs_numbers", file=sys.stderr)
            raise SystemExit(1)
        return
    for page in PAGES:
        path = REPO_DIR / page
        atomic_write_text(path, render_page(path.read_text(), studies, page))


if __name__ == "__main__":
    run_cli(main)
