"""Other writers, refused when a controller starts: a Snakemake whose study another live controller holds
(``RESULTS_DIR/.study.lock``, pipeline.core.locks), or one of whose runs another process is training
(``RUN_DIR/train.lock``, pipeline.training.run_state), stops before its first job. Every run of the study is
checked, not only those the plan would train: a run being trained has no complete outputs, so the plan would train
it again, and the plan's jobs are Snakemake's internals.

Why before its first job: Snakemake removes a job's existing outputs and its log before the job runs, and removes
the outputs of a job that failed. A second controller (``--nolock``, or a controller restarted while the jobs of a
killed one still run) would schedule the run's train job again: its preparation removed the first writer's log
(the first writer then writes to a deleted file) and the failure of its stage, which finds the lock held and exits
2, removed what the first writer had published by then. The Snakefile calls ``hold_study`` and then
``refuse_busy_runs`` from its ``onstart`` hook (after the plan, before any job; never in a dry run), in the controller
only, and ``release_study`` from ``onsuccess`` and ``onerror``; an exit past them (an error in ``onstart``, Ctrl-C
before the scheduler runs) releases it too, and a killed controller's lock is broken by the next one.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Iterable
from pathlib import Path

from pipeline.core.exit_codes import INVOCATION_VARIABLE
from pipeline.core.io import InputError
from pipeline.core.locks import (
    STUDY_LOCK_FILE,
    STUDY_LOCK_VARIABLE,
    Holder,
    read_holder,
    release_lock,
    take_lock,
    why_stale,
)
from pipeline.training.run_state import LOCK_FILE

# The study lock this controller took (hold_study), given back by release_study.
HELD: list[tuple[Path, Holder]] = []


def runs_this_study(holder: Holder) -> str:
    """How a refusal names the live controller that holds a study's lock."""
    return f"another Snakemake controller runs this study ({holder.describe()})"


def hold_study(results_dir: str | Path) -> Path:
    """Take ``RESULTS_DIR/.study.lock`` for this controller until it ends, and put its path in the environment of
    the jobs it starts; InputError naming the live controller that holds it, and what to do."""
    lock = Path(results_dir).resolve() / STUDY_LOCK_FILE
    me = Holder.this_process(invocation=os.environ.get(INVOCATION_VARIABLE))
    if (holder := take_lock(lock, me)) is not None:
        raise InputError(
            f"{lock}: {runs_this_study(holder)}; two controllers on one"
            " results_dir would run the same jobs and delete each other's outputs. Wait for it to end, or stop it"
            f" (Ctrl-C in its terminal, or kill {holder.pid}), then start Snakemake again; a dry run (-n) works beside"
            " it (docs/usage.md)"
        )
    HELD.append((lock, me))
    atexit.register(release_study)
    os.environ[STUDY_LOCK_VARIABLE] = str(lock)
    return lock


def study_holder(results_dir: str | Path) -> str | None:
    """ "another Snakemake controller runs this study (HOLDER)" while a live controller other than this process
    holds ``RESULTS_DIR/.study.lock``; None otherwise (no lock, or a stale one)."""
    lock = Path(results_dir).resolve() / STUDY_LOCK_FILE
    if not lock.exists():
        return None
    holder = read_holder(lock)
    me = Holder.this_process()
    if holder is None or (holder.host, holder.pid) == (me.host, me.pid) or why_stale(holder, me) is not None:
        return None
    return runs_this_study(holder)


def release_study() -> None:
    """Give back the study lock this controller took (nothing when it took none, or gave it back already)."""
    while HELD:
        release_lock(*HELD.pop())


def busy_runs(run_dirs: Iterable[str | Path]) -> list[str]:
    """``"RUN_DIR (holder)"`` for each run directory whose train.lock a writer that may still be writing holds
    (``why_stale`` finds no reason to break it: a live pid on this host, a running Slurm job, another host)."""
    me = Holder.this_process()
    busy = []
    for run_dir in run_dirs:
        lock = Path(run_dir) / LOCK_FILE
        if not lock.exists():
            continue
        holder = read_holder(lock)
        if why_stale(holder, me) is None:
            busy.append(f"{run_dir} ({holder.describe()})")
    return busy


def refuse_busy_runs(run_dirs: Iterable[str | Path]) -> None:
    """InputError naming every run of ``run_dirs`` that another writer is training, and what to do."""
    if busy := busy_runs(run_dirs):
        raise InputError(
            "another writer is training run(s) of this study: "
            + "; ".join(busy)
            + ". Running them again now would delete that writer's log and outputs. Wait for it, or stop it (a"
            " job of a killed Snakemake: kill the pid, or scancel the Slurm job), then start Snakemake again;"
            " --nolock is unsafe while another Snakemake runs in this directory (docs/usage.md)"
        )
