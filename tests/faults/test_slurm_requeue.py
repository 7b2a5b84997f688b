"""A training job on the real local Slurm cluster hits its time limit after a checkpoint, is requeued and resumes.

The batch script is what a user submits by hand (tests/faults/README.md shows it): `sbatch --time=2 --signal=B:USR1@60
--requeue` runs `python -m pipeline.train` in the background, forwards Slurm's USR1 warning to it, and when the
stage exits 75 (checkpoint saved on the signal) runs `scontrol requeue` on its own job.

Two things make it fast and independent of the machine's speed, without faking the time limit:
- the training stage holds after publishing checkpoint-2 until it receives a preemption signal (the test hook of
  ``tests.hold_stage``, in the job's environment): the warning therefore always lands after a checkpoint, mid-run;
- a requeued job is held for Slurm's credential lifetime (about 2 minutes) before it may start again; the test
  lifts that hold with `scontrol update StartTime=now+2` (two seconds on: see the loop).
Needs `sinfo` to answer (.ci/run starts the cluster with scripts/slurm-single-node.sh).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fault_support import REPO, checkpoint_steps, jsonl, wait_until

from pipeline.models.tiny_model import TinyModelSpec, save_tiny_model
from pipeline.tasks.arith import ArithmeticSpec, arithmetic_problems
from pipeline.tasks.prompts import build_prompt
from tests.hold_stage import hold_training_env

MAX_STEPS = 12
TRAINING_SPEC = {
    "max_steps": MAX_STEPS,
    "save_steps": 2,
    "per_device_train_batch_size": 4,
    "num_generations": 4,
    "max_completion_length": 12,
    "logging_steps": 1,
    "bf16": False,
    "gradient_checkpointing": False,
    "dataloader_pin_memory": False,
}


def slurm_answers() -> bool:
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.skipif(not slurm_answers(), reason="no Slurm cluster answers `sinfo` (start it: .ci/run)"),
]

BATCH_SCRIPT = """#!/bin/bash
echo "attempt SLURM_RESTART_COUNT=${{SLURM_RESTART_COUNT:-0}}"
export PYTHONPATH={repo} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export {test_hook}
forwarded=""
forward() {{ echo "batch shell: USR1 received, forwarding"; forwarded=1; kill -USR1 "$child"; }}
trap forward USR1
{train} &
child=$!
wait "$child"; status=$?
# `wait` returns early when the trap runs: wait for the stage's own exit status
[ -n "$forwarded" ] && {{ wait "$child"; status=$?; }}
echo "train exit $status"
if [ "$status" -eq 75 ]; then
  echo "requeueing"
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
"""


def scontrol_job(job_id: str) -> dict[str, str]:
    text = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", text))


def lift_requeue_hold(job_id: str) -> dict[str, str]:
    """Lift the hold Slurm puts on a requeued job (``BeginTime``, about 2 minutes); the job's state."""
    state = scontrol_job(job_id)
    if state["JobState"] == "PENDING" and state.get("Reason") == "BeginTime":
        # two seconds on: slurmd revoked the first run's credential at the requeue, to the second, and a start
        # within that same second gets a credential it counts as revoked ("Killing non-startable batch job: Job
        # credential revoked"; seen once under load), which fails the job
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now+2"], check=True)
    return state


def first_checkpoint_or_exit(run_dir: Path, log: Path) -> bool:
    """Whether the run published a checkpoint, or the stage already ended (the log says why)."""
    published = (run_dir / "checkpoints").is_dir() and bool(checkpoint_steps(run_dir))
    return published or (log.exists() and "train exit" in log.read_text())


def expected_stop_step(attempt: str) -> int:
    """The step an attempt that saved on the warning must stop at, from the order of its log's lines.

    The warning comes 60 s after the job starts. Normally the stage has published checkpoint-2 and holds by then,
    so it resumes on the signal and stops after step 3. On a loaded machine (CI runs this beside other tests) its
    start-up can outlast those 60 s: the warning then lands during step 1 or 2, and the stage stops after that step
    (the hold after checkpoint-2, if reached, returns at once). Either way the stage stops at the end of the step
    the warning landed in, and the requeued attempt resumes from that step's checkpoint.
    """
    hold = attempt.find("holding after checkpoint-2 until a signal")
    warning = attempt.index("batch shell: USR1 received")
    if hold == -1:
        return 1  # the warning landed in step 1: checkpoint-1 saved on it, no hold reached
    return 3 if hold < warning else 2


SAVED_ON_WARNING = r"received SIGUSR1: saving a checkpoint at step (\d+) and stopping"
STOPPED_BEFORE_TRAINING = "received SIGUSR1 before the first training step: stopping without a checkpoint"


