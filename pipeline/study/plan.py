"""The plan of a study: the jobs a dry run of the Snakefile plans, the items each benchmark will have, and what the
study will cost (GPU-hours, wall time, disk) before it runs. The preflight prints it; the planner
(``pipeline.power``) prices its alternatives with it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pipeline.core.io import InputError
from pipeline.core.repo import REPO_DIR
from pipeline.study import calibration as calibrated
from pipeline.study import cost
from pipeline.study.config import Study
from pipeline.study.gpu_sizing import sizing_summary


def planned_job(record: dict[str, Any]) -> cost.PlannedJob:
    """One job of ``pipeline.study.dry_run``'s records; a resource not known before the run (None) counts as unset."""
    resources = record["resources"]

    def number(name: str, default: int) -> int:
        value = resources.get(name)
        return int(value) if isinstance(value, int | float) else default

    return cost.PlannedJob(
        rule=record["rule"],
        wildcards=record["wildcards"],
        threads=int(record["threads"]),
        gpus=number("gpu", 0),
        runtime=number("runtime", 0),
        mem_mb=number("mem_mb", 0),
        nodes=number("nodes", 1),
        gpu_model=resources.get("gpu_model") or None,
        partition=resources.get("slurm_partition") or None,
        benchmarks=tuple(evaluated_benchmarks(record["rule"], record["output"])),
        resources=resources,
    )


def evaluated_benchmarks(rule: str, outputs: list[str]) -> list[str]:
    """The benchmarks an evaluate job samples: the names of its samples files (``<benchmark>.jsonl``)."""
    if rule not in cost.EVALUATE_RULES:
        return []
    return [Path(output).stem for output in outputs if output.endswith(".jsonl")]


def plan(
    profile: Path | None, configfile: Path, extra: list[str], placed: dict[str, Path] | None = None
) -> list[cost.PlannedJob]:
    """Every job of the study with the profile applied, if any (a dry run in an empty directory, read from
    Snakemake's own job records: ``pipeline.study.dry_run``); rule ``all`` left out. ``placed``: files copied into
    that directory first (its relative path -> the file), e.g. the study's calibration, which sets the training
    jobs' warning (``calibration.warning_lead``)."""
    with tempfile.TemporaryDirectory(prefix="grail-preflight-") as empty:
        records = Path(empty) / "jobs.json"
        for relative, source in (placed or {}).items():
            (Path(empty) / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, Path(empty) / relative)
        command = [sys.executable, "-m", "pipeline.study.dry_run", str(records), "-n"]
        command += ["--configfile", str(configfile.resolve())]
        command += ["--profile", str(profile.resolve())] if profile else []
        command += ["--snakefile", str(REPO_DIR / "Snakefile"), "--directory", empty, *extra]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO_DIR)
        if result.returncode != 0 or not records.exists():
            raise InputError(f"the dry run of {configfile} failed:\n{(result.stdout + result.stderr)[-3000:]}")
        jobs = [planned_job(record) for record in json.loads(records.read_text())]
    return [job for job in jobs if job.rule != "all"]


def expected_cost(
    study: Study,
    jobs: list[cost.PlannedJob],
    calibration: dict[str, Any] | None,
    items: dict[str, int | None],
) -> dict[str, Any]:
    """The calibrated rules' expected figures (``pipeline.study.calibration``): per rule its status, job-hours and
    GPU-hours (low, expected, high) and proposed time limits; the training jobs' time windows at the configured
    limits and at the proposed ones; the expected GPU-hours of the measured jobs."""
    predicted = [
        (
            job.rule,
            job.wildcards,
            job.gpus * job.nodes,
            calibrated.predict_job(study, calibration, job.rule, job.wildcards, job.benchmarks, items),
        )
        for job in jobs
    ]
    rules = calibrated.summarize(predicted, study.calibration.time_limit_margin)
    windows = [
        calibrated.windows_needed(
            seconds.high,
            job.runtime,
            calibrated.training_warning_lead(study, calibration, job.wildcards)
            or calibrated.warning_lead_s(study.resources("train", job.wildcards["model"]).slurm_extra),
        )
        for job, (_, _, _, seconds) in zip(jobs, predicted, strict=True)
        if job.rule == "train" and seconds is not None and job.runtime
    ]
    return {
        "rules": {rule: row.record() for rule, row in rules.items()},
        "gpu_hours": vars(sum((row.gpu_hours for row in rules.values()), calibrated.ZERO)),
        "train_windows_at_limits": max(windows, default=None),
        "time_windows": study.time_windows,
    }


