"""Preemption signals: Slurm's time-limit warning (SIGUSR1, from ``--signal=USR1@<seconds>``) and SIGTERM.

A stage that can checkpoint (training) records them and stops at its next step boundary with
``PREEMPTED_EXIT_CODE``; the launcher records them until it hands over, and exits with the same code when one came
first (nothing started yet). Light on purpose: no third-party imports, so it is installed before torch loads.

Under a supervising launcher (``pipeline.launch`` in its multi-process modes stays the parent of ``accelerate
launch``, whose torch elastic agent reports any failed worker as status 1) a stage process talks to the launcher
through the per-launch directory named by ``LAUNCH_DIR_VARIABLE``, one file per local rank: ``pid-rank<i>``
(written once its handlers are installed: the launcher forwards SIGTERM and SIGUSR1 to it) and ``exit-rank<i>``
(its exit status, which the launcher passes on when every rank reports the same one). A signal the launcher got
before a process registered is in the directory's ``signal`` file, which the process reads when it registers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from pathlib import Path
from types import FrameType
from typing import Any

PREEMPTED_EXIT_CODE = 75  # sysexits.h EX_TEMPFAIL: "temporary failure, try again" (checkpoint saved, rerun resumes)
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
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


@dataclasses.dataclass
class PreemptionSignals:
    """Handlers for ``PREEMPTION_SIGNALS`` that only record the signal (the run stops at a step boundary)."""

    received: int | None = None
    previous: dict[int, Any] = dataclasses.field(default_factory=dict)

    def record(self, signum: int, _frame: FrameType | None) -> None:
        """Signal handler: only remember the request (logging here could deadlock)."""
        self.received = signum

    def install(self) -> PreemptionSignals:
        """Record the signals from now on; under a supervising launcher, register for the ones it forwards."""
        for signum in PREEMPTION_SIGNALS:
            self.previous[signum] = signal.signal(signum, self.record)
        self.register_with_launcher()
        return self

    def register_with_launcher(self) -> None:
        """Write this process's pid for the launcher, then take a signal it got before (the launcher writes the
        ``signal`` file before it reads the pids: a signal is either forwarded here or found in the file)."""
        pid_file = launch_file("pid")
        if pid_file is None:
            return
        write_small_file(pid_file, str(os.getpid()))
        with contextlib.suppress(FileNotFoundError):
            self.received = int((pid_file.parent / SIGNAL_FILE).read_text(encoding="utf-8"))

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous.clear()

    def received_name(self) -> str:
        """The signal received, for the log (in a multi-process run, possibly only another process received one)."""
        return signal.Signals(self.received).name if self.received is not None else "a signal elsewhere"
