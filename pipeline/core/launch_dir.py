"""The per-launch directory between ``pipeline.launch`` and the stage processes it supervises (no third-party
imports; every stage's ``run_cli`` records its exit status here, so this is kept apart from the signal handling of
pipeline.runtime.preemption, which only the launcher and training use).

Under a supervising launcher (``pipeline.launch`` in its multi-process modes stays the parent of ``accelerate
launch``, whose torch elastic agent reports any failed worker as status 1) a stage process talks to the launcher
through the per-launch directory named by ``LAUNCH_DIR_VARIABLE``, one file per local rank: ``pid-rank<i>``
(written once its handlers are installed: the launcher forwards SIGTERM and SIGUSR1 to it) and ``exit-rank<i>``
(its exit status, which the launcher passes on when every rank reports the same one). A signal the launcher got
before a process registered is in the directory's ``signal`` file, which the process reads when it registers.
"""

from __future__ import annotations

import os
from pathlib import Path

LAUNCH_DIR_VARIABLE = "GRAIL_LAUNCH_DIR"
SIGNAL_FILE = "signal"


def launch_file(kind: str, local_rank: str | None = None) -> Path | None:
    """``<launch dir>/<kind>-rank<local rank>`` under a supervising launcher, None otherwise."""
    directory = os.environ.get(LAUNCH_DIR_VARIABLE)
    if not directory:
        return None
    rank = local_rank if local_rank is not None else os.environ.get("LOCAL_RANK", "0")
    return Path(directory) / f"{kind}-rank{rank}"


def write_small_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a reader never sees a partial file)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def record_exit_status(status: int) -> None:
    """Tell a supervising launcher this process's exit status (no-op without one)."""
    path = launch_file("exit")
    if path is not None:
        write_small_file(path, str(status))
