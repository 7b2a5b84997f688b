"""Hold a stage at a known point until it is signalled, so that a test's signal always lands there.

The tiny test runs train 10-20 steps a second and evaluate tens of samples a second, faster than a test can notice
progress and signal the process: a signal meant to land mid-run could land after the end. With these entries in the
environment of a stage (run directly, through Snakemake or through Slurm):
- ``hold_training_env(steps)``: ``python -m pipeline.train`` waits after publishing the checkpoint of any of
  ``steps`` until it has recorded a preemption signal (SIGKILL simply ends it there);
- ``hold_evaluation_env(rows)``: ``python -m pipeline.evaluate`` waits, once it has durably appended ``rows`` rows,
  until it is killed (when ``rows`` falls inside a batch, with that batch's rows up to ``rows`` written and its end
  line not: a kill mid-batch);
- ``pseudo_random_reward_env()``: ``python -m pipeline.train`` trains on a reward that hashes (position in the
  batch, prompt, completion) into [0, 1) instead of the outcome reward, so that every step of a tiny run has mixed rewards and a gradient
  (the resume tests compare weights, which only tells a wrong resume from a right one if every step moved them);
- ``weight_sync_off_env()``: ``python -m pipeline.train`` never syncs the trained weights to its colocate vLLM
  engine (the negative control of the weight-sync test);
- ``stall_training_env(rank, step)``: the process of rank ``rank`` of ``python -m pipeline.train`` holds inside
  optimizer step ``step`` (after the callbacks' ``on_step_begin``) until it is killed;
- ``stall_evaluation_env(batch)``: ``python -m pipeline.evaluate`` holds in the ``batch``-th generation of its hf
  backend until it is killed (the stall watchdog's tests);
- ``nan_loss_env(rank, step)``: the process of rank ``rank`` of ``python -m pipeline.train`` computes a NaN loss in
  optimizer step ``step`` (the NaN guard's two-process test).
The hook is ``sitecustomize.py`` next to this file, which Python imports at startup from ``PYTHONPATH``; it patches
nothing in any other process.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# (importing the hook here is inert: it acts only at the startup of a stage process)
from tests.hold_stage.sitecustomize import (
    CHECKPOINTS_VARIABLE,
    NAN_LOSS_VARIABLE,
    REWARD_VARIABLE,
    ROWS_VARIABLE,
    STALL_BATCH_VARIABLE,
    STALL_STEP_VARIABLE,
    SYNC_OFF_VARIABLE,
)

HOOK_DIR = Path(__file__).resolve().parent
REPO = HOOK_DIR.parents[1]


def _hook_env(variable: str, value: str) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(REPO), str(HOOK_DIR)]), variable: value}


def hold_training_env(*steps: int) -> dict[str, str]:
    """Environment entries that make a training stage hold after publishing the checkpoint of each of ``steps``."""
    return _hook_env(CHECKPOINTS_VARIABLE, ",".join(str(step) for step in steps))


def hold_evaluation_env(rows: int) -> dict[str, str]:
    """Environment entries that make an evaluation stage hold once it has appended ``rows`` rows."""
    return _hook_env(ROWS_VARIABLE, str(rows))


def pseudo_random_reward_env(salt: str = "0") -> dict[str, str]:
    """Environment entries that make a training stage train on the pseudo-random reward (salted with ``salt``)."""
    return _hook_env(REWARD_VARIABLE, salt)


def weight_sync_off_env() -> dict[str, str]:
    """Environment entries that switch off TRL's weight sync to the colocate vLLM engine in a training stage."""
    return _hook_env(SYNC_OFF_VARIABLE, "1")


def stall_training_env(rank: int, step: int) -> dict[str, str]:
    """Environment entries that hold the training process of rank ``rank`` inside optimizer step ``step``."""
    return _hook_env(STALL_STEP_VARIABLE, f"{rank}:{step}")


def stall_evaluation_env(batch: int) -> dict[str, str]:
    """Environment entries that hold an evaluation stage in the ``batch``-th generation of its hf backend."""
    return _hook_env(STALL_BATCH_VARIABLE, str(batch))


def stall_exit_bound(log: str) -> float | None:
    """The bound (seconds) the stall watchdog named as it exited, or None when it did not exit on a stall.

    The bound is the floor or ``stall_multiple`` x the median step, whichever is longer, so a loaded machine's slow
    steps raise it above the floor: a test checks it is at least the floor, not equal to it."""
    found = re.search(r"\(bound (\d+\.\d) s\): thread stacks follow; exiting 79 \(retryable\)", log)
    return float(found.group(1)) if found else None


def nan_loss_env(rank: int, step: int) -> dict[str, str]:
    """Environment entries that make the loss of optimizer step ``step`` NaN on the training process of rank ``rank``."""
    return _hook_env(NAN_LOSS_VARIABLE, f"{rank}:{step}")
