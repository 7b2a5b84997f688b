"""The stall watchdog's parts (pipeline.runtime.watchdog): the bound, the heartbeat against a fake clock, the thread (with
the process exit replaced by a recorder) and its settings. The real exits are tests/train/test_stall_watchdog.py
and tests/evaluate/test_evaluate_stall.py.

Checked by breaking it: with the median replaced by the mean, the slow-outlier property fails; with ``first_step_s``
ignored (the floor used before any step), the first-step test fails; with ``check`` comparing against the bound
with ``>=`` of the durations' minimum, the heartbeat test fails; with ``stop_process`` printing the line and letting
faulthandler write the stacks straight to stderr, the two processes' reports interleave and the last test fails."""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.exit_codes import STALL_EXIT_CODE
from pipeline.core.io import InputError
from pipeline.core.repo import REPO_DIR
from pipeline.runtime.settings import RUNTIME_VARIABLE, RuntimeSettings
from pipeline.runtime.watchdog import StallWatchdog, WatchdogConfig, stall_bound

CONFIG = WatchdogConfig(stall_multiple=5, stall_floor_s=10, first_step_s=100)
durations = st.lists(st.floats(min_value=0.001, max_value=1e5), min_size=1, max_size=50)


def test_before_any_step_the_bound_is_the_first_step_allowance():
    assert stall_bound([], CONFIG) == 100
    assert stall_bound([], WatchdogConfig(stall_floor_s=10, first_step_s=5)) == 5


@given(durations)
def test_the_bound_is_the_floor_or_the_multiple_of_the_median(steps):
    bound = stall_bound(steps, CONFIG)
    assert bound == max(10, 5 * statistics.median(steps))
    assert bound >= 10


@given(durations, st.floats(min_value=1.0, max_value=1e3))
def test_the_bound_scales_with_the_pace_of_the_run(steps, factor):
    assert stall_bound([factor * step for step in steps], CONFIG) >= stall_bound(steps, CONFIG)


