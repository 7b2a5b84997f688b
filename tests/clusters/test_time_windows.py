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
    job_end_time,
    may_requeue,
    time_window_bound,
    warning_delay,
)

from .conftest import REPO

THREE_WINDOWS = {RUNTIME_VARIABLE: json.dumps({"time_windows": 3})}
IN_SLURM = {"SLURM_JOB_ID": "41", **THREE_WINDOWS}


class Scontrol:
    """Stands in for ``scontrol``: ``show job`` names ``restarts``; ``requeue`` exits ``requeue_status``."""

    def __init__(self, restarts: int = 0, requeue_status: int = 0, stderr: str = "") -> None:
        self.restarts, self.requeue_status, self.stderr, self.calls = restarts, requeue_status, stderr, []
        self.show_extra = ""

    def __call__(self, argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv[1:])
        if argv[1] == "show":
            shown = f"JobId={argv[3]} JobName=grail_x\n   Requeue=1 Restarts={self.restarts} BatchFlag=1\n"
            shown += f"   {self.show_extra}\n"
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
    assert ("requeueing the job" in line) == requeue and ("not requeued (no window left)" in line) == (not requeue)
    assert (tmp_path / f"seed0.log.window{window}").is_file() == requeue


def test_the_warning_counts_back_from_the_limit_slurm_names() -> None:
    """The end from Slurm's own variable, the host side's, else scontrol's EndTime (local time, as printed)."""
    shows_end = Scontrol()
    shows_end.show_extra = "StartTime=2026-12-06T18:00:00 EndTime=2026-12-06T19:00:00 Deadline=N/A"
    local_end = time.mktime(time.strptime("2026-12-06T19:00:00", "%Y-%m-%dT%H:%M:%S"))
    assert job_end_time(IN_SLURM, run=shows_end) == local_end
    assert job_end_time({**IN_SLURM, "SLURM_JOB_END_TIME": "1000"}, run=shows_end) == 1000
    assert job_end_time({**IN_SLURM, "GRAIL_JOB_END_TIME": "2000"}, run=shows_end) == 2000
    assert len(shows_end.calls) == 1  # the variables need no scontrol
    unlimited = Scontrol()
    unlimited.show_extra = "EndTime=Unknown"
    assert job_end_time(IN_SLURM, run=unlimited) is None
    assert job_end_time(THREE_WINDOWS, run=shows_end) is None  # not in a Slurm job

    in_job = {**IN_SLURM, "SLURM_JOB_END_TIME": "1000"}
    assert warning_delay(600, in_job, now=lambda: 100.0) == 300
    assert warning_delay(600, in_job, now=lambda: 900.0) == 0  # the moment has passed: warn at once
    assert warning_delay(0, in_job, now=lambda: 100.0) is None
    assert warning_delay(600, THREE_WINDOWS, now=lambda: 100.0) is None


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


STAGE_ENDING_A_WINDOW = """import sys, time
from pipeline.runtime.preemption import PreemptionSignals
signals = PreemptionSignals().install()  # as training: registered with a launcher that passes its warning on
print("ready", file=sys.stderr, flush=True)
while signals.received is None:
    time.sleep(0.05)
sys.exit(75)  # as training: checkpoint, then 75
"""


