"""Training's time-limit warning through the Slurm profile, on the real local cluster: time windows, a site flag,
and a final exit.

configs/paper.yaml gives training `time_limit_warning_s: 600`: ten minutes before the time limit Slurm names for
the job, the launcher sends SIGUSR1 to the training stage (pipeline.runtime.time_windows.arm_warning), which
checkpoints and exits 75; the launcher then requeues the Slurm job (`scontrol requeue`): the job keeps its id,
Snakemake sees no failure, and the next run resumes. The warning is no sbatch flag, so a site's `--set-resources
train:slurm_extra=...` (here `--exclusive`), which replaces the study's flags as Snakemake does, cannot drop it.
A study that asks Slurm itself (`slurm_extra: --signal=USR1@N`) gets SIGUSR1 in every process of the job's steps:
the Snakemake that the jobstep executor starts with `srun`, the rule's shell, the launcher and the stage. Only the
stage may act on it; every layer above must survive it, or the step dies with status 138 while the checkpoint is
still being written. `scancel --signal=USR1 JOB` sends exactly that signal (all steps, not the batch shell).

The first window holds after checkpoint-2 (tests/hold_stage) until the launcher's own warning, 2 minutes into
the window (a 4-minute limit, a 120 s lead: with a 3-minute limit, a loaded 2-core machine spent the first minute
on the jobstep's Snakemake and the stage's start-up, and the warning came before the first step); the second
holds after checkpoint-4 until the test sends Slurm's. With
`retries: 1` and `time_windows: 8` the run needs at least three windows of one Slurm job and must finish in that
one attempt (the launcher warns every window 2 minutes in: on a loaded machine the third does not finish the run, and
the next ones go on). Slurm holds a requeued job for about two minutes (BeginTime); the test lifts the hold (`scontrol update
StartTime=now+2`).

In the same study (one Snakemake run, to spend the Slurm polling once) a benchmark with a corrupt line makes its
job exit 2: its stage must run once, the retry exiting at once (pipeline.core.exit_codes).

Broken on purpose: with the launcher's requeue removed (close_window returning False before `scontrol requeue`),
Snakemake saw the first window's 75 as a failure and retried the job in a new Slurm job, so the test's warning
went to a job that no longer ran; with the gate removed from run_cli, the bad job's retry ran the stage again
(its log without the "not run again" line); before the Snakefile ignored SIGUSR1 the jobstep died of the warning
(status 138); with the launcher arming no warning, the first window held until the test's 600 s ran out.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fault_support import REPO, RUN, checkpoint_steps, jsonl, small_study, stage_env, wait_until, write_study
from safetensors.torch import load_file
from test_slurm_requeue import lift_requeue_hold, scontrol_job, slurm_answers

from pipeline.core.layout import CHECKPOINTS_DIR
from tests.hold_stage import hold_training_env

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.skipif(not slurm_answers(), reason="no Slurm cluster answers `sinfo` (start it: .ci/run)"),
]

PROFILE = REPO / "profiles" / "slurm"
TRAIN_LOG = "results/logs/train/tiny/grpo/seed0.log"
SUBMITTED_TRAIN_JOB = re.compile(r"has been submitted with SLURM jobid (\d+) \(log: (\S*/slurm_logs/rule_train/\S*)\)")
MAX_STEPS = 12
WINDOWS = 8
CHECKPOINT_WAIT_S = 600  # for each awaited checkpoint: a window's start-up and steps on a loaded machine


def accounting() -> bool:
    probe = subprocess.run(["sacct", "-n", "-X", "-j", "1"], capture_output=True, text=True, timeout=15)
    return probe.returncode == 0


def wait_for_the_next_window(job: str, run_dir: Path, step: int, snakemake: subprocess.Popen) -> None:
    """Lift the requeue hold of ``job`` until its next run published checkpoint-``step``."""
    deadline = time.monotonic() + CHECKPOINT_WAIT_S
    while step not in checkpoint_steps(run_dir):
        assert snakemake.poll() is None, f"Snakemake ended (status {snakemake.returncode}) before checkpoint-{step}"
        assert time.monotonic() < deadline, f"no checkpoint-{step} within {CHECKPOINT_WAIT_S} s: {scontrol_job(job)}"
        lift_requeue_hold(job)
        time.sleep(0.5)


def test_three_time_windows_finish_in_one_attempt_with_one_retry(tmp_path: Path) -> None:
    config = small_study()
    config["resources"] = {
        "default": {"cpus": 1, "mem_mb": 1000, "runtime": 10},
        "train": {"runtime": 4, "time_limit_warning_s": 120},  # the launcher's warning 2 minutes into each window
    }
    config["time_windows"] = WINDOWS
    # beside it, a job with bad input that only its stage can find (a hub dataset not in the offline cache: the plan's
    # input check passes a hub id; the stage exits 2): the profile's keep-going runs both
    config["benchmarks"]["broken"] = {"kind": "amc23", "hub_id": "no-such-owner/no-such-benchmark"}
    study = tmp_path / "study"
    write_study(study, config)
    output = study / "snakemake.out"
    run_dir = study / RUN
    command = [
        sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(study),
        "--configfile", str(study / "config.yaml"), "--profile", str(PROFILE), "--slurm-no-account",
        "--slurm-status-command", "sacct" if accounting() else "squeue", "--retries", "1",
        "--set-resources", "train:slurm_extra='--exclusive'",  # a site's flag, in place of the study's
        "--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "2",
        f"{RUN}/metrics.jsonl", "eval_data/broken.jsonl",
    ]  # fmt: skip
    with open(output, "w", encoding="utf-8") as log:
        snakemake = subprocess.Popen(
            command, cwd=study, env=stage_env(**hold_training_env(2, 4)), stdout=log, stderr=subprocess.STDOUT
        )
        try:
            wait_until(lambda: 2 in checkpoint_steps(run_dir), "checkpoint-2", snakemake, timeout=CHECKPOINT_WAIT_S)
            job, slurm_log = SUBMITTED_TRAIN_JOB.findall(output.read_text(encoding="utf-8"))[0]
            wait_for_the_next_window(job, run_dir, 4, snakemake)  # the launcher's warning: window 1 saved step 3
            resumed = (study / TRAIN_LOG).read_text(encoding="utf-8")
            subprocess.run(["scancel", "--signal=USR1", job], check=True, timeout=30)  # Slurm's own warning
            wait_for_the_next_window(job, run_dir, MAX_STEPS, snakemake)  # window 2 saved step 5
            assert snakemake.wait(timeout=300) == 1, output.read_text(encoding="utf-8")[-5000:]  # the bad job
        finally:
            if snakemake.poll() is None:
                snakemake.kill()
            submitted = re.findall(r"SLURM jobid (\d+)", output.read_text(encoding="utf-8"))
            subprocess.run(["scancel", *submitted], check=False, timeout=30)

    text = output.read_text(encoding="utf-8")
    assert SUBMITTED_TRAIN_JOB.findall(text) == [(job, slurm_log)], text[-5000:]  # one Slurm job, one attempt
    assert "Error in rule train" not in text and re.search(r"Finished jobid: \d+ \(Rule: train\)", text), text[-5000:]
    shown = scontrol_job(job)
    assert int(shown["Restarts"]) >= 2, shown  # three windows or more
    assert shown["OverSubscribe"] == "NO", shown  # the site's --exclusive reached the scheduler
    first = (study / f"{TRAIN_LOG}.window1").read_text(encoding="utf-8")
    assert "pipeline.launch: the time-limit warning (SIGUSR1) comes in " in first, first[-3000:]
    assert "pipeline.launch: forwarding SIGUSR1 to the stage processes" in first, first[-3000:]
    # The launcher requeued twice and kept each window's log (the jobstep's Snakemake survived the warnings: a job
    # step that died of SIGUSR1 fails the job, which Snakemake would retry).
    for window, stopped_at in ((1, 3), (2, 5)):
        kept = (study / f"{TRAIN_LOG}.window{window}").read_text(encoding="utf-8")
        assert f"saving a checkpoint at step {stopped_at} and stopping" in kept, kept[-3000:]
        ended = f"time window {window} of at most {WINDOWS} (time_windows) of Slurm job {job} ended on the time-limit warning"
        assert f"{ended}: requeueing the job" in kept, kept[-3000:]
    # Each window resumed from the checkpoint the warning made; every step was trained and logged once.
    assert f"resuming from {RUN}/checkpoints/checkpoint-3 (step 3)" in resumed, resumed[-3000:]
    third = study / f"{TRAIN_LOG}.window3"  # kept when the launcher's warning ended the third window too
    third_log = (third if third.exists() else study / TRAIN_LOG).read_text(encoding="utf-8")
    assert f"resuming from {RUN}/checkpoints/checkpoint-5 (step 5)" in third_log, third_log[-3000:]
    steps = [row["step"] for row in jsonl(run_dir / "metrics.jsonl") if "train_runtime" not in row]
    assert steps == list(range(1, MAX_STEPS + 1))
    final = load_file(run_dir / "final" / "model.safetensors")
    last = load_file(run_dir / CHECKPOINTS_DIR / f"checkpoint-{MAX_STEPS}" / "model.safetensors")
    assert final.keys() == last.keys() and all(final[name].equal(last[name]) for name in final)

    # The bad job ran its stage once: the retry Snakemake submitted exited 2 at once, and its log is the first
    # attempt's under one line saying why; Snakemake failed the study naming the log.
    assert text.count("Error in rule prepare_benchmarks") == 2 and text.count("Trying to restart job") == 1
    assert "log: results/logs/prepare_benchmarks/broken.log" in text
    bad = (study / "results/logs/prepare_benchmarks/broken.log").read_text(encoding="utf-8")
    assert bad.startswith("pipeline.prepare_benchmarks: not run again: an earlier attempt of this job in this ")
    assert bad.count("cannot load no-such-owner/no-such-benchmark") == 1, bad
