"""The stall watchdog (pipeline.runtime.watchdog) on a real two-process training run (``pipeline.launch --gpus 2``: DDP
over gloo on two CPU processes): rank 1 is held inside step 3 (``tests.hold_stage``), outside any collective, as a
hung file read or an engine that stops answering would hold it; rank 0 goes on until it waits for rank 1 in one.
Each rank's watchdog sees no progress for longer than its bound (a floor of a few seconds here); the run must end
with ``STALL_EXIT_CODE`` through the launcher, the log naming rank 1 and step 3 and holding the stalled thread's
stack, and no process of the run may be left behind.

Here both ranks' watchdogs fire (rank 0's stack shows it waiting in TRL's all_gather); which fires first is a matter
of milliseconds, so only rank 1's report is asserted, and the launcher passes the stall code on either way
(tests/clusters/test_launch.py). Checked by breaking it: with the rank fixed at 0 (not read from ``RANK``) the
message names rank 0 and the test fails; with the thread never reporting, the held rank waits out the hook's 150 s
limit and the run ends with status 1."""

from __future__ import annotations

import json

import psutil
import pytest
from train_support import launch_two, run_train, train_command

from pipeline.core.exit_codes import STALL_EXIT_CODE
from pipeline.runtime.settings import RUNTIME_VARIABLE
from tests.hold_stage import stall_exit_bound, stall_training_env

pytestmark = pytest.mark.slow
# A floor far above a tiny step (well under a second) and the save of its checkpoint-2, even on a loaded machine
WATCHDOG = {"stall_floor_s": 10, "stall_multiple": 5, "first_step_s": 120}


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Processes whose command line contains ``text``."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(text in part for part in process.info["cmdline"] or ()):
            found.append(process)
    return found


def test_a_rank_held_mid_step_stops_the_run_with_the_stall_code(model_dir, train_jsonl, tmp_path) -> None:
    run_dir = tmp_path / "run"
    train = train_command(model_dir, train_jsonl, run_dir)
    runtime = {
        RUNTIME_VARIABLE: json.dumps({"watchdog": WATCHDOG})
    }  # the run-time settings (pipeline.runtime.settings)
    result = run_train(launch_two(train), stall_training_env(rank=1, step=3), runtime, timeout=240)
    log = result.stderr
    assert result.returncode == STALL_EXIT_CODE, log[-3000:]
    assert "test hook: holding rank 1 inside training step 3 until killed" in log
    assert "stall watchdog: rank 1: no progress in training step 3 for " in log, log[-3000:]
    assert (stall_exit_bound(log) or 0) >= WATCHDOG["stall_floor_s"], log[-3000:]
    # faulthandler's dump of the held thread: its frames down to the hook's wait
    assert "Current thread 0x" in log or "Thread 0x" in log
    assert "in hold_until" in log and "in on_step_begin_then_hold" in log
    assert f"exiting {STALL_EXIT_CODE}" in log.split("pipeline.launch:")[-1]
    assert processes_mentioning(str(run_dir)) == []
    # the stall left the last checkpoint for the rerun to resume from
    assert (run_dir / "checkpoints" / "checkpoint-2").is_dir() and not (run_dir / "final").exists()