def first_attempt_saving_on_the_warning(attempts: list[str]) -> int:
    """The index of the first attempt that saved a checkpoint on the warning; the attempts before it stopped early.

    Slurm may send the warning up to a minute before the time it was asked for (its event resolution), and a loaded
    machine (CI) may still be loading the stage then: such an attempt stops before its first step, without a
    checkpoint, and the next attempt starts where it would have (seen on CI, at the run's start and at a resume).
    """
    for index, attempt in enumerate(attempts):
        if re.search(SAVED_ON_WARNING, attempt):
            return index
        assert STOPPED_BEFORE_TRAINING in attempt, attempt[-3000:]
    raise AssertionError(f"no attempt saved a checkpoint on the warning: {attempts}")


def first_attempt_past_its_start(attempts: list[str], start: int) -> int:
    """The index of the first attempt from ``start`` on that was not warned before its first step (see above)."""
    for index in range(start, len(attempts)):
        if STOPPED_BEFORE_TRAINING not in attempts[index]:
            return index
    raise AssertionError(f"every attempt from {start} on was warned before its first step: {attempts}")


@pytest.fixture
def job_inputs(tmp_path: Path) -> tuple[Path, Path]:
    model = save_tiny_model(TinyModelSpec(), tmp_path / "model")
    rows = [
        {
            "id": p["id"],
            "prompt": [{"role": "user", "content": build_prompt(p["problem"])}],
            "solution": p["answer"],
            "source": "arith",
        }
        for p in arithmetic_problems(ArithmeticSpec(count=32, seed=1))
    ]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return model, data


def test_time_limit_warning_checkpoints_requeues_and_resumes(tmp_path: Path, job_inputs) -> None:
    model, data = job_inputs
    run_dir, log = tmp_path / "run", tmp_path / "job.log"
    train = shlex.join(
        [
            sys.executable, "-m", "pipeline.train", "--model", str(model),
            "--training-spec", json.dumps(TRAINING_SPEC), "--method-spec", "{}",
            "--data", str(data), "--seed", "0", "--out", str(run_dir),
        ]
    )  # fmt: skip
    script = tmp_path / "train.sbatch"
    test_hook = " ".join(f"{name}={shlex.quote(value)}" for name, value in hold_training_env(2).items())
    script.write_text(
        BATCH_SCRIPT.format(repo=shlex.quote(str(REPO)), test_hook=test_hook, train=train), encoding="utf-8"
    )
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--time=2", "--signal=B:USR1@60", "--requeue", "--open-mode=append",
         "--job-name=faults-requeue", f"--output={log}", f"--chdir={tmp_path}", str(script)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    job = submitted.stdout.strip().split(";")[0]
    try:
        # checkpoint-2, then the stage holds: the time-limit warning lands mid-run, after the checkpoint.
        wait_until(lambda: first_checkpoint_or_exit(run_dir, log), "first checkpoint", timeout=120)
        early = log.read_text()
        assert "train exit" not in early or "train exit 75" in early, early[-3000:]
        wait_until(lambda: "USR1 received" in log.read_text(), "the time-limit warning", timeout=90)

        # a hang guard, not a speed bound: on a loaded machine (18 s a step, seen in CI beside the vLLM tests) each
        # 60 s window trains a step or three, and the run needs four or five windows
        deadline = time.monotonic() + 420
        while (state := lift_requeue_hold(job))["JobState"] != "COMPLETED":
            # SIGNALING and CONFIGURING are transient states Slurm passes through while it warns and restarts.
            alive = {"RUNNING", "PENDING", "REQUEUED", "COMPLETING", "SIGNALING", "CONFIGURING"}
            assert state["JobState"] in alive, (state, log.read_text())
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(1)
    finally:
        subprocess.run(["scancel", job], check=False)

    state = scontrol_job(job)
    assert int(state["Restarts"]) >= 1 and state["ExitCode"] == "0:0"
    text = log.read_text()
    attempts = text.split("attempt SLURM_RESTART_COUNT=")[1:]
    assert [attempt.split("\n", 1)[0] for attempt in attempts] == [str(n) for n in range(len(attempts))]
    for attempt in attempts[:-1]:
        assert "train exit 75" in attempt and "requeueing" in attempt, attempt[-3000:]
    saving = first_attempt_saving_on_the_warning(attempts)
    stopped_at = int(re.search(SAVED_ON_WARNING, attempts[saving]).group(1))
    assert f"stopped at step {stopped_at} on request" in attempts[saving]
    assert stopped_at == expected_stop_step(attempts[saving])
    resumed = f"resuming from {run_dir}/checkpoints/checkpoint-{stopped_at} (step {stopped_at})"
    assert resumed in attempts[first_attempt_past_its_start(attempts, saving + 1)]
    assert "train exit 0" in attempts[-1]
    assert (run_dir / "final" / "model.safetensors").is_file()
    state_file = run_dir / "checkpoints" / f"checkpoint-{MAX_STEPS}" / "trainer_state.json"
    assert json.loads(state_file.read_text())["global_step"] == MAX_STEPS
    steps = [row["step"] for row in jsonl(run_dir / "metrics.jsonl") if "train_runtime" not in row]
    assert steps == list(range(1, MAX_STEPS + 1))  # every step logged once across the attempts
