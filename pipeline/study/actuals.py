"""A finished study's actual wall time per job against the calibration's prediction (the report's cost section).

The actuals are the ``s`` column of Snakemake's benchmark files (``read_actuals``), matched to jobs by their
wildcard values (``labels_match``), not by a fixed layout; the predictions are ``pipeline.study.calibration``'s.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.io import InputError
from pipeline.study.calibration import (
    CALIBRATED_RULES,
    NOT_MEASURED,
    ZERO,
    Range,
    calibration_source,
    load_calibration,
    predict_job,
)
from pipeline.study.config import Study


@dataclass(frozen=True)
class Actual:
    """One finished job's wall seconds from Snakemake's benchmark file ``<benchmarks>/<rule>/<labels...>.tsv`` (a
    rule without wildcards: ``<benchmarks>/<rule>.tsv``; every evaluate rule writes under ``evaluate/``)."""

    rule: str
    labels: tuple[str, ...]
    seconds: float
    # ``cpu_time``: below ``seconds`` x the job's threads when the machine was shared (Snakemake samples it while the
    # job runs, so a job of seconds shows less than it used)
    cpu_seconds: float = 0.0


def read_actuals(benchmarks_dir: Path) -> list[Actual]:
    """Every benchmark file under ``benchmarks_dir`` (its last row's ``s``: a repeated benchmark keeps the last);
    InputError naming a file without an ``s`` column."""
    actuals = []
    for path in sorted(benchmarks_dir.glob("**/*.tsv")):
        parts = path.relative_to(benchmarks_dir).with_suffix("").parts
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle, delimiter="\t"))
        if not rows or "s" not in rows[-1]:
            raise InputError(f"{path}: not a Snakemake benchmark file (no 's' column)")
        cpu = rows[-1].get("cpu_time") or "0"
        actuals.append(Actual(parts[0], parts[1:], float(rows[-1]["s"]), float(cpu) if cpu != "NA" else 0.0))
    return actuals


def labels_match(labels: Sequence[str], wildcards: Mapping[str, str]) -> bool:
    """Whether a benchmark file's path components below its rule are a job's wildcards: one component per wildcard,
    each its value or its name then its value (``seed0``), in any order."""
    if len(labels) != len(wildcards):
        return False
    remaining = list(labels)
    for name, value in wildcards.items():
        for form in (str(value), f"{name}{value}"):
            if form in remaining:
                remaining.remove(form)
                break
        else:
            return False
    return True


@dataclass(frozen=True)
class RuleComparison:
    """One rule of a finished study: its jobs with a benchmark file, their actual hours, and (over the jobs the
    calibration measured) the predicted hours and the actual hours of those same jobs."""

    rule: str
    jobs: int
    actual_hours: float
    measured_jobs: int
    predicted_hours: Range | None
    actual_measured_hours: float
    cpu_measured_hours: float  # the CPU time of those jobs (Snakemake's cpu_time)
    unplanned: int  # benchmark files of no job of the plan, left out

    @property
    def ratio(self) -> float | None:
        """actual / expected over the measured jobs."""
        if self.predicted_hours is None or self.predicted_hours.expected <= 0:
            return None
        return self.actual_measured_hours / self.predicted_hours.expected


def benchmarked_jobs(study: Study, directory: str) -> list[tuple[str, dict[str, str], tuple[str, ...]]]:
    """The study's calibrated jobs whose benchmark files lie under ``<benchmarks>/<directory>/``, as (rule, wildcard
    values, benchmarks): the runs under ``train``; under ``evaluate``, every evaluate rule's jobs (their files share
    it), whichever ``evaluation.job_per`` made them (``Study.evaluation_jobs``)."""
    if directory == "train":
        return [("train", {key: str(value) for key, value in run.items()}, ()) for run in study.runs()]
    if directory == "evaluate":
        return [
            (rule, {key: str(value) for key, value in wildcards.items()}, benchmarks)
            for rule, wildcards, benchmarks in study.evaluation_jobs()
        ]
    return []


def compare(
    study: Study, calibration: Mapping[str, Any] | None, actuals: list[Actual], items: Mapping[str, int | None]
) -> list[RuleComparison]:
    """Per rule with benchmark files: actual hours, and for the calibrated rules the prediction of every job whose
    file matches it (``labels_match``) beside the actual hours of those jobs. A calibrated rule's file that matches no
    job of the plan (left by an earlier plan, e.g. before ``evaluation.job_per`` changed) is counted apart."""
    comparisons = []
    for rule in sorted({actual.rule for actual in actuals}):
        jobs = benchmarked_jobs(study, rule)
        found, unplanned = [], 0
        predicted, actual_measured, cpu_measured, measured = ZERO, 0.0, 0.0, 0
        for actual in (actual for actual in actuals if actual.rule == rule):
            job = next((job for job in jobs if labels_match(actual.labels, job[1])), None)
            if jobs and job is None:
                unplanned += 1
                continue
            found.append(actual)
            seconds = None if job is None else predict_job(study, calibration, *job, items)
            if seconds is not None:
                predicted += seconds.scaled(1 / 3600)
                actual_measured += actual.seconds / 3600
                cpu_measured += actual.cpu_seconds / 3600
                measured += 1
        comparisons.append(
            RuleComparison(
                rule=rule,
                jobs=len(found),
                actual_hours=sum(actual.seconds for actual in found) / 3600,
                measured_jobs=measured,
                predicted_hours=predicted if measured else None,
                actual_measured_hours=actual_measured,
                cpu_measured_hours=cpu_measured,
                unplanned=unplanned,
            )
        )
    return comparisons


def comparison_rows(
    study: Study, calibration_path: Path | None, benchmarks_dir: Path, items: Mapping[str, int | None]
) -> tuple[str, list[dict[str, str | int]]]:
    """Where the prediction comes from (``calibration_source``, or not measured without a calibration file), and the
    report's rows of ``compare``: per rule its jobs, actual hours, predicted hours (low-high) and actual hours of the
    jobs predicted, their ratio, and how many jobs were predicted (or "not measured", "not calibrated")."""
    calibration = load_calibration(calibration_path) if calibration_path else None
    source = (
        calibration_source(calibration, calibration_path)
        if calibration_path
        else f"{NOT_MEASURED}: no calibration (python -m pipeline.calibrate --configfile CONFIG)"
    )
    actuals = read_actuals(benchmarks_dir) if benchmarks_dir.is_dir() else []
    rows: list[dict[str, str | int]] = []
    for row in compare(study, calibration, actuals, items):
        predicted = row.predicted_hours
        status = f"{row.measured_jobs} of {row.jobs} jobs" if predicted else NOT_MEASURED
        if row.unplanned:
            status += f" ({row.unplanned} files of no planned job left out)"
        rows.append(
            {
                "rule": row.rule,
                "jobs": row.jobs,
                "actual h": f"{row.actual_hours:.3f}",
                "predicted h (low-high)": "–"
                if predicted is None
                else f"{predicted.expected:.3f} ({predicted.low:.3f}-{predicted.high:.3f})",
                "actual h of those jobs": f"{row.actual_measured_hours:.3f}" if predicted else "–",
                "their CPU h": f"{row.cpu_measured_hours:.3f}" if predicted else "–",
                "actual / predicted": "–" if row.ratio is None else f"{row.ratio:.2f}",
                "prediction": status if row.rule in CALIBRATED_RULES else "not calibrated",
            }
        )
    return source, rows
