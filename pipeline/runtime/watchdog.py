"""The stall watchdog of training and evaluation: a rank whose step (or evaluation batch) makes no progress within a
bound dumps every thread's Python stack to stderr, names itself and the step, and exits with ``STALL_EXIT_CODE``.

A collective that waits forever is cut by ``ddp_timeout``; a stall outside one (a vLLM engine that stops answering,
a hung NFS read) is not, and the preemption handler only sets a flag read at the end of a step that a stalled step
never reaches. The watchdog is a daemon thread that checks a heartbeat: the stage calls ``begin(what)`` when a unit
of work (a training step, an evaluation batch) starts and ``end(after)`` when it is done; the time since the last of
these calls is compared with ``stall_bound`` of the durations of the units completed so far. On a stall the thread
records the status for a supervising ``pipeline.launch`` (pipeline.core.launch_dir), writes one line naming the rank,
the unit, the seconds without progress and the bound, then the stacks (``faulthandler``: it needs neither the
stuck main thread nor the GIL for long), and ends the process with ``os._exit`` (the main thread is stuck: an
exception or ``sys.exit`` would never be seen). The line and the stacks go out in one write: faulthandler writes a
frame in several pieces, and ranks that stall together share one log, where their dumps would interleave piece by
piece. Every rank runs its own watchdog, so the ranks that wait for the stalled one in a collective stop with the
same status and their own stacks; the launcher passes the status on (pipeline.launch). It watches stages that import torch, transformers or vLLM and imports none of them.
"""

from __future__ import annotations

import faulthandler
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from pipeline.core.declared import Range, refuse_out_of_range, setting
from pipeline.core.exit_codes import STALL_EXIT_CODE
from pipeline.core.launch_dir import record_exit_status


@dataclass(frozen=True)
class WatchdogConfig:
    """The stall watchdog of training and evaluation: a training step or evaluation batch (or the gap after one)
    without progress for longer than its bound (first_step_s before the first one completed, then
    max(stall_floor_s, stall_multiple x the median duration so far)) makes every rank dump its threads' stacks and
    exit 79 (retried). Changing it reruns no training or evaluation, only the report. docs/cluster.md

    The ``watchdog`` section of the study config, declared here (``pipeline.core.declared``); it reaches a job with
    the run-time settings (pipeline.runtime.settings)."""

    enabled: bool = setting(True, "false switches the watchdog off")
    # a multiple below 1 would stop steps of the run's usual length; a bound of 0 s every step
    stall_multiple: float = setting(
        5.0,
        "the bound in median step (batch) durations; keep stall_multiple x the median step below "
        "training.ddp_timeout, so that every rank reports a stall",
        Range(minimum=1),
    )
    stall_floor_s: float = setting(
        1200.0,
        "the least bound (seconds) once a step (batch) completed; keep it above the longest checkpoint save and "
        "below training.ddp_timeout",
        Range(exclusive_minimum=0),
    )
    first_step_s: float = setting(
        1500.0,
        "the bound (seconds) before the first step (batch) completed: it pays for warm-up and compilation; below "
        "training.ddp_timeout, so that every rank reports a stall in it",
        Range(exclusive_minimum=0),
    )

    def __post_init__(self) -> None:
        refuse_out_of_range(self, "watchdog")


def stall_bound(durations: Sequence[float], config: WatchdogConfig) -> float:
    """Seconds a unit of work (or the gap between two) may go without progress:

        bound = first_step_s                                         before any unit completed
        bound = max(stall_floor_s, stall_multiple x median(durations)) after

    ``durations``: the seconds each completed unit took. The first unit gets its own allowance because it pays for
    what the later ones reuse (CUDA graph capture, vLLM's first batches, caches filled); from then on the median,
    which a few slow steps (long completions, a checkpoint save) do not move, scales with the run's own pace, and the
    floor keeps short-stepped runs from being cut by a slow save or a slow node."""
    if not durations:
        return config.first_step_s
    return max(config.stall_floor_s, config.stall_multiple * statistics.median(durations))