def estimate(
    study: Study,
    jobs: list[cost.PlannedJob],
    concurrent_gpus: int,
    calibration: dict[str, Any] | None = None,
    calibration_path: Path | None = None,
) -> dict[str, Any]:
    """GPU-hours per rule and in total, wall time at ``concurrent_gpus``, the disk the study writes, and the
    expected figures of a ``calibration`` (read from ``calibration_path``; None: not measured)."""
    rules = cost.rule_costs(jobs)
    run_bytes = {model: study.run_disk_bytes(model) for model in study.models}
    checkpoints = sum(run_bytes[job.wildcards["model"]] or 0 for job in jobs if job.rule == "train")
    evaluation = study.evaluation.spec
    items = study.benchmark_sizes
    samples = sum(
        cost.samples_bytes(items[benchmark] or 0, evaluation["n_samples"], evaluation["max_new_tokens"])
        for job in jobs
        for benchmark in job.benchmarks
    )
    unknown = sorted({m for m, b in run_bytes.items() if b is None} | {b for b, n in items.items() if n is None})
    return {
        "rules": rules,
        "gpu_hours": sum(row["gpu_hours"] for row in rules.values()),
        "jobs": len(jobs),
        "concurrent_gpus": concurrent_gpus,
        "wall_hours": cost.wall_hours(jobs, concurrent_gpus),
        "disk_bytes": {"checkpoints": checkpoints, "samples": samples, "total": checkpoints + samples},
        "benchmark_items": items,
        "unknown_sizes": unknown,
        "evaluation_sizing": sizing_summary(study.evaluation.gpu_sizing),
        "evaluation_gpus": evaluation_gpus(study, jobs),
        "expected": {
            "source": calibrated.calibration_source(
                calibration, calibration_path or Path(study.results_dir) / calibrated.CALIBRATION_FILE
            ),
            **expected_cost(study, jobs, calibration, items),
        },
    }


def evaluation_gpus(study: Study, jobs: list[cost.PlannedJob]) -> dict[str, list[dict[str, Any]]]:
    """Per model (in config order), its planned evaluate jobs on the vllm backend grouped by what they ask (most GPUs,
    then most benchmarks first): jobs, GPUs (as planned), the benchmarks each serves and why (``Study.evaluation_layout`` of the job's
    wildcards); empty on another backend."""
    if study.evaluation.spec["backend"] != "vllm":
        return {}
    groups: dict[str, dict[tuple[int, str, tuple[str, ...]], int]] = {model: {} for model in study.models}
    for job in jobs:
        if job.rule in cost.EVALUATE_RULES:
            benchmarks = tuple(study.evaluation_benchmarks(job.wildcards))
            key = (job.gpus * job.nodes, study.evaluation_layout(job.wildcards).reason, benchmarks)
            found = groups[job.wildcards["model"]]
            found[key] = found.get(key, 0) + 1
    order = {name: index for index, name in enumerate(study.benchmarks)}
    return {
        model: [
            {"jobs": count, "gpus": gpus, "benchmarks": list(benchmarks), "reason": reason}
            for (gpus, reason, benchmarks), count in sorted(
                found.items(), key=lambda item: (-item[0][0], -len(item[0][2]), [order[name] for name in item[0][2]])
            )
        ]
        for model, found in groups.items()
        if found
    }


