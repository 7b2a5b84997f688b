"""Another writer's runs, refused when a controller starts: a Snakemake that would train a run that another process
is training (``RUN_DIR/train.lock``, pipeline.training.run_state) stops before its first job.

Why before its first job: Snakemake removes a job's existing outputs and its log before the job runs, and removes
the outputs of a job that failed. A second controller (``--nolock``, or a controller restarted while the jobs of a
killed one still run) would schedule the run's train job again: its preparation removed the first writer's log
(the first writer then writes to a deleted file) and the failure of its stage, which finds the lock held and exits
2, removed what the first writer had published by then. The Snakefile calls ``refuse_busy_runs`` from its
``onstart`` hook (after the plan, before any job; never in a dry run), in the controller only.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pipeline.core.io import InputError
from pipeline.training.run_state import LOCK_FILE, Holder, read_holder, why_stale


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
            "another writer is training run(s) this Snakemake would train: "
            + "; ".join(busy)
            + ". Running them again now would delete that writer's log and outputs. Wait for it, or stop it (a"
            " job of a killed Snakemake: kill the pid, or scancel the Slurm job), then start Snakemake again;"
            " --nolock is unsafe while another Snakemake runs in this directory (docs/usage.md)"
        )