def stall_message(rank: int, what: str, silent_s: float, bound_s: float) -> str:
    """The line the watchdog writes on a stall: rank, unit, seconds without progress, bound, exit status."""
    return (
        f"stall watchdog: rank {rank}: no progress in {what} for {silent_s:.1f} s (bound {bound_s:.1f} s): "
        f"thread stacks follow; exiting {STALL_EXIT_CODE} (retryable)"
    )


def process_rank() -> int:
    """This process's rank in its run (``RANK``, set by the launcher for every process; 0 without one)."""
    return int(os.environ.get("RANK", "0"))


def stop_process(message: str, stream: TextIO = sys.stderr) -> None:
    """Record ``STALL_EXIT_CODE`` for a supervising launcher, write ``message`` and every thread's stack to
    ``stream`` and end the process at once (its main thread is stuck)."""
    record_exit_status(STALL_EXIT_CODE)
    stream.flush()
    try:
        write_whole(stream.fileno(), stall_report(message))
    except OSError:  # no room for the dump's file: the stacks unbuffered, rather than a thread dead and a run hung
        print(message, file=stream, flush=True)
        faulthandler.dump_traceback(file=stream, all_threads=True)
    os._exit(STALL_EXIT_CODE)


def stall_report(message: str) -> bytes:
    """``message`` and every thread's stack, as one block (faulthandler dumps into a temporary file first)."""
    with tempfile.TemporaryFile() as dump:
        faulthandler.dump_traceback(file=dump, all_threads=True)
        dump.seek(0)
        return f"{message}\n".encode() + dump.read()


def write_whole(descriptor: int, data: bytes) -> None:
    """All of ``data`` to ``descriptor`` in as few ``write`` calls as the kernel takes."""
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view) :]


class StallWatchdog:
    """A heartbeat and the daemon thread that checks it (module docstring); ``start`` arms it, ``stop`` disarms."""

    def __init__(
        self,
        config: WatchdogConfig,
        rank: int | None = None,
        on_stall: Callable[[str], None] = stop_process,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.rank = process_rank() if rank is None else rank
        self.on_stall = on_stall
        self.clock = clock
        self.durations: list[float] = []
        self.what = "the first unit of work"
        self.last_beat = clock()
        self.started_at: float | None = None
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def begin(self, what: str) -> None:
        """A unit of work (``what``: "training step 3") starts now."""
        with self.lock:
            self.what = what
            self.last_beat = self.started_at = self.clock()

    def end(self, after: str) -> None:
        """The unit begun last is done; what follows until the next ``begin`` is ``after`` ("after step 3")."""
        with self.lock:
            now = self.clock()
            if self.started_at is not None:
                self.durations.append(now - self.started_at)
            self.what, self.last_beat, self.started_at = after, now, None

    def check(self) -> str | None:
        """The stall message when the time since the last beat exceeds the bound, else None."""
        with self.lock:
            silent, bound, what = self.clock() - self.last_beat, stall_bound(self.durations, self.config), self.what
        return stall_message(self.rank, what, silent, bound) if silent > bound else None

    def poll_seconds(self) -> float:
        """How often the thread checks: a tenth of the smallest bound it can have, at most 1 s."""
        return min(1.0, self.config.stall_floor_s / 10, self.config.first_step_s / 10)

    def start(self, what: str) -> StallWatchdog:
        """Arm the watchdog (nothing when it is disabled), ``what`` being the work that starts now."""
        self.begin(what)
        if self.config.enabled and self.thread is None:
            self.thread = threading.Thread(target=self._watch, name="stall-watchdog", daemon=True)
            self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    def _watch(self) -> None:
        while not self.stopped.wait(self.poll_seconds()):
            if (message := self.check()) is not None:
                self.on_stall(message)
                return
