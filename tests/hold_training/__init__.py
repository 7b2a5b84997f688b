"""Hold a training stage right after it publishes a checkpoint, until it receives a preemption signal.

The tiny test runs train 10-20 steps a second, faster than a test can notice a checkpoint and signal the process:
a signal meant to land mid-run could land after the last step. With ``hold_env(steps)`` in the environment of a
``python -m pipeline.train`` process (directly, through Snakemake or through Slurm), the run waits after publishing
the checkpoint of any of ``steps`` until a preemption signal was recorded (SIGKILL simply ends it there), so the
signal always lands mid-run. The hook is ``sitecustomize.py`` next to this file, which Python imports at startup
from ``PYTHONPATH``; it patches nothing in any other process.
"""

from __future__ import annotations

import os
from pathlib import Path

HOOK_DIR = Path(__file__).resolve().parent
REPO = HOOK_DIR.parents[1]
STEPS_VARIABLE = "GRAIL_TEST_HOLD_AFTER_CHECKPOINTS"


def hold_env(*steps: int) -> dict[str, str]:
    """Environment entries that make a training stage hold after publishing the checkpoint of each of ``steps``."""
    return {
        "PYTHONPATH": os.pathsep.join([str(REPO), str(HOOK_DIR)]),
        STEPS_VARIABLE: ",".join(str(step) for step in steps),
    }
