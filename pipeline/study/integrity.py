"""The study's published outputs checked against their seals when the study is planned (``pipeline.core.seal``).

Every output that a later stage reads is sealed by its writer: the benchmark files, the training data, the built
models (source and warmed-up start), each run's exported and final models and metrics log, each evaluation's
samples. Before Snakemake plans, the controller sets every damaged output aside (``set_aside_damaged``): moved, with
its seal, to ``RESULTS_DIR/set_aside/<UTC time>/`` beside a ``why.json``, so that Snakemake finds it missing and runs
the job that writes it, and every job that read it after (Snakemake reruns the jobs downstream of a job that runs).
Snakemake cannot tell a damaged output itself: it compares modification times and, for its inputs, checksums it
recorded when a job read them, never an output's content with what its writer wrote. A missing output is what it
acts on by itself, so the repair needs nothing of Snakemake beyond its rules; a dry run sets aside too, so that its
plan is the repair (nothing is deleted).

A samples file is also checked against what its job was to sample, sealed or not: one row per item of its benchmark
file and sample index, ``items x n_samples`` rows (an unsealed file cut at a line boundary matches no seal, and the
tables would summarize it; pipeline.aggregate refuses it too).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from pipeline.core import layout
from pipeline.core.seal import damage_message, file_seal_path, seal_problem
from pipeline.study.config import Study
from pipeline.study.writers import study_holder
from pipeline.training.run_state import WHY_FILE, set_aside_dir


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


def set_aside(damaged: list[DamagedOutput], results_dir: str | Path) -> Path:
    """Move each damaged output, with its seal, to ``RESULTS_DIR/set_aside/<UTC time>/<its path>`` (an absolute path
    under its root's name), with a ``why.json`` of ``{path: problem}``; the directory is returned."""
    moved_to = set_aside_dir(Path(results_dir))
    for output in damaged:
        source = Path(output.path)
        destination = moved_to / (source.relative_to(source.anchor) if source.is_absolute() else source)
        destination.parent.mkdir(parents=True, exist_ok=True)
        seal = file_seal_path(source)
        shutil.move(source, destination)  # a benchmark file may live on another file system than results_dir
        if seal.is_file():
            shutil.move(seal, file_seal_path(destination))
    why = {output.path: output.problem for output in damaged}
    (moved_to / WHY_FILE).write_text(json.dumps(why, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return moved_to


def set_aside_damaged(study: Study) -> list[str]:
    """The controller's repair before Snakemake plans: every damaged output (``damaged_outputs``) named on stderr and
    set aside (``set_aside``), unless another live controller holds the study (it may be writing them: they are
    named and left in place). The paths set aside, as the rules name them."""
    damaged = damaged_outputs(study)
    if not damaged:
        return []
    if holder := study_holder(study.results_dir):
        for output in damaged:
            print(f"{output.message()}; left in place: {holder}", file=sys.stderr)
        return []
    moved_to = set_aside(damaged, study.results_dir)
    for output in damaged:
        print(f"{output.message()}; set aside to {moved_to}{os.sep}", file=sys.stderr)
    return [output.path for output in damaged]


def missing_outputs(outputs: Iterable[str]) -> list[str]:
    """The ``outputs`` (as the rules name them) that are not on disk."""
    return [output for output in outputs if not Path(output).exists()]
