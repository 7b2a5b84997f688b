"""pipeline.runtime.time_windows: which stage exits end a time window, the bound, and what the launcher does at the end of
one (``scontrol`` replaced by a stand-in that answers like Slurm 22.05; the real requeue runs in
tests/faults/test_slurm_warning.py)."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from pipeline.core.exit_codes import INPUT_ERROR_EXIT_CODE, PREEMPTED_EXIT_CODE
from pipeline.core.io import InputError
from pipeline.runtime.settings import RUNTIME_VARIABLE
from pipeline.runtime.time_windows import (
    close_window,
    ends_window,
    may_requeue,
    time_window_bound,
)

THREE_WINDOWS = {RUNTIME_VARIABLE: json.dumps({"time_windows": 3})}
IN_SLURM = {"SLURM_JOB_ID": "41", **THREE_WINDOWS}


class Scontrol:
    """Stands in for ``scontrol``: ``show job`` names ``restarts``; ``requeue`` exits ``requeue_status``."""

    def __init__(self, restarts: int = 0, requeue_status: int = 0, stderr: str = "") -> None:
        self.restarts, self.requeue_status, self.stderr, self.calls = restarts, requeue_status, stderr, []

    def __call__(self, argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv[1:])
        if argv[1] == "show":
            shown = f"JobId={argv[3]} JobName=grail_x\n   Requeue=1 Restarts={self.restarts} BatchFlag=1\n"
            return subprocess.CompletedProcess(argv, 0, shown, "")
        return subprocess.CompletedProcess(argv, self.requeue_status, "", self.stderr)


def test_only_the_warning_ending_in_75_inside_slurm_ends_a_window() -> None:
    assert ends_window(PREEMPTED_EXIT_CODE, signal.SIGUSR1, IN_SLURM)
    assert not ends_window(PREEMPTED_EXIT_CODE, signal.SIGTERM, IN_SLURM)  # preempted or cancelled: Slurm's call
    assert not ends_window(PREEMPTED_EXIT_CODE, None, IN_SLURM)
    assert not ends_window(INPUT_ERROR_EXIT_CODE, signal.SIGUSR1, IN_SLURM)
    assert not ends_window(PREEMPTED_EXIT_CODE, signal.SIGUSR1, THREE_WINDOWS)  # not in Slurm


@pytest.mark.parametrize(("restarts", "requeue"), [(0, True), (1, True), (2, False), (5, False)])
def test_the_job_requeues_until_its_last_window(tmp_path: Path, capsys, restarts: int, requeue: bool) -> None:
    log = tmp_path / "seed0.log"
    log.write_text("step 3 saved\n")
    scontrol = Scontrol(restarts)
    assert close_window(PREEMPTED_EXIT_CODE, signal.SIGUSR1, IN_SLURM, log, run=scontrol) == requeue
    window = restarts + 1
    line = capsys.readouterr().err
    assert line.startswith(f"pipeline.launch: time window {window} of at most 3 (time_windows) of Slurm job 41 ended")
    assert scontrol.calls == [["show", "job", "41"]] + ([["requeue", "41"]] if requeue else [])
    assert ("requeued the job" in line) == requeue and ("not requeued (no window left)" in line) == (not requeue)
    assert (tmp_path / f"seed0.log.window{window}").is_file() == requeue


def test_a_refused_requeue_is_logged(capsys) -> None:
    scontrol = Scontrol(0, 1, "scontrol: error: Requested operation is presently disabled for job 41\n")
    assert not close_window(PREEMPTED_EXIT_CODE, signal.SIGUSR1, IN_SLURM, run=scontrol)
    assert "not requeued (scontrol: error: Requested operation is presently disabled" in capsys.readouterr().err


def test_any_other_end_passes_silently(capsys) -> None:
    scontrol = Scontrol()
    assert not close_window(0, signal.SIGUSR1, IN_SLURM, run=scontrol)
    assert not close_window(PREEMPTED_EXIT_CODE, signal.SIGTERM, IN_SLURM, run=scontrol)
    assert scontrol.calls == [] and capsys.readouterr().err == ""


def test_the_bound() -> None:
    assert time_window_bound({}) == 1 and not may_requeue({"SLURM_JOB_ID": "41"})  # unset: off
    assert may_requeue(IN_SLURM) and not may_requeue(THREE_WINDOWS)
    assert not may_requeue({"SLURM_JOB_ID": "41", RUNTIME_VARIABLE: json.dumps({"time_windows": 1})})
    for bad in ('{"time_windows": 0}', '{"time_windows": "x"}', '{"time_windows": -2}', "not json"):
        with pytest.raises(InputError, match=RUNTIME_VARIABLE):
            time_window_bound({RUNTIME_VARIABLE: bad})
