"""What a study costs before it runs: GPU-hours at the time limits, wall time at N concurrent GPUs, disk.

Pure functions over planned jobs (`PlannedJob`, from `snakemake -n`) and the study's numbers; the preflight
(`python -m pipeline.preflight`) prints them as a table and writes them under `cost` in its --json.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pipeline.runtime.disk_space import checkpoint_bytes

GIB = 1024**3
MB = 1000**2  # Snakemake's *_mb resources and Kubernetes' M suffix are decimal megabytes
# The evaluate rules: one job per (run, checkpoint) on all benchmarks, and one on the token analysis's benchmark alone
# for the checkpoints only the analysis reads (pipeline.study.config.Study.evaluate_rules); with one job per
# benchmark, `evaluate` alone.
EVALUATE_RULES = ("evaluate", "evaluate_analysed")
# Stage order of the DAG (Snakefile): a job of one stage waits for the stages before it.
STAGE_ORDER = (
    ("prepare_benchmarks", "prepare_data", "prepare_model"),
    ("warmup",),
    ("train",),
    EVALUATE_RULES,
    ("token_analysis", "aggregate", "significance", "token_viewer", "credit_placement"),
    ("report",),
)
# Bytes a completion takes in the samples JSONL per generated token (text plus the row's JSON overhead per token;
# the arithmetic and math outputs measured here average 3-4 characters a token) and per row.
BYTES_PER_TOKEN = 4
BYTES_PER_ROW = 300


@dataclass(frozen=True)
class PlannedJob:
    """One job of the plan: its rule, wildcards and what it asks the scheduler for (runtime in minutes)."""

    rule: str
    wildcards: dict[str, str] = field(default_factory=dict)
    threads: int = 1
    gpus: int = 0
    runtime: int = 0
    mem_mb: int = 0
    nodes: int = 1
    gpu_model: str | None = None
    partition: str | None = None
    benchmarks: tuple[str, ...] = ()  # an evaluate job's: one samples file each
    # every resource as Snakemake evaluated it (None: not known before the run), for the scheduler's own verdict
    resources: Mapping[str, Any] = field(default_factory=dict, compare=False)


def gpu_hours(job: PlannedJob) -> float:
    """GPU-hour upper bound of one job: GPUs per node x nodes x time limit (first attempt), in hours."""
    return job.gpus * job.nodes * job.runtime / 60


def rule_costs(jobs: Iterable[PlannedJob]) -> dict[str, dict[str, float | int]]:
    """Per rule: jobs, GPUs per job (the largest, and the smallest: evaluation jobs sized to their work differ),
    longest time limit (h), and the GPU-hour bound (sum)."""
    table: dict[str, dict[str, float | int]] = {}
    for job in jobs:
        gpus = job.gpus * job.nodes
        row = table.setdefault(
            job.rule, {"jobs": 0, "gpus_per_job": 0, "min_gpus_per_job": gpus, "max_hours": 0.0, "gpu_hours": 0.0}
        )
        row["jobs"] += 1
        row["gpus_per_job"] = max(row["gpus_per_job"], gpus)
        row["min_gpus_per_job"] = min(row["min_gpus_per_job"], gpus)
        row["max_hours"] = max(row["max_hours"], job.runtime / 60)
        row["gpu_hours"] += gpu_hours(job)
    return table


def wall_hours(jobs: list[PlannedJob], concurrent_gpus: int) -> float:
    """Expected wall time at the time limits with ``concurrent_gpus`` GPUs (a bound, not a forecast).

    Per stage (STAGE_ORDER), the GPU work spread over the GPUs, ``sum(gpu-hours) / concurrent_gpus``, but never
    less than the stage's longest job; the stages add up (each waits for the one before):
    wall = sum over stages of max(longest job, stage GPU-hours / concurrent_gpus).
    """
    total = 0.0
    for stage in STAGE_ORDER:
        members = [job for job in jobs if job.rule in stage]
        if not members:
            continue
        longest = max(job.runtime for job in members) / 60
        total += max(longest, sum(gpu_hours(job) for job in members) / concurrent_gpus)
    return total


def parameter_count(model: Mapping[str, Any]) -> int | None:
    """A model's parameters: its declared ``parameters``, else the tiny Qwen3 from its architecture, a hub model
    from the "NB" (or "NM") in its id; None when none of these says it.

    Tiny (tied embeddings): V*h + L*(h*(q+2kv) + q*h + 3*h*i + 2*h) + h, with q = heads*head_dim, kv =
    kv_heads*head_dim and V about 100 (the character vocabulary); hub ids such as Qwen/Qwen3-8B: 8e9, SmolLM2-135M-Instruct: 1.35e8.
    """
    if "parameters" in model:
        return model["parameters"]
    if "path" in model:
        name = model["path"].rsplit("/", 1)[-1]
        match = re.search(r"(\d+(?:\.\d+)?)([BM])(?![a-z])", name, flags=re.IGNORECASE)
        return round(float(match.group(1)) * (1e9 if match.group(2) in "Bb" else 1e6)) if match else None
    warmup = model.get("warmup") or {}
    if "hidden_size" not in warmup:
        return None
    hidden, layers = warmup["hidden_size"], warmup["num_hidden_layers"]
    query = warmup["num_attention_heads"] * warmup["head_dim"]
    key_value = warmup["num_key_value_heads"] * warmup["head_dim"]
    per_layer = hidden * (query + 2 * key_value) + query * hidden + 3 * hidden * warmup["intermediate_size"]
    return 100 * hidden + layers * (per_layer + 2 * hidden) + hidden


def run_disk_bytes(parameters: int, *, bf16: bool, save_total_limit: int | None, checkpoints: int, exports: int) -> int:
    """One training run at its peak: the kept checkpoints (save_total_limit, else every save) plus the one being
    written (a save publishes the new checkpoint before it rotates the oldest away), and the exported and final models."""
    kept = checkpoints if save_total_limit is None else min(save_total_limit + 1, checkpoints)
    weights = parameters * (2 if bf16 else 4)
    return kept * checkpoint_bytes(parameters, bf16) + (exports + 1) * weights


def samples_bytes(items: int, samples: int, max_tokens: int) -> int:
    """One evaluation file at the token limit: items x samples x (tokens x BYTES_PER_TOKEN + BYTES_PER_ROW)."""
    return items * samples * (max_tokens * BYTES_PER_TOKEN + BYTES_PER_ROW)


def saves(max_steps: int, save_steps: int) -> int:
    """How many checkpoints a run writes: one every save_steps steps up to max_steps."""
    return math.floor(max_steps / save_steps) if save_steps else 0


def scaled_gpu_hours(
    jobs: Iterable[PlannedJob],
    *,
    seeds_factor: float,
    generations: Mapping[str, int],
    configured_generations: Mapping[str, int],
    baseline: str,
    evaluation_gpus: Callable[[PlannedJob], int] | None = None,
) -> float:
    """The GPU-hour bound of the planned study with ``seeds_factor`` times its training seeds and ``generations``
    (items x samples per item) per benchmark instead of ``configured_generations`` (the planner's alternatives).

    A job of a trained run (a ``seed`` wildcard, method not ``baseline``: training, its evaluations, its token
    analysis) counts seeds_factor times. Every evaluation job has the same time limit, sized for the largest
    configured evaluation job; a job's limit grows only when its generations (summed over its benchmarks B_j) pass
    that one's: hours x max(1, sum_{b in B_j} generations_b / max_j' sum_{b in B_j'} configured_generations_b).
    ``evaluation_gpus``: the GPUs an evaluation job asks for under ``generations`` (a layout sized to the work grows
    with them: ``pipeline.study.power_analysis.design_gpu_hours``); None: the planned ones.
    """
    evaluations = [job for job in jobs if job.rule in EVALUATE_RULES]
    largest = max((sum(configured_generations.get(b, 0) for b in job.benchmarks) for job in evaluations), default=0)
    total = 0.0
    for job in jobs:
        hours = gpu_hours(job)
        if job.rule in EVALUATE_RULES and evaluation_gpus is not None:
            hours = gpu_hours(replace(job, gpus=evaluation_gpus(job)))
        if job.rule in EVALUATE_RULES and largest:
            hours *= max(1.0, sum(generations.get(b, 0) for b in job.benchmarks) / largest)
        if "seed" in job.wildcards and job.wildcards.get("method") != baseline:
            hours *= seeds_factor
        total += hours
    return total