def start_apptainer_job(tmp_path: Path, launch_options: str = "", ends_in_s: int | None = None) -> subprocess.Popen:
    """An Apptainer-style job: `apptainer` on PATH is the shim the Snakefile puts there (`shim_environment`); the
    real apptainer is a stand-in that runs the command with a PATH of its own, without the host's Slurm client (the
    image has none); inside, the launcher and a stage that exits 75 on SIGUSR1. The host's scontrol is a stand-in
    answering as Slurm, with an EndTime ``ends_in_s`` from now (None: a job without a limit); it logs its calls
    to ``scontrol.calls``. The launcher's log is ``train.log``."""
    host_bin, image_bin = tmp_path / "host-bin", tmp_path / "image-bin"
    host_bin.mkdir(), image_bin.mkdir()
    end = (
        "Unknown" if ends_in_s is None else time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + ends_in_s))
    )
    scontrol = (
        f'#!/bin/sh\necho "$*" >> {tmp_path / "scontrol.calls"}\n'
        f'[ "$1" = show ] && echo "JobId=$3 Requeue=1 Restarts=0 EndTime={end}"\nexit 0\n'
    )
    # exec [--options...] IMAGE COMMAND...: the shim adds --nv (pipeline.runtime.host_windows.with_gpus)
    apptainer = (
        f'#!/bin/sh\n[ "$1" = exec ] || exit 3\nshift\nwhile [ "${{1#-}}" != "$1" ]; do shift; done\nshift\n'
        f'exec /usr/bin/env PATH={image_bin} "$@"\n'
    )
    for name, script in (("scontrol", scontrol), ("apptainer", apptainer)):
        (host_bin / name).write_text(script)
        (host_bin / name).chmod(0o755)
    (tmp_path / "window_stage.py").write_text(STAGE_ENDING_A_WINDOW)
    launch = f"exec {sys.executable} -m pipeline.launch --gpus 0 {launch_options} -- window_stage > {tmp_path / 'train.log'} 2>&1"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
        **shim_environment({"PATH": f"{host_bin}{os.pathsep}/usr/bin{os.pathsep}/bin"}),
        **IN_SLURM,
    }
    return subprocess.Popen(
        ["apptainer", "exec", "grail.sif", "/bin/sh", "-c", launch],
        env=env,
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGUSR1, signal.SIG_IGN),  # the jobstep's Snakemake ignores it
    )


def assert_the_host_side_requeued(tmp_path: Path, job: subprocess.Popen, host_side: str) -> None:
    """The window the container ended was requeued by the host's scontrol, its log kept, its request consumed."""
    log = (tmp_path / "train.log").read_text()
    assert job.returncode == PREEMPTED_EXIT_CODE, host_side + log
    # the shim asked for the job's end, then close_window for its restarts, then requeued
    assert (tmp_path / "scontrol.calls").read_text().splitlines() == ["show job 41"] * 2 + ["requeue 41"], host_side
    assert "requeueing the job (`scontrol requeue`)" in host_side
    assert "the job's host side requeues it" in log
    assert (tmp_path / "train.log.window1").read_text() == log
    assert not any((tmp_path / ".snakemake" / "grail-time-windows").iterdir())  # the request is consumed


def test_under_apptainer_the_host_side_requeues_the_window_the_container_ended(tmp_path: Path) -> None:
    """Slurm's own `--signal` warning, which the test sends to the job's processes, as Slurm does (the jobstep's
    layers ignore it), ends the container's window; the host side requeues it. Broken by the Snakefile leaving
    PATH alone (the stand-in apptainer first): nothing is requeued, the launcher finding no scontrol."""
    job = start_apptainer_job(tmp_path)
    log = tmp_path / "train.log"
    deadline = time.monotonic() + 60
    while "ready" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline and job.poll() is None, log.read_text() if log.exists() else "no log"
        time.sleep(0.2)
    os.killpg(job.pid, signal.SIGUSR1)
    _, host_side = job.communicate(timeout=60)
    assert_the_host_side_requeued(tmp_path, job, host_side)


def test_the_launcher_sends_the_warning_before_the_limit_the_host_side_names(tmp_path: Path) -> None:
    """No signal from outside: the launcher's `--time-limit-warning 100` in a job whose limit ends in 104 s
    warns the stage about 4 s from now, counting from the end the host side passed into the container (the image
    has no scontrol), and the window ends and requeues as under Slurm's `--signal`. Broken by the shim not passing
    the end: the launcher arms nothing and the stage waits until the test's timeout."""
    job = start_apptainer_job(tmp_path, "--time-limit-warning 100", ends_in_s=104)
    _, host_side = job.communicate(timeout=60)
    assert "pipeline.launch: the time-limit warning (SIGUSR1) comes in " in (tmp_path / "train.log").read_text()
    assert_the_host_side_requeued(tmp_path, job, host_side)
