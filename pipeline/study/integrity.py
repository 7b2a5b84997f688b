"""The study's published outputs checked against their seals when the study is planned (``pipeline.core.seal``).

Every output that a later stage reads is sealed by its writer: the benchmark files, the training data, the built
models (source and warmed-up start), each run's exported and final models and metrics log, each evaluation's
samples. The Snakefile asks ``damaged_outputs`` before Snakemake builds its DAG and hands what is damaged to
Snakemake's own ``--forcerun`` (``DAGSettings.forcerun``): the jobs that write them run again, and every job that
read them after (Snakemake reruns the jobs downstream of a job that runs). Snakemake cannot tell a damaged output
itself: it compares modification times and, for its inputs, checksums it recorded when a job read them, never an
output's content with what its writer wrote.

A samples file is also checked against what its job was to sample, sealed or not: one row per item of its benchmark
file and sample index, ``items x n_samples`` rows (an unsealed file cut at a line boundary matches no seal, and the
tables would summarize it; pipeline.aggregate refuses it too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from pathlib import Path

from pipeline.core import layout
from pipeline.core.seal import damage_message, seal_problem
from pipeline.study.config import Study


@dataclasses.dataclass(frozen=True)
class DamagedOutput:
    path: str  # as the Snakefile's rules name it (relative to the working directory, or absolute)
    problem: str

    def message(self) -> str:
        return damage_message(Path(self.path), self.problem)


def sealed_outputs(study: Study) -> Iterator[str]:
    """Every output of the study that is sealed when written, as the rules name it."""
    results, eval_data = study.results_dir, study.eval_data_dir
    for benchmark in study.benchmarks:
        yield f"{eval_data}/{benchmark}.jsonl"
    yield f"{results}/{layout.TRAIN_DATA}"
    for name, model in study.models.items():
        if model.source is not None:
            yield f"{results}/{layout.SOURCE_MODEL}".format(model=name)
        if model.warmup is not None:
            yield f"{results}/{layout.START_MODEL}".format(model=name)
    labels = [layout.FINAL_CHECKPOINT, *(layout.export_label(step) for step in study.export_steps())]
    for run in study.runs():
        run_dir = f"{results}/{layout.RUN_DIR}".format(**run)
        yield f"{run_dir}/{layout.METRICS_FILE}"
        for label in labels:
            yield layout.run_model_dir(run_dir, label)
    yield from samples_files(study)


def samples_files(study: Study) -> Iterator[str]:
    """Every samples file of the study, as the rules name it."""
    for job in study.evaluations():
        yield f"{study.results_dir}/{layout.SAMPLES}".format(**job)


def line_count(path: Path) -> int:
    with open(path, "rb") as handle:
        return sum(1 for line in handle if line.strip())


def samples_count_problem(samples: Path, benchmark: Path, n_samples: int) -> str | None:
    """Why ``samples`` does not hold one row per (item of ``benchmark``, sample < ``n_samples``); None when its row
    count is that, or the benchmark file is not there to count (its job is then planned anyway)."""
    if not benchmark.is_file():
        return None
    items, rows = line_count(benchmark), line_count(samples)
    if rows == items * n_samples:
        return None
    return f"{rows} samples, where {benchmark} has {items} items x {n_samples} samples = {items * n_samples}"


def damaged_outputs(study: Study) -> list[DamagedOutput]:
    """The study's outputs that exist and do not match their seals, and the samples files whose row count is not
    their benchmark's items x n_samples (a missing output: ``missing_outputs``)."""
    damaged = []
    for output in sealed_outputs(study):
        if Path(output).exists() and (problem := seal_problem(Path(output))):
            damaged.append(DamagedOutput(output, problem))
    found = {output.path for output in damaged}
    n_samples = int(study.evaluation.spec["n_samples"])
    for job, output in zip(study.evaluations(), samples_files(study), strict=True):
        benchmark = Path(f"{study.eval_data_dir}/{job['benchmark']}.jsonl")
        fresh = output not in found and Path(output).is_file()
        if fresh and (problem := samples_count_problem(Path(output), benchmark, n_samples)):
            damaged.append(DamagedOutput(output, problem))
    return damaged


def missing_outputs(outputs: Iterable[str]) -> list[str]:
    """The ``outputs`` (as the rules name them) that are not on disk."""
    return [output for output in outputs if not Path(output).exists()]
