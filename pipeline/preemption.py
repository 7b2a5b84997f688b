"""Preemption signals: Slurm's time-limit warning (SIGUSR1, from ``--signal=USR1@<seconds>``) and SIGTERM.

A stage that can checkpoint (training) records them and stops at its next step boundary with
``PREEMPTED_EXIT_CODE``; the launcher records them until it hands over, and exits with the same code when one came
first (nothing started yet). Light on purpose: no third-party imports, so it is installed before torch loads.
"""

from __future__ import annotations

import dataclasses
import signal
from types import FrameType
from typing import Any

PREEMPTED_EXIT_CODE = 75  # sysexits.h EX_TEMPFAIL: "temporary failure, try again" (checkpoint saved, rerun resumes)
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
        for signum in PREEMPTION_SIGNALS:
            self.previous[signum] = signal.signal(signum, self.record)
        return self

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous.clear()

    def received_name(self) -> str:
        """The signal received, for the log (in a multi-process run, possibly only another process received one)."""
        return signal.Signals(self.received).name if self.received is not None else "a signal elsewhere"