@given(st.lists(st.floats(min_value=1, max_value=100), min_size=5, max_size=50))
def test_a_few_slow_steps_do_not_move_the_bound(steps):
    """Fewer than half the steps 1000 x slower (a checkpoint save, long completions) leave the median where it was."""
    slow = sorted(steps)[: (len(steps) - 1) // 2]
    bound = stall_bound([*steps, *(1000 * step for step in slow)], CONFIG)
    assert bound <= max(10, 5 * max(steps))


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_heartbeat_names_the_stalled_unit_and_the_rank():
    clock = FakeClock()
    watchdog = StallWatchdog(CONFIG, rank=3, clock=clock)
    watchdog.begin("training step 1")
    clock.now = 99.0
    assert watchdog.check() is None  # the first step's allowance: 100 s
    watchdog.end("the gap after training step 1")
    watchdog.begin("training step 2")
    clock.now += 10.0
    assert watchdog.check() is None  # bound max(10, 5 x 99) = 495 s
    watchdog.end("the gap after training step 2")  # durations 99 and 10: median 54.5, bound 272.5 s
    clock.now += 272.0
    assert watchdog.check() is None
    clock.now += 1.0
    message = watchdog.check()
    assert message == (
        "stall watchdog: rank 3: no progress in the gap after training step 2 for 273.0 s (bound 272.5 s): "
        f"thread stacks follow; exiting {STALL_EXIT_CODE} (retryable)"
    )


def test_the_thread_reports_a_stall_once_and_a_disabled_watchdog_starts_none():
    stalls: list[str] = []
    reported = threading.Event()

    def record(message: str) -> None:
        stalls.append(message)
        reported.set()

    quick = WatchdogConfig(stall_floor_s=0.05, first_step_s=0.2)
    watchdog = StallWatchdog(quick, rank=0, on_stall=record).start("evaluation batch 1 of 2")
    assert reported.wait(timeout=30)
    watchdog.stop()
    assert len(stalls) == 1 and "no progress in evaluation batch 1 of 2 for " in stalls[0]
    off = StallWatchdog(WatchdogConfig(enabled=False, first_step_s=0.01), on_stall=record).start("step 1")
    assert off.thread is None
    off.stop()


def test_the_rank_comes_from_the_launchers_environment(monkeypatch):
    monkeypatch.setenv("RANK", "5")
    assert StallWatchdog(CONFIG).rank == 5
    monkeypatch.delenv("RANK")
    assert StallWatchdog(CONFIG).rank == 0


def watchdog_from_environment(watchdog: str) -> WatchdogConfig:
    """The watchdog of a job whose run-time settings (pipeline.runtime.settings) hold ``watchdog`` (JSON)."""
    return RuntimeSettings.current({RUNTIME_VARIABLE: f'{{"watchdog": {watchdog}}}'}).watchdog


def test_settings_are_checked_by_name():
    assert watchdog_from_environment('{"stall_floor_s": 3, "enabled": false}') == WatchdogConfig(
        enabled=False, stall_floor_s=3.0
    )
    with pytest.raises(InputError, match="unknown key"):
        watchdog_from_environment('{"floor": 3}')
    with pytest.raises(InputError, match="stall_multiple"):
        watchdog_from_environment('{"stall_multiple": "ten"}')
    with pytest.raises(InputError, match=r"stall_multiple: invalid value 0\.5"):
        watchdog_from_environment('{"stall_multiple": 0.5}')
    with pytest.raises(InputError, match=r"stall_floor_s: invalid value 0\.0"):
        watchdog_from_environment('{"stall_floor_s": 0}')
    assert RuntimeSettings.current({}).watchdog == WatchdogConfig()  # a stage run on its own: the defaults


# A process with three threads 40 frames deep that stops itself as its watchdog would, at the wall-clock time argv[1]
STALLING_PROCESS = """
import sys, threading, time
from pipeline.runtime.watchdog import stop_process

release = threading.Event()


def nest(depth):
    return nest(depth - 1) if depth else release.wait()


for _ in range(3):
    threading.Thread(target=nest, args=(40,), daemon=True).start()
start = float(sys.argv[1])
while time.time() < start:
    pass
stop_process(f"stall watchdog: {__file__}: thread stacks follow")
"""
FAULTHANDLER_LINE = re.compile(
    r'(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):|  File ".+", line \d+ in \S+|  \.\.\.|'
)


def test_ranks_that_stall_at_once_write_whole_reports_to_their_shared_log(tmp_path):
    """Two processes stop at the same instant with their stderr on one pipe (the ranks of a run in one job log):
    each report comes out in one piece, its line and then its own frames only."""
    scripts = [tmp_path / f"rank_{rank}.py" for rank in (0, 1)]
    for script in scripts:
        script.write_text(STALLING_PROCESS)
    start = time.time() + 3
    log_read, log_write = os.pipe()
    environment = {**os.environ, "PYTHONPATH": str(REPO_DIR)}
    processes = [
        subprocess.Popen([sys.executable, str(script), str(start)], stderr=log_write, env=environment)
        for script in scripts
    ]
    os.close(log_write)
    with os.fdopen(log_read) as log_stream:
        log = log_stream.read()
    assert [process.wait(timeout=60) for process in processes] == [STALL_EXIT_CODE, STALL_EXIT_CODE]
    reports = re.split(r"^(?=stall watchdog: )", log, flags=re.MULTILINE)[1:]
    assert len(reports) == 2 and "".join(reports) == log, log
    for report in reports:
        heading, *lines = report.splitlines()
        own = next(script for script in scripts if str(script) in heading)
        other = next(script for script in scripts if script != own)
        assert [line for line in lines if not FAULTHANDLER_LINE.fullmatch(line)] == [], report
        assert sum(f'File "{own}"' in line and line.endswith(" in nest") for line in lines) >= 3 * 40
        assert str(other) not in report
