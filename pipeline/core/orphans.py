"""A stage that outlives its Snakemake job's wrapper never publishes.

Snakemake runs a job's stage under a wrapper: the job's shell (``bash -c``; were it to exec the stage, the Snakemake
process that runs the job). Once the wrapper or the controller is killed the job counts as failed, or its controller
is gone, and the next plan runs it again; a stage left running would go on and later publish an output that the plan
accepts, beside or over the rerun's. So in a Snakemake job (``INVOCATION_VARIABLE`` in the
environment; a stage run by hand is left alone, ``nohup`` included):

- ``die_with_parent``: at stage start (``pipeline.core.io.run_cli``, ``pipeline.launch``) the stage asks the kernel to
  send it SIGTERM when its parent ends (Linux ``prctl(PR_SET_PDEATHSIG)``; elsewhere nothing). A plain stage ends at
  once; the launcher and training stop as after any SIGTERM (a checkpoint, exit 75, nothing published). SIGTERM, not
  SIGKILL: the launcher passes it on to the ranks of a multi-process run, whose parent is torch's elastic agent (so
  they also die with it).
- ``publish_problem``: the publish step (``pipeline.core.io``'s atomic outputs and ``publish_directory``) asks, before
  its rename, whether the stage's parent is still the one it started under (recorded by ``remember_parent`` when the
  ``pipeline`` package is imported, before the stage's imports of seconds: a parent that died before the prctl took
  effect is caught) and whether the controller that started the job still holds the study (``pipeline.core.locks``:
  a killed controller whose job's shell lives on, as bash does when the stage is not its last command).

No third-party imports: the ``pipeline`` package calls ``remember_parent`` first thing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

from pipeline.core.exit_codes import INVOCATION_VARIABLE
from pipeline.core.locks import controller_problem

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
DEATH_SIGNAL = signal.SIGTERM

# The parent this process started under (remember_parent), None before the pipeline package is imported.
started_under: int | None = None


class OrphanedStageError(RuntimeError):
    """A stage of a Snakemake job was about to publish an output after its wrapper or its controller was gone."""


def remember_parent() -> None:
    """Record the parent this process started under (once: the first import of the ``pipeline`` package)."""
    global started_under
    if started_under is None:
        started_under = os.getppid()


def in_snakemake_job(env: Mapping[str, str]) -> bool:
    return bool(env.get(INVOCATION_VARIABLE))


def die_with_parent(env: Mapping[str, str] = os.environ) -> None:
    """In a Snakemake job on Linux, end with ``DEATH_SIGNAL`` when the parent ends; exit at once when it has ended
    already (before the request took effect)."""
    if not in_snakemake_job(env) or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(DEATH_SIGNAL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if started_under is not None and os.getppid() != started_under:
        raise SystemExit(f"the parent this stage started under (pid {started_under}) has ended: not running on")


def publish_problem(env: Mapping[str, str] = os.environ) -> str | None:
    """Why this process, a stage of a Snakemake job, must not publish now; None when it may (or is no job's)."""
    if not in_snakemake_job(env):
        return None
    if started_under is not None and os.getppid() != started_under:
        return f"the job's wrapper (pid {started_under}, the parent this stage started under) has ended"
    return controller_problem(env)


def refuse_orphan_publish(target: Path) -> None:
    """OrphanedStageError naming ``target`` when this stage must not publish it (``publish_problem``)."""
    if problem := publish_problem():
        raise OrphanedStageError(f"{target}: not published: {problem}")