def evaluation_gpu_lines(estimate_: dict[str, Any]) -> list[str]:
    """Under the cost table: per model, the GPUs of its evaluation jobs and why (none off the vllm backend)."""
    if not estimate_["evaluation_gpus"]:
        return []
    lines = [f"GPUs per evaluation job ({estimate_['evaluation_sizing']}):"]
    for model, groups in estimate_["evaluation_gpus"].items():
        for group in groups:
            every = group["benchmarks"] == list(estimate_["benchmark_items"])
            served = "every benchmark" if every else "+".join(group["benchmarks"])
            jobs = f"{group['jobs']} job{'s' if group['jobs'] > 1 else ''}"
            gpus = f"{group['gpus']} GPU{'s' if group['gpus'] > 1 else ''}"
            lines.append(f"  {model}: {gpus} a job, {jobs} on {served}; {group['reason']}")
    return lines


def _range(hours: dict[str, float]) -> str:
    """``expected [low-high]`` hours, to two significant decimals where small."""
    digits = 2 if hours["high"] < 10 else 0
    return f"{hours['expected']:.{digits}f} [{hours['low']:.{digits}f}-{hours['high']:.{digits}f}]"


def cost_table(estimate_: dict[str, Any]) -> str:
    """The bounds per rule, and beside them the expected figures where the rule is calibrated (or "not measured")."""
    expected = estimate_["expected"]
    lines = [
        f"{'rule':<20}{'jobs':>6}{'GPUs/job':>10}{'max h':>8}{'GPU-h bound':>13}"
        f"{'expected job-h':>24}{'expected GPU-h':>24}{'limit (min)':>13}  expected"
    ]
    for rule, row in estimate_["rules"].items():
        gpus = (
            f"{row['min_gpus_per_job']}-{row['gpus_per_job']}"
            if row["min_gpus_per_job"] < row["gpus_per_job"]
            else row["gpus_per_job"]
        )
        line = f"{rule:<20}{row['jobs']:>6}{gpus:>10}{row['max_hours']:>8.1f}{row['gpu_hours']:>13.0f}"
        predicted = expected["rules"].get(rule)
        if predicted is not None and predicted["measured_jobs"]:
            limit = max(predicted["proposed_limit_min"].values())  # per model in the JSON
            line += f"{_range(predicted['hours']):>24}{_range(predicted['gpu_hours']):>24}{limit:>13}  "
        elif predicted is not None:
            line += f"{'':>24}{'':>24}{'':>13}  "
        lines.append(line + (predicted["status"] if predicted is not None else ""))
    disk = estimate_["disk_bytes"]
    measured = any(row["measured_jobs"] for row in expected["rules"].values())
    total_expected = f"{'':>24}{_range(expected['gpu_hours']):>24}" if measured else ""
    lines.append(f"{'total':<20}{estimate_['jobs']:>6}{'':>10}{'':>8}{estimate_['gpu_hours']:>13.0f}{total_expected}")
    lines.append(f"expected: {expected['source']}")
    if expected["train_windows_at_limits"] is not None:
        lines.append(
            f"training time windows at the configured limits: {expected['train_windows_at_limits']} needed at the high "
            f"prediction (time_windows: {expected['time_windows']}); 1 at the proposed limits"
        )
    lines.append(
        f"wall time at the time limits with {estimate_['concurrent_gpus']} concurrent GPUs: "
        f"{estimate_['wall_hours']:.1f} h; disk: {disk['checkpoints'] / cost.GIB:.0f} GiB checkpoints + "
        f"{disk['samples'] / cost.GIB:.1f} GiB samples"
    )
    if estimate_["unknown_sizes"]:
        lines.append(f"(sizes unknown, left out of the disk figure: {', '.join(estimate_['unknown_sizes'])})")
    return "\n".join(lines + evaluation_gpu_lines(estimate_))
