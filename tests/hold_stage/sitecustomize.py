"""Startup hook of ``tests.hold_stage`` (read its docstring): active only in a ``python -m pipeline.train`` or
``python -m pipeline.evaluate`` process whose environment asks for a hold."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

CHECKPOINTS_VARIABLE = "GRAIL_TEST_HOLD_AFTER_CHECKPOINTS"
ROWS_VARIABLE = "GRAIL_TEST_HOLD_AFTER_APPENDED_ROWS"
HOLD_LIMIT_S = 150


def stage_module() -> str | None:
    """The module of ``python -m MODULE``, None for any other command line."""
    arguments = sys.orig_argv
    return arguments[arguments.index("-m") + 1] if "-m" in arguments[:-1] else None


def hold_until(condition: Any, what: str) -> None:
    print(f"test hook: holding {what}", file=sys.stderr, flush=True)
    deadline = time.monotonic() + HOLD_LIMIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"test hook: not signalled within {HOLD_LIMIT_S} s")
        time.sleep(0.02)


def hold_after_checkpoints(steps: frozenset[int]) -> None:
    """After the callbacks' ``on_save`` for a step in ``steps``, wait until the stage recorded a preemption signal
    (``signals.received`` of its preemption callback)."""
    from transformers.trainer_callback import CallbackHandler

    on_save = CallbackHandler.on_save

    def on_save_then_hold(self: CallbackHandler, args: Any, state: Any, control: Any) -> Any:
        control = on_save(self, args, state, control)
        if state.global_step in steps:
            signals = next(callback.signals for callback in self.callbacks if hasattr(callback, "signals"))
            hold_until(lambda: signals.received is not None, f"after checkpoint-{state.global_step} until a signal")
        return control

    CallbackHandler.on_save = on_save_then_hold


def hold_after_appended_rows(count: int) -> None:
    """Once this process has durably appended ``count`` rows (``pipeline.io.append_jsonl_durably``), wait to be
    killed (the evaluation stage has no handler: SIGTERM and SIGKILL end it there)."""
    import pipeline.io

    append = pipeline.io.append_jsonl_durably
    appended = 0

    def append_then_hold(handle: Any, rows: Any) -> None:
        nonlocal appended
        rows = list(rows)
        append(handle, rows)
        before, appended = appended, appended + len(rows)
        if before < count <= appended:
            hold_until(lambda: False, f"after {appended} appended rows until killed")

    pipeline.io.append_jsonl_durably = append_then_hold


if os.environ.get(CHECKPOINTS_VARIABLE) and stage_module() == "pipeline.train":
    hold_after_checkpoints(frozenset(int(step) for step in os.environ[CHECKPOINTS_VARIABLE].split(",")))
if os.environ.get(ROWS_VARIABLE) and stage_module() == "pipeline.evaluate":
    hold_after_appended_rows(int(os.environ[ROWS_VARIABLE]))
