"""A killed or a second Snakemake controller on a study whose run is training, recovered with the commands of
docs/troubleshooting.md ("After a killed controller", run as written there): the real `snakemake` on the small fault study, its training job held at a
checkpoint by ``tests.hold_stage`` so that every step lands at a known point.

- SIGKILL of the controller alone (its job lives on, as after a lost terminal): a plain rerun is refused for the
  lock, then (after `--unlock`) for the training job that still runs, naming its pid, once the dead controller's
  study lock is broken with a log line; the orphaned job, stopped, publishes nothing, not even its checkpoint
  (pipeline.core.orphans); `--rerun-incomplete` then resumes the run from its checkpoint and ends it.
- A second controller under `--nolock` while the first trains: it stops before its first job, refused by the study
  lock (RESULTS_DIR/.study.lock, pipeline.core.locks), so the first's log and checkpoints are untouched (before, its
  job's preparation deleted the first's log and its failure deleted what the first had published).
- Two studies in one working directory (issue 52): the second study's controller ending (Snakemake then removes the
  whole `.snakemake/locks`) leaves the first study locked, and a third controller on the first study's results_dir
  is refused by name before any job, while a dry run beside it still plans."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fault_support import (
    EXPORT_STEP,
    RUN,
    checkpoint_steps,
    small_study,
    snakemake_command,
    stage_env,
    stage_process,
    start_snakemake,
    wait_until,
)

from tests.hold_stage import hold_training_env
from tests.shared_studies import REPO

pytestmark = pytest.mark.slow

TROUBLESHOOTING = REPO / "docs" / "troubleshooting.md"
TARGET = f"{RUN}/metrics.jsonl"
TRAIN_LOG = "results/logs/train/tiny/grpo/seed0.log"
BUSY = "another writer is training run(s) of this study: results/runs/tiny/grpo/seed0 (pid {pid} on"
STUDY_LOCK = "results/.study.lock"
HELD = "another Snakemake controller runs this study (pid {pid} on"


def snakemake(workdir: Path, *options: str, target: str = TARGET) -> subprocess.CompletedProcess[str]:
    """`snakemake [OPTIONS] TARGET` run to its end, as a user types it (no --rerun-incomplete unless given)."""
    command = [*snakemake_command(workdir, target, rerun_incomplete=False), *options]
    return subprocess.run(command, cwd=workdir, env=stage_env(), capture_output=True, text=True, timeout=600)


def held_training(workdir: Path, step: int) -> tuple[subprocess.Popen, int]:
    """A controller training the run from scratch, its stage held after checkpoint ``step``; (it, the stage's pid)."""
    shutil.rmtree(workdir / RUN, ignore_errors=True)
    controller = start_snakemake(workdir, TARGET, rerun_incomplete=False, hooks=hold_training_env(step))
    wait_until(lambda: step in checkpoint_steps(workdir / RUN), f"checkpoint-{step}", controller)
    pid = stage_process(controller.pid, "pipeline.train")
    assert pid is not None
    return controller, pid


def recovery_commands() -> list[list[str]]:
    """The `snakemake` commands of docs/troubleshooting.md's "After a killed controller", word for word."""
    text = TROUBLESHOOTING.read_text(encoding="utf-8")
    section = text.split("## After a killed controller", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [shlex.split(line, comments=True) for line in block.splitlines()]
    return [words for words in commands if words and words[0] == "snakemake"]


def documented(workdir: Path, words: list[str]) -> subprocess.CompletedProcess[str]:
    """A documented command run as typed in the study's directory (``python -m`` for the `snakemake` on PATH), on
    ``TARGET`` only: the rest of the study is not what the test is about."""
    command = [sys.executable, "-m", *words, TARGET]
    return subprocess.run(command, cwd=workdir, env=stage_env(), capture_output=True, text=True, timeout=600)


def test_killed_controller_recovers_with_the_documented_commands(study: Path) -> None:
    """The commands of docs/troubleshooting.md, which name the study's config (configs/quick.yaml there: here the
    small study's config is put at that path, and the Snakefile beside it, as in a checkout)."""
    unlock, rerun = recovery_commands()
    assert unlock[-1] == "--unlock" and rerun[-1] == "--rerun-incomplete"
    assert all(words[words.index("--configfile") + 1] == "configs/quick.yaml" for words in (unlock, rerun))
    (study / "configs").mkdir(exist_ok=True)
    shutil.copyfile(study / "config.yaml", study / "configs" / "quick.yaml")
    (study / "Snakefile").unlink(missing_ok=True)
    (study / "Snakefile").symlink_to(REPO / "Snakefile")
    controller, stage = held_training(study, EXPORT_STEP)
    os.kill(controller.pid, signal.SIGKILL)  # the controller alone: its job's shell and stage live on
    controller.wait(timeout=60)
    try:
        locked = snakemake(study)
        assert locked.returncode != 0 and "Directory cannot be locked" in locked.stderr, locked.stderr[-3000:]
        assert "--unlock" in locked.stderr
        unlocked = documented(study, unlock)
        assert unlocked.returncode == 0 and "Unlocked working directory." in unlocked.stdout + unlocked.stderr
        log_before = (study / TRAIN_LOG).read_text(encoding="utf-8")
        busy = documented(study, rerun)
        assert busy.returncode != 0 and BUSY.format(pid=stage) in busy.stderr, busy.stderr[-3000:]
        # the dead controller's study lock, broken by name before the busy run was refused
        broken = f"breaking the stale lock {study / STUDY_LOCK} (pid {controller.pid} on"
        assert broken in busy.stderr and f"pid {controller.pid} is not running" in busy.stderr, busy.stderr[-3000:]
        assert (study / TRAIN_LOG).read_text(encoding="utf-8").startswith(log_before)  # the job's log, untouched
        assert EXPORT_STEP in checkpoint_steps(study / RUN)
        # the orphaned stage, stopped, publishes nothing (its checkpoint included): its controller is gone
        os.kill(stage, signal.SIGTERM)
        wait_until(lambda: not Path(f"/proc/{stage}").exists(), "the end of the orphaned stage", timeout=120)
        log = (study / TRAIN_LOG).read_text(encoding="utf-8")
        assert "not published: " in log and "this job's Snakemake controller no longer holds the study" in log, log[
            -3000:
        ]
        assert checkpoint_steps(study / RUN)[-1] == EXPORT_STEP
    finally:
        if Path(f"/proc/{stage}").exists():
            os.kill(stage, signal.SIGKILL)
    wait_until(lambda: not Path(f"/proc/{stage}").exists(), "the end of the held stage", timeout=60)
    resumed = documented(study, rerun)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = (study / TRAIN_LOG).read_text(encoding="utf-8")
    assert f"resuming from {RUN}/checkpoints/checkpoint-{EXPORT_STEP} (step {EXPORT_STEP})" in log, log[-3000:]
    assert (study / RUN / "final").is_dir() and (study / TARGET).is_file()
    assert not (study / STUDY_LOCK).exists()  # given back when the controller ended


def test_second_controller_under_nolock_leaves_a_training_run_alone(study: Path) -> None:
    first, stage = held_training(study, 2)
    try:
        log_before = (study / TRAIN_LOG).read_text(encoding="utf-8")
        second = snakemake(study, "--nolock", "--rerun-incomplete")
        assert second.returncode != 0 and HELD.format(pid=first.pid) in second.stderr, second.stderr[-3000:]
        assert "train" not in "".join(line for line in second.stderr.splitlines() if line.startswith("rule "))
        # the first writer's log and checkpoints are as it left them, and it still holds its run
        assert (study / TRAIN_LOG).read_text(encoding="utf-8").startswith(log_before), log_before[-2000:]
        assert 2 in checkpoint_steps(study / RUN) and (study / RUN / "train.lock").is_file()
        assert first.poll() is None
    finally:
        os.kill(stage, signal.SIGTERM)  # the held stage checkpoints and stops (exit 75)
        first.wait(timeout=300)
    assert "received SIGTERM: saving a checkpoint at step 3 and stopping" in (study / TRAIN_LOG).read_text(
        encoding="utf-8"
    )
    assert not (study / STUDY_LOCK).exists()  # given back by the failed controller (onerror)


def test_another_study_ending_leaves_this_study_locked(study: Path) -> None:
    other = small_study() | {"results_dir": "results_other", "eval_data_dir": "eval_data_other"}
    (study / "other.yaml").write_text(yaml.safe_dump(other), encoding="utf-8")
    start_model = study / "results/models/tiny/start"
    first, stage = held_training(study, 2)
    try:
        other_run = snakemake(study, "--configfile", str(study / "other.yaml"), target="results_other/data/train.jsonl")
        assert other_run.returncode == 0, other_run.stderr[-3000:]
        assert not any((study / ".snakemake/locks").glob("*"))  # Snakemake's locks, this study's included, are gone
        assert json.loads((study / STUDY_LOCK).read_text(encoding="utf-8"))["pid"] == first.pid
        modified = start_model.stat().st_mtime_ns
        third = snakemake(study, "--forcerun", "warmup", target="results/models/tiny/start")
        assert third.returncode != 0 and HELD.format(pid=first.pid) in third.stderr, third.stderr[-3000:]
        assert not [line for line in third.stderr.splitlines() if line.startswith(("rule ", "localrule "))]
        assert start_model.stat().st_mtime_ns == modified
        planned = snakemake(study, "-n", "--forcerun", "warmup", target="results/models/tiny/start")
        assert planned.returncode == 0 and "warmup" in planned.stdout + planned.stderr, planned.stderr[-3000:]
        assert first.poll() is None
    finally:
        os.kill(stage, signal.SIGTERM)
        first.wait(timeout=300)
