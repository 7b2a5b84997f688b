"""Preemption signals: Slurm's time-limit warning (SIGUSR1, from ``--signal=USR1@<seconds>``) and SIGTERM.

A stage that can checkpoint (training) records them and stops at its next step boundary with
``pipeline.core.exit_codes.PREEMPTED_EXIT_CODE``; the launcher records them until it hands over, and exits with the
same code when one came first (nothing started yet). Light on purpose: no third-party imports, so it is installed before torch loads.
A process talks to a supervising launcher through pipeline.core.launch_dir.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from types import FrameType
from typing import Any

from pipeline.core.launch_dir import SIGNAL_FILE, launch_file, write_small_file

PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


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

    def ignore_from_now(self) -> None:
        """The stage's work is done: ignore the signals until the process ends.

        Python's finalization puts the default action back for every signal it handles, and the default action of
        SIGUSR1 and SIGTERM is to terminate: a time-limit warning that lands while a finished run's interpreter
        shuts down (seconds, with torch loaded) would make its exit status 138 or 143, and a finished job would be
        counted as killed. An ignored signal stays ignored through finalization."""
        for signum in PREEMPTION_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous.clear()

    def received_name(self) -> str:
        """The signal received, for the log (in a multi-process run, possibly only another process received one)."""
        return signal.Signals(self.received).name if self.received is not None else "a signal elsewhere"
