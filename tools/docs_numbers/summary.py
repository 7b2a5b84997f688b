"""A recorded summary's format, and how it is read: the one place both ``record`` (which writes it) and ``render``
(which reads it) take it from.

A summary is a JSON object with the keys ``study``, ``config`` (the config file it ran), ``recorded`` (the date),
``commit``, ``reference_numbers_sha256`` (``reference_numbers_sha256`` of ``REFERENCE`` when it was recorded),
``kernel_paths``, ``cpus``, ``variables`` and ``libraries`` (what it ran on), ``reproduced_by`` (the environments of
other runs that gave the same outputs bit for bit, each with its number of ``outputs``), ``scores`` (the rows of
the study's scores.csv with an acc@k or pass@k metric at the start or final checkpoint), ``rewards`` (per run
``model/method/seedN``: the mean reward of its first and last ``quarter``), ``item_tests`` and ``seed_tests`` (the
significance rows of the ``ITEM_TESTS`` and of the seed-aware bootstrap) and ``placement`` (per model, the credit
placement's placement.json). Accuracies read from it are in points: mean over seeds (± sample sd).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.core.io import InputError, canonical_json
from pipeline.core.layout import BASELINE_METHOD, FINAL_CHECKPOINT, START_CHECKPOINT
from pipeline.core.repo import REPO_DIR
from pipeline.stats.scores import AVERAGE_BENCHMARKS

NUMBERS_DIR = REPO_DIR / "docs" / "numbers"
REFERENCE = REPO_DIR / "tests" / "reference" / "ci_study.json"
ITEM_TESTS = ("paired_bootstrap", "wilcoxon_items")


def load_studies(directory: Path = NUMBERS_DIR) -> dict[str, dict[str, Any]]:
    """Every recorded summary, by study name."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))}


def reference_numbers_sha256(reference: Path) -> str:
    """SHA-256 of the reference guard's numbers in canonical JSON: every section but the header, whose provenance
    (commit, CPU model, versions) can change while no number does."""
    numbers = {section: value for section, value in json.loads(reference.read_text()).items() if section != "header"}
    return hashlib.sha256(canonical_json(numbers).encode()).hexdigest()


def stale_summaries(studies: dict[str, dict[str, Any]], reference: Path = REFERENCE) -> list[str]:
    """The summaries recorded under other reference numbers than the current ones: the code's numbers moved since."""
    current = reference_numbers_sha256(reference)
    return [study for study, summary in studies.items() if summary["reference_numbers_sha256"] != current]


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
