"""Damaged outputs of a finished study (issue 43), in a copy of the finished CI study: found when the study is
planned and written again by a plain `snakemake`, with everything that read them.

- two samples files, one cut at a line boundary (what a full disk or a killed copy leaves: before seals the rerun
  scored the rest silently, the tables computed on fewer items) and one cut mid-line (before: aggregate failed on
  every rerun, naming the line, and no rerun repaired it); the plain rerun redoes both evaluations and everything
  downstream, and the tables come out as before (evaluation is deterministic);
- the training data cut at a line boundary: the plan reruns data preparation and every job after it; executed for
  the data file itself (the rest is the CI study again, which other tests run);
- a published model with a shard cut: the plan reruns its training job (which republishes from its checkpoints).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.seal import seal_problem
from tests.shared_studies import CI_CONFIG_FILES, REPO, with_examples

pytestmark = pytest.mark.slow

LINE_CUT = Path("results/eval/tiny/grpo/seed0/final/arith_add.jsonl")
MID_LINE_CUT = Path("results/eval/tiny/grail/seed0/final/arith_add_hard.jsonl")
TRAIN_DATA = Path("results/data/train.jsonl")
FINAL_MODEL = Path("results/runs/tiny/oar_g/seed0/final")
SCORES = Path("results/tables/scores.csv")


def snakemake(study: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(study)]
    return subprocess.run(
        [*command, *arguments, "--cores", "2", *CI_CONFIG_FILES],
        capture_output=True,
        text=True,
        timeout=1200,
        env=with_examples(),
    )


def cut_lines(path: Path, keep: float) -> None:
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[: int(len(lines) * keep)]))


def planned_jobs(plan: str) -> dict[str, int]:
    """The job counts of a dry run's first table (``rule  count`` rows down to ``total``)."""
    table = plan.split("Job stats:", 1)[1].split("-------\n", 1)[1].split("total", 1)[0]
    return {rule: int(count) for rule, count in (line.split() for line in table.splitlines() if line.strip())}


def test_damaged_outputs_are_found_at_plan_time_and_written_again(ci_study_copy: Path) -> None:
    study = ci_study_copy
    before = {path: (study / path).read_bytes() for path in (LINE_CUT, MID_LINE_CUT, TRAIN_DATA, SCORES)}
    cut_lines(study / LINE_CUT, 0.6)
    (study / MID_LINE_CUT).write_bytes(before[MID_LINE_CUT][: len(before[MID_LINE_CUT]) // 2 + 7])

    plan = snakemake(study, "-n")
    assert plan.returncode == 0, plan.stderr[-3000:]
    for path in (LINE_CUT, MID_LINE_CUT):
        assert f"{path}: damaged: " in plan.stderr, plan.stderr[-3000:]
    # two evaluate jobs (one per (run, checkpoint), each on both benchmarks): GRAIL's gives arith_add back as it was,
    # but Snakemake reruns what reads any output of a job it runs, GRAIL's token analysis of arith_add among them
    assert planned_jobs(plan.stdout) == {
        "all": 1, "evaluate": 2, "aggregate": 1, "significance": 1, "token_analysis": 1, "token_viewer": 1,
        "report": 1,
    }  # fmt: skip

    rerun = snakemake(study)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    for log, kept in (("grpo", "arith_add_hard"), ("grail", "arith_add")):
        text = (study / f"results/logs/evaluate/tiny/{log}/seed0/final.log").read_text()
        assert f"evaluate: {kept}: the samples kept from an earlier run of this job" in text, text[-2000:]
    for path in (LINE_CUT, MID_LINE_CUT, SCORES):
        assert (study / path).read_bytes() == before[path], path
        assert seal_problem(study / path) is None
    assert "damaged" not in snakemake(study, "-n").stderr  # nothing left to do
    assert "Nothing to be done" in snakemake(study, "-n").stdout

    cut_lines(study / TRAIN_DATA, 0.5)
    (study / FINAL_MODEL / "model.safetensors").write_bytes(b"")
    plan = snakemake(study, "-n")
    assert (
        f"{TRAIN_DATA}: damaged: " in plan.stderr
        and f"{FINAL_MODEL}: damaged: model.safetensors: 0 lines, 0 bytes" in plan.stderr
    )
    jobs = planned_jobs(plan.stdout)
    assert jobs["prepare_data"] == 1 and jobs["warmup"] == 1 and jobs["train"] == 4, jobs
    repaired = snakemake(study, str(TRAIN_DATA))
    assert repaired.returncode == 0, repaired.stderr[-3000:]
    assert (study / TRAIN_DATA).read_bytes() == before[TRAIN_DATA] and seal_problem(study / TRAIN_DATA) is None
