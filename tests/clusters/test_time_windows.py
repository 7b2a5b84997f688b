"""pipeline.runtime.time_windows: which stage exits end a time window, the bound, and what the launcher does at the end of
one (``scontrol`` replaced by a stand-in that answers like Slurm 22.05; the real requeue runs in
tests/faults/test_slurm_warning.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.core.exit_codes import INPUT_ERROR_EXIT_CODE, PREEMPTED_EXIT_CODE
from pipeline.core.io import InputError
from pipeline.runtime.host_windows import shim_environment
from pipeline.runtime.settings import RUNTIME_VARIABLE
from pipeline.runtime.time_windows import (
    close_window,
    ends_window,
    may_requeue,
    time_window_bound,
)

from .conftest import REPO

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


STAGE_ENDING_A_WINDOW = """import signal, sys, time
signal.signal(signal.SIGUSR1, lambda *_: sys.exit(75))  # as training: checkpoint, then 75
print("ready", file=sys.stderr, flush=True)
time.sleep(120)
"""


def test_under_apptainer_the_host_side_requeues_the_window_the_container_ended(tmp_path: Path) -> None:
    """An Apptainer-style job: `apptainer` on PATH is the shim the Snakefile puts there inside a Slurm job
    (`shim_environment`); the real apptainer is a stand-in that runs the command with a PATH of its own, without
    the host's Slurm client (the image has none); inside, the launcher and a stage that exits 75 on SIGUSR1, which
    the test sends to the job's processes, as Slurm does (the jobstep's layers ignore it). The host side requeues
    with the host's scontrol (a stand-in answering as Slurm) and keeps the window's log. Broken by the Snakefile
    leaving PATH alone (the stand-in apptainer first): nothing is requeued, the launcher finding no scontrol."""
    host_bin, image_bin = tmp_path / "host-bin", tmp_path / "image-bin"
    host_bin.mkdir(), image_bin.mkdir()
    calls = tmp_path / "scontrol.calls"
    scontrol = f'#!/bin/sh\necho "$*" >> {calls}\n[ "$1" = show ] && echo "JobId=$3 Requeue=1 Restarts=0"\nexit 0\n'
    # exec [--options...] IMAGE COMMAND...: the shim adds --nv (pipeline.runtime.host_windows.with_gpus)
    apptainer = (
        f'#!/bin/sh\n[ "$1" = exec ] || exit 3\nshift\nwhile [ "${{1#-}}" != "$1" ]; do shift; done\nshift\n'
        f'exec /usr/bin/env PATH={image_bin} "$@"\n'
    )
    for name, script in (("scontrol", scontrol), ("apptainer", apptainer)):
        (host_bin / name).write_text(script)
        (host_bin / name).chmod(0o755)
    (tmp_path / "window_stage.py").write_text(STAGE_ENDING_A_WINDOW)
    log = tmp_path / "train.log"
    launch = f"exec {sys.executable} -m pipeline.launch --gpus 0 -- window_stage > {log} 2>&1"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
        **shim_environment({"PATH": f"{host_bin}{os.pathsep}/usr/bin{os.pathsep}/bin"}),
        **IN_SLURM,
    }
    job = subprocess.Popen(
        ["apptainer", "exec", "grail.sif", "/bin/sh", "-c", launch],
        env=env,
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGUSR1, signal.SIG_IGN),  # the jobstep's Snakemake ignores it
    )
    deadline = time.monotonic() + 60
    while "ready" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline and job.poll() is None, log.read_text() if log.exists() else "no log"
        time.sleep(0.2)
    os.killpg(job.pid, signal.SIGUSR1)
    _, host_side = job.communicate(timeout=60)
    assert job.returncode == PREEMPTED_EXIT_CODE, host_side
    assert calls.read_text().splitlines() == ["show job 41", "requeue 41"], host_side
    assert "requeued the job (`scontrol requeue`)" in host_side
    assert "the job's host side requeues it" in log.read_text()
    assert (tmp_path / "train.log.window1").read_text() == log.read_text()
    assert not any((tmp_path / ".snakemake" / "grail-time-windows").iterdir())  # the request is consumed
