"""Startup hook of ``tests.hold_training`` (read its docstring): active only in a ``python -m pipeline.train``
process whose environment names the checkpoint steps to hold after."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

STEPS_VARIABLE = "GRAIL_TEST_HOLD_AFTER_CHECKPOINTS"
HOLD_LIMIT_S = 150


def runs_training_stage() -> bool:
    arguments = sys.orig_argv
    return "-m" in arguments and arguments[arguments.index("-m") + 1 :][:1] == ["pipeline.train"]


def hold_after_checkpoints(steps: frozenset[int]) -> None:
    """After the callbacks' ``on_save`` for a step in ``steps``, wait until the stage recorded a preemption signal
    (``signals.received`` of its preemption callback); give up with an error after ``HOLD_LIMIT_S``."""
    from transformers.trainer_callback import CallbackHandler

    on_save = CallbackHandler.on_save

    def on_save_then_hold(self: CallbackHandler, args: Any, state: Any, control: Any) -> Any:
        control = on_save(self, args, state, control)
        if state.global_step not in steps:
            return control
        signals = next(callback.signals for callback in self.callbacks if hasattr(callback, "signals"))
        print(f"test hook: holding after checkpoint-{state.global_step} until a signal", file=sys.stderr, flush=True)
        deadline = time.monotonic() + HOLD_LIMIT_S
        while signals.received is None:
            if time.monotonic() > deadline:
                raise SystemExit(f"test hook: no preemption signal within {HOLD_LIMIT_S} s")
            time.sleep(0.02)
        return control

    CallbackHandler.on_save = on_save_then_hold


if os.environ.get(STEPS_VARIABLE) and runs_training_stage():
    hold_after_checkpoints(frozenset(int(step) for step in os.environ[STEPS_VARIABLE].split(",")))
