"""Time windows: a training job stopped by Slurm's time-limit warning requeues itself instead of failing.

Training is warned before its time limit (SIGUSR1, ``resources.train.time_limit_warning_s``: 600 s in
configs/paper.yaml; the lead a calibration measured where there is one: pipeline.study.calibration.warning_lead);
the stage saves a checkpoint and exits ``PREEMPTED_EXIT_CODE`` (75). The launcher sends the warning itself
(``warning_delay``, ``arm_warning``): it asks Slurm when the job's limit ends (``job_end_time``) and signals
``lead`` seconds before, so the warning needs no sbatch flag and a site's ``slurm_extra`` (which replaces the
study's, as Snakemake's ``--set-resources`` does) cannot drop it. A ``--signal=USR1@N`` in ``slurm_extra`` still
works the same way from Slurm's side. Passed up as it is, Snakemake counts that as a failure: a run
that needs more time limits than `retries` allows never finishes, and each one costs a retry that a real failure
may need. Instead, inside a Slurm job, ``pipeline.launch`` asks Slurm to requeue the job (``scontrol requeue``, the
pattern of PyTorch Lightning's and submitit's Slurm support): the job keeps its id, goes back to the queue, and its
next run (the next window) runs the same Snakemake job again, which resumes from the checkpoint. Snakemake's Slurm
executor counts a requeued job (REQUEUED, PENDING, RUNNING) as still active, so it never sees a failure.

The bound: the study's ``time_windows`` (a run-time setting: pipeline.runtime.settings, read by the launcher)
is the most windows one Slurm job may use, the first included; Slurm counts the job's restarts (``Restarts`` of
``scontrol show job``; a requeue after a preemption or node failure counts too). The warning that ends the last
window is passed up as exit 75: Snakemake's retry (a new Slurm job, the same time limit) gets the same number
of windows again, so a run gets at most ``time_windows x (retries + 1)`` windows in all. 1 turns requeueing off.

Inside any Slurm job: a study whose controller runs with local jobs inside one Slurm allocation requeues that
allocation's job (its script starts again; `--rerun-incomplete` resumes), where the job may be requeued.

Only the warning requeues: a SIGTERM (preemption, where Slurm requeues the job itself under ``--requeue``; a
cancelled job; the time limit itself) leaves the job to Slurm. A job that cannot be requeued (``--no-requeue``,
or ``JobRequeue=0`` without ``--requeue``) passes exit 75 up, as before.

Logs: each window's run of the rule truncates the rule's log (`> {log}`); the launcher copies the log of a window
it requeues to ``<log>.window<N>``, so the log of every window is kept.

Under Apptainer (``--sdm apptainer``) the image has no Slurm client: the job's host side requeues instead
(pipeline.runtime.host_windows, around the ``apptainer`` that runs the job). It names a file in
``WINDOW_REQUEST_VARIABLE``; a launcher that finds it there writes its log's path into that file at the end of a
window instead of calling ``scontrol``, and exits 75 as ever.

Slurm holds a requeued job before it starts again (``BeginTime``, about two minutes on the local test cluster: the
lifetime of the first run's credential); ``scontrol update JobId=<id> StartTime=now+2`` lifts it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path

from pipeline.core.exit_codes import PREEMPTED_EXIT_CODE
from pipeline.core.launch_dir import write_small_file
from pipeline.runtime.settings import RuntimeSettings

SCONTROL_TIMEOUT_S = 60
WINDOW_REQUEST_VARIABLE = "GRAIL_WINDOW_REQUEST"  # set by the host side under Apptainer (module docstring)
# Where the job's limit ends (epoch seconds): Slurm's own variable (Slurm 23.02 and later), then the one the host side
# sets under Apptainer, whose image has no Slurm client to ask.
JOB_END_VARIABLES = ("SLURM_JOB_END_TIME", "GRAIL_JOB_END_TIME")


def time_window_bound(env: Mapping[str, str]) -> int:
    """The most windows a Slurm job may use: the job's run-time ``time_windows`` (pipeline.runtime.settings; none
    set: 1, no requeue)."""
    return RuntimeSettings.current(env).time_windows


def may_requeue(env: Mapping[str, str]) -> bool:
    """Whether a launch can end a time window by requeueing: inside a Slurm job, with more than one window."""
    return bool(env.get("SLURM_JOB_ID")) and time_window_bound(env) > 1


def ends_window(status: int, last_signal: int | None, env: Mapping[str, str]) -> bool:
    """Whether a launch ending with ``status`` closed a time window: the stage stopped with ``PREEMPTED_EXIT_CODE``
    after the launcher's last signal, SIGUSR1 (the warning), inside a Slurm job."""
    return status == PREEMPTED_EXIT_CODE and last_signal == signal.SIGUSR1 and bool(env.get("SLURM_JOB_ID"))


