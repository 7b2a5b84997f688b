"""Lock files that name their holder, and the study lock: one Snakemake controller per results_dir.

A lock is a file created exclusively (``O_EXCL``) holding its ``Holder`` as JSON: host, pid, Slurm job id, start
time and, for the study lock, the controller's invocation id (``pipeline.core.exit_codes.INVOCATION_VARIABLE``). A
second taker is refused and told the holder; a lock whose holder is gone (a dead pid on this host, a Slurm job on
another host that Slurm no longer runs, or an earlier run of this very Slurm job, requeued) is broken with a log line.
A holder on another host outside Slurm cannot be checked: its lock stays until it is removed by hand. Two layers take
such locks: training (``RUN_DIR/train.lock``, pipeline.training.run_state) and the study (pipeline.study.writers).

The study lock (``RESULTS_DIR/.study.lock``). Snakemake's own lock cannot keep two controllers off one results_dir:
Snakemake 9 removes the whole ``.snakemake/locks`` directory when any controller of the working directory ends
(``persistence._delete_locks``), the locks of other studies in that checkout included. So the controller takes the
study lock in its ``onstart`` hook (after the plan, before any job; never in a dry run), puts its path in the
environment (``STUDY_LOCK_VARIABLE``: local jobs inherit it, Slurm jobs through ``--export=ALL``) and gives it back
when it ends. A job runs and publishes only while the controller that started it holds the study
(``controller_problem``): a stage refuses before it reads anything (``pipeline.core.io.run_cli``,
``pipeline.launch``), and before each publish (``pipeline.core.orphans``), when its controller ended or was killed (its lock names a dead pid, or another controller broke it and holds the study), as a Slurm job queued
by a killed controller would. A stage run by hand, outside Snakemake, checks nothing.

No third-party imports.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.core.exit_codes import INVOCATION_VARIABLE

logger = logging.getLogger(__name__)

STUDY_LOCK_FILE = ".study.lock"
STUDY_LOCK_VARIABLE = "GRAIL_STUDY_LOCK"


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: where it was taken and by what (``invocation``: the Snakemake invocation of a controller)."""

    host: str
    pid: int
    slurm_job_id: str | None
    started: str
    invocation: str | None = None

    @classmethod
    def this_process(cls, invocation: str | None = None) -> Holder:
        started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        return cls(socket.gethostname(), os.getpid(), os.environ.get("SLURM_JOB_ID") or None, started, invocation)

    def describe(self) -> str:
        job = f", Slurm job {self.slurm_job_id}" if self.slurm_job_id else ""
        return f"pid {self.pid} on {self.host}{job}, since {self.started}"


def read_holder(lock: Path) -> Holder | None:
    """The holder a lock file names; None when it is absent or unreadable (a taker killed while writing it)."""
    try:
        record = json.loads(lock.read_text(encoding="utf-8"))
        return Holder(
            str(record["host"]),
            int(record["pid"]),
            record.get("slurm_job_id"),
            str(record["started"]),
            record.get("invocation"),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def slurm_job_running(job_id: str) -> bool | None:
    """Whether Slurm still runs (or is about to run) ``job_id``; None when Slurm cannot be asked."""
    try:
        result = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return False if "invalid job id" in result.stderr.lower() else None
    return result.stdout.strip() in {"RUNNING", "PENDING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED"}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def why_stale(holder: Holder | None, me: Holder) -> str | None:
    """Why the lock of ``holder`` may be broken by ``me``; None when its holder may still be working."""
    if holder is None:
        return "its lock file is unreadable"
    if holder.slurm_job_id and holder.slurm_job_id == me.slurm_job_id:
        return f"it is an earlier run of this Slurm job {me.slurm_job_id} (requeued)"
    if holder.host == me.host:  # the process table says more than the scheduler
        return None if pid_alive(holder.pid) else f"pid {holder.pid} is not running on {holder.host}"
    if holder.slurm_job_id and slurm_job_running(holder.slurm_job_id) is False:
        return f"Slurm job {holder.slurm_job_id} is no longer running"
    return None


def take_lock(lock: Path, me: Holder) -> Holder | None:
    """Create ``lock`` naming ``me``, breaking a stale one with a log line; None once taken, else the live holder."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    while True:
        try:
            descriptor = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = read_holder(lock)
            reason = why_stale(holder, me)
            if reason is None:
                return holder
            logger.warning("breaking the stale lock %s (%s): %s", lock, holder.describe() if holder else "?", reason)
            lock.unlink(missing_ok=True)
            continue
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(asdict(me), handle)
        return None


def release_lock(lock: Path, me: Holder) -> None:
    """Remove ``lock`` if it still names ``me`` (a lock broken and taken by another is left to it)."""
    if read_holder(lock) == me:
        lock.unlink(missing_ok=True)


def controller_problem(env: Mapping[str, str] = os.environ) -> str | None:
    """Why this process, a job of a Snakemake controller, must not run or publish: the controller that started it no
    longer holds its study (it ended, was killed, or another controller took the study). None while it holds it (a
    controller on another host is taken to), and for a process that is no controller's job (no study lock in
    ``env``: a stage run by hand)."""
    lock = env.get(STUDY_LOCK_VARIABLE)
    if not lock:
        return None
    holder = read_holder(Path(lock))
    me = Holder.this_process()
    if holder is None:
        why = "its controller ended, or its lock was removed"
    elif holder.invocation != env.get(INVOCATION_VARIABLE):
        state = "" if why_stale(holder, me) is None else ", which has ended"
        why = f"another controller holds it ({holder.describe()}{state})"
    elif holder.host == me.host and not pid_alive(holder.pid):
        why = f"its controller ({holder.describe()}) has ended"
    else:
        return None
    return (
        f"{lock}: this job's Snakemake controller no longer holds the study: {why}. Nothing is written: the"
        " controller that holds the study, or the next one, runs this job again (docs/usage.md, 'When Snakemake"
        " itself was killed')"
    )
