"""The launcher as the parent of ``accelerate launch`` (modes ``cpu``, ``single-node``, ``node``: the module
docstring of ``pipeline.runtime.launching`` says why it stays): it forwards SIGTERM and SIGUSR1 to the registered
stage processes only, and exits with the status they agree on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pipeline.core.exit_codes import PREEMPTED_EXIT_CODE, STALL_EXIT_CODE
from pipeline.core.launch_dir import LAUNCH_DIR_VARIABLE, SIGNAL_FILE, write_small_file
from pipeline.runtime.launching import LaunchPlan
from pipeline.runtime.preemption import PreemptionSignals

POLL_SECONDS = 0.1


def recorded_exit_statuses(launch_dir: Path, local_processes: int) -> list[int | None]:
    """The exit status each local stage process recorded, by local rank; None for one that did not (killed, or
    never got as far as recording)."""
    statuses: list[int | None] = []
    for rank in range(local_processes):
        try:
            statuses.append(int((launch_dir / f"exit-rank{rank}").read_text(encoding="utf-8")))
        except (FileNotFoundError, ValueError):
            statuses.append(None)
    return statuses


def agreed_exit_status(statuses: Sequence[int | None], forwarded_preemption: bool = False) -> int | None:
    """The status to pass on from the local stage processes' recorded ``statuses``: the one they all recorded; else
    ``STALL_EXIT_CODE`` when any recorded it (a stalled rank's exit breaks the others' collectives and torch's
    elastic agent stops them, so they end with statuses of their own, or none: the stall is the cause); else None.

    With ``forwarded_preemption`` (the launcher passed on a preemption signal) a rank that recorded nothing counts as
    preempted once another recorded ``PREEMPTED_EXIT_CODE``: a rank that finds the signal while the other is still
    importing exits 75 at once, and the elastic agent then kills the late one before it can record anything."""
    if STALL_EXIT_CODE in statuses:
        return STALL_EXIT_CODE
    if forwarded_preemption and PREEMPTED_EXIT_CODE in statuses:
        statuses = [PREEMPTED_EXIT_CODE if status is None else status for status in statuses]
    return statuses[0] if None not in statuses and len(set(statuses)) == 1 else None


def forward_signal(launch_dir: Path, signum: int) -> None:
    """Forward ``signum`` to every registered stage process; processes that register later read it from the
    ``signal`` file (written first: see ``PreemptionSignals.register_with_launcher``)."""
    write_small_file(launch_dir / SIGNAL_FILE, str(signum))
    for pid_file in sorted(launch_dir.glob("pid-rank*")):
        with contextlib.suppress(ProcessLookupError):  # already ended
            os.kill(int(pid_file.read_text(encoding="utf-8")), signum)


def ignore_warning_signal() -> None:
    """In the child before exec: SIGUSR1 ignored (Slurm's warning must not kill the launcher layers)."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def supervise(plan: LaunchPlan, signals: PreemptionSignals) -> int:
    """Run ``plan`` as a child, forward preemption signals to its stage processes, return the exit status to pass on:
    the one every local stage process recorded when they agree, the stall code when one stalled (``agreed_exit_status``),
    else the child's own."""
    with tempfile.TemporaryDirectory(prefix="grail-launch-") as directory:
        launch_dir = Path(directory)
        env = {**os.environ, **plan.env, LAUNCH_DIR_VARIABLE: directory}
        child = subprocess.Popen(plan.argv, env=env, preexec_fn=ignore_warning_signal)
        # Ctrl-C reaches the whole foreground group: the child handles it; the launcher waits for its status.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        forwarded: set[int] = set()
        while True:
            try:
                status = child.wait(timeout=POLL_SECONDS)
                break
            except subprocess.TimeoutExpired:
                received = signals.received
                if received is not None and received not in forwarded:
                    forwarded.add(received)
                    name = signal.Signals(received).name
                    print(f"pipeline.launch: forwarding {name} to the stage processes", file=sys.stderr, flush=True)
                    forward_signal(launch_dir, received)
        statuses = recorded_exit_statuses(launch_dir, plan.local_processes)
    agreed = agreed_exit_status(statuses, forwarded_preemption=bool(forwarded))
    if status != 0 and agreed is not None and agreed not in (0, status):
        which = f"every stage process exited {agreed}"
        if agreed == STALL_EXIT_CODE and set(statuses) != {agreed}:
            which = f"a stage process stalled (statuses by local rank: {statuses})"
        elif set(statuses) != {agreed}:
            which = f"the stage processes were preempted (statuses by local rank: {statuses}, none: killed unrecorded)"
        print(
            f"pipeline.launch: {which} ({plan.argv[0]} exited {status}): exiting {agreed}",
            file=sys.stderr,
            flush=True,
        )
        return agreed
    return status


def run_child(plan: LaunchPlan) -> int:
    """Run ``plan`` as a child and return its exit status (128 + N after signal N): the launcher stays to requeue the
    Slurm job after a time window. Nothing is forwarded: Slurm signals every process of the job step, the stage too."""
    child = subprocess.Popen(plan.argv, env={**os.environ, **plan.env}, preexec_fn=ignore_warning_signal)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in supervise: the child handles Ctrl-C
    status = child.wait()
    return 128 - status if status < 0 else status