def job_end_time(
    env: Mapping[str, str], run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run
) -> float | None:
    """When the Slurm job's time limit ends, in epoch seconds: ``JOB_END_VARIABLES``, else the ``EndTime`` of
    ``scontrol show job`` (local time, as scontrol prints it); None outside a Slurm job, without a limit, or when
    Slurm cannot be asked."""
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        return None
    for variable in JOB_END_VARIABLES:
        if value := env.get(variable, "").strip():
            return float(value)
    _, shown = scontrol(["show", "job", job_id], run)
    match = re.search(r"\bEndTime=(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)", shown)
    return datetime.fromisoformat(match.group(1)).timestamp() if match else None


def warning_delay(
    lead_s: int,
    env: Mapping[str, str],
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
    now: Callable[[], float] = time.time,
) -> float | None:
    """Seconds from now until the time-limit warning, ``lead_s`` before the job's limit ends (0 when that moment
    has passed); None without a lead or outside a Slurm job with a known limit."""
    if lead_s <= 0:
        return None
    end = job_end_time(env, run)
    return None if end is None else max(0.0, end - lead_s - now())


def arm_warning(delay_s: float) -> threading.Timer:
    """Send this process SIGUSR1 in ``delay_s`` seconds: its preemption handler records it as it records Slurm's
    ``--signal`` warning, and passes it to the stage processes (pipeline.runtime.supervision)."""
    timer = threading.Timer(delay_s, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.daemon = True
    timer.start()
    return timer


def scontrol(arguments: list[str], run: Callable[..., subprocess.CompletedProcess[str]]) -> tuple[str | None, str]:
    """``scontrol ARGUMENTS``: (None, its output) when it succeeded, else (why not, "")."""
    try:
        result = run(["scontrol", *arguments], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error), ""
    if result.returncode != 0:
        return (result.stderr or result.stdout).strip() or f"scontrol exited {result.returncode}", ""
    return None, result.stdout


def job_restarts(show_job: str) -> int | None:
    """The ``Restarts=N`` of ``scontrol show job`` output (the job's requeues so far), None when absent.

    The controller is asked: ``SLURM_RESTART_COUNT``, set in the batch script, did not reach the job step that
    Snakemake's jobstep starts the rule in with ``srun`` (Slurm 22.05 here)."""
    match = re.search(r"\bRestarts=(\d+)", show_job)
    return int(match.group(1)) if match else None


def window_log(log: Path, window: int) -> Path:
    """Where window ``window``'s copy of the rule's ``log`` is kept (the next window's run truncates the log)."""
    return log.with_name(f"{log.name}.window{window}")


def window_to_requeue(
    job_id: str, bound: int, run: Callable[..., subprocess.CompletedProcess[str]]
) -> tuple[int | None, str | None]:
    """(This window's number when known, why the job is not to be requeued: None when another window is left)."""
    error, shown = scontrol(["show", "job", job_id], run)
    restarts = job_restarts(shown)
    if error is not None or restarts is None:
        return None, error or "`scontrol show job` named no Restarts: the window count is unknown"
    if restarts + 1 >= bound:
        return restarts + 1, "no window left"
    return restarts + 1, None


def close_window(
    status: int,
    last_signal: int | None,
    env: Mapping[str, str],
    log: Path | None = None,
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
) -> bool:
    """After the stage ended with ``status``: when the warning closed a window and another is left, say so on stderr,
    copy the window's ``log`` (the rule's, when known) to ``window_log`` and requeue the Slurm job; whether the job
    was requeued. A window that ended otherwise is named on stderr; any other end passes silently.

    Under Apptainer's host side (``WINDOW_REQUEST_VARIABLE`` set) it only writes the log's path for that side,
    which requeues. The launcher exits with the stage's 75 either way: after a requeue Slurm ends the job's processes at once (the
    layers above may report the exit before that, to a job already back in the queue), and without one Snakemake
    sees the 75 as before.
    """
    if not ends_window(status, last_signal, env):
        return False
    job_id, bound = env["SLURM_JOB_ID"], time_window_bound(env)
    if request := env.get(WINDOW_REQUEST_VARIABLE):
        write_small_file(Path(request), str(log or ""))
        print(
            f"pipeline.launch: a time window of Slurm job {job_id} ended on the time-limit warning: the job's host "
            f"side requeues it (this image has no Slurm client); exiting {status}",
            file=sys.stderr,
            flush=True,
        )
        return False
    window, why_not = window_to_requeue(job_id, bound, run)
    ended = f"time window {window or '?'} of at most {bound} (time_windows) of Slurm job {job_id} ended on the time-limit warning"
    if why_not is None and window is not None:
        # the log is kept before the requeue: Slurm ends the job's processes as soon as the job is requeued
        kept = f"; this window's log is kept as {window_log(log, window)}" if log is not None else ""
        print(f"pipeline.launch: {ended}: requeueing the job (`scontrol requeue`){kept}", file=sys.stderr, flush=True)
        if log is not None:
            shutil.copyfile(log, window_log(log, window))
        why_not = scontrol(["requeue", job_id], run)[0]
        if why_not is None:
            return True
    print(f"pipeline.launch: {ended}, not requeued ({why_not}): exiting {status}", file=sys.stderr, flush=True)
    return False
