"""Damaged outputs of a finished study (issue 43), in a copy of the finished CI study: found when the study is
planned, set aside with their seals (nothing deleted; issue 55: by Snakemake's public means, a missing output) and
written again by a plain `snakemake`, with everything that read them.

- two samples files, one cut at a line boundary (what a full disk or a killed copy leaves: before seals the rerun
  scored the rest silently, the tables computed on fewer items) and one cut mid-line (before: aggregate failed on
  every rerun, naming the line, and no rerun repaired it); the plain rerun redoes both evaluations and everything
  downstream, and the tables come out as before (evaluation is deterministic);
- the training data cut at a line boundary: the plan reruns data preparation and every job after it; executed for
  the data file itself (the rest is the CI study again, which other tests run);
- a published model with a shard cut: the plan reruns its training job (which republishes from its checkpoints).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.locks import STUDY_LOCK_FILE, Holder
from pipeline.core.seal import file_seal_path, seal_problem, write_seal
from pipeline.study.integrity import DamagedOutput, set_aside
from pipeline.study.writers import study_holder
from tests.shared_studies import CI_CONFIG_FILES, REPO, with_examples

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


@pytest.mark.slow
def test_damaged_outputs_are_found_at_plan_time_and_written_again(ci_study_copy: Path) -> None:
    study = ci_study_copy
    before = {path: (study / path).read_bytes() for path in (LINE_CUT, MID_LINE_CUT, TRAIN_DATA, SCORES)}
    cut_lines(study / LINE_CUT, 0.6)
    (study / MID_LINE_CUT).write_bytes(before[MID_LINE_CUT][: len(before[MID_LINE_CUT]) // 2 + 7])

    plan = snakemake(study, "-n")
    assert plan.returncode == 0, plan.stderr[-3000:]
    for path in (LINE_CUT, MID_LINE_CUT):
        assert f"{path}: damaged: " in plan.stderr, plan.stderr[-3000:]
    # set aside with their seals, beside why.json, so that the plan is the repair; nothing deleted
    (kept,) = (study / "results/set_aside").iterdir()
    assert f"set aside to {kept.relative_to(study)}" in plan.stderr
    lines = before[LINE_CUT].decode().splitlines()
    assert (kept / LINE_CUT).read_text().splitlines() == lines[: int(len(lines) * 0.6)]
    assert (kept / MID_LINE_CUT).read_bytes() == before[MID_LINE_CUT][: len(before[MID_LINE_CUT]) // 2 + 7]
    assert file_seal_path(kept / LINE_CUT).is_file() and not (study / LINE_CUT).exists()
    assert sorted(json.loads((kept / "why.json").read_text())) == sorted([str(LINE_CUT), str(MID_LINE_CUT)])
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


def test_set_aside_moves_each_output_with_its_seal_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    samples, model = Path("results/eval/a.jsonl"), Path("results/runs/m/final")
    samples.parent.mkdir(parents=True)
    samples.write_text("1\n2\n")
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"weights")
    write_seal(samples)
    write_seal(model)
    absolute = tmp_path / "elsewhere" / "bench.jsonl"
    absolute.parent.mkdir()
    absolute.write_text("x\n")
    damaged = [
        DamagedOutput(str(samples), "cut"),
        DamagedOutput(str(model), "shard cut"),
        DamagedOutput(str(absolute), "?"),
    ]
    moved_to = set_aside(damaged, "results")
    assert moved_to.parent == Path("results/set_aside")
    assert (moved_to / samples).read_text() == "1\n2\n" and file_seal_path(moved_to / samples).is_file()
    assert (moved_to / model / "model.safetensors").read_bytes() == b"weights" and (
        moved_to / model / "seal.json"
    ).is_file()
    assert (moved_to / absolute.relative_to("/")).read_text() == "x\n"
    assert (
        not samples.exists() and not file_seal_path(samples).exists() and not model.exists() and not absolute.exists()
    )
    why = json.loads((moved_to / "why.json").read_text())
    assert why == {str(samples): "cut", str(model): "shard cut", str(absolute): "?"}


def test_a_live_controller_of_the_study_keeps_its_outputs_in_place(tmp_path: Path) -> None:
    """A dry run beside a running study must not move what that study's jobs may be writing."""
    lock = tmp_path / STUDY_LOCK_FILE
    assert study_holder(tmp_path) is None
    other = Holder.this_process()
    lock.write_text(json.dumps({**other.__dict__, "pid": os.getppid()}))
    assert f"another Snakemake controller runs this study (pid {os.getppid()}" in (study_holder(tmp_path) or "")
    lock.write_text(json.dumps(other.__dict__))  # this very process: the controller itself, before its onstart
    assert study_holder(tmp_path) is None
    lock.write_text(json.dumps({**other.__dict__, "pid": 2**22 + 1}))  # no such process: a stale lock
    assert study_holder(tmp_path) is None
