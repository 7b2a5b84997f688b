"""The study's published outputs checked against their seals when the study is planned (``pipeline.core.seal``).

Every output that a later stage reads is sealed by its writer: the benchmark files, the training data, the built
models (source and warmed-up start), each run's exported and final models and metrics log, each evaluation's
samples. The Snakefile asks ``damaged_outputs`` before Snakemake builds its DAG and hands what is damaged to
Snakemake's own ``--forcerun`` (``DAGSettings.forcerun``): the jobs that write them run again, and every job that
read them after (Snakemake reruns the jobs downstream of a job that runs). Snakemake cannot tell a damaged output
itself: it compares modification times and, for its inputs, checksums it recorded when a job read them, never an
output's content with what its writer wrote.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
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
    for job in study.evaluations():
        yield f"{results}/{layout.SAMPLES}".format(**job)


def damaged_outputs(study: Study) -> list[DamagedOutput]:
    """The study's outputs that exist and do not match their seals (a missing output is Snakemake's to build)."""
    damaged = []
    for output in sealed_outputs(study):
        if Path(output).exists() and (problem := seal_problem(Path(output))):
            damaged.append(DamagedOutput(output, problem))
    return damaged
