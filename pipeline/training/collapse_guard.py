"""The collapse guard of training: the health check (pipeline.runtime.health) at every logging step, on what the
trainer logs, plus the weights' norm this module logs beside it.

At each logged training step the trainer adds ``weight_norm`` (the global L2 norm of the trainable weights) and
``weight_growth`` (over the start model's) to the row, and after the row is logged (written to
``metrics.jsonl``) asks the health check about the rows logged so far (``TrainerState.log_history``, which a
checkpoint carries, so a resumed run sees the rows before its checkpoint). A trip raises ``TrainingCollapse``
before the step's checkpoint is saved (the Trainer logs, then saves). Every process checks its own rows (the same
on every rank: TRL gathers its metrics, the weights are replicated) and the verdict is shared (``any_process``), so
all ranks stop at the same step with the same status. The detection lags the collapse by up to ``flat_window``
logged steps: the training stage sets aside the checkpoints saved after the last healthy step (pipeline.train), so
a rerun resumes from the last healthy checkpoint, with the same seed, and collapses again: the stage exits with
``pipeline.core.exit_codes.COLLAPSE_EXIT_CODE``, a final status, and the fix is a change of settings (or of the
check's thresholds, a run-time setting: docs/troubleshooting.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from pipeline.runtime.health import WEIGHT_GROWTH_KEY, WEIGHT_NORM_KEY, Trip, describe


class TrainingCollapse(RuntimeError):
    """The health check tripped at ``step`` (``trips``: what tripped on this process; empty when only another
    process's check did)."""

    def __init__(self, step: int, trips: Sequence[Trip]) -> None:
        self.step = step
        self.trips = list(trips)
        super().__init__(describe(self.trips) if self.trips else f"step {step}: found on another process")


def weight_norm(model: torch.nn.Module) -> float:
    """The global L2 norm of ``model``'s trainable parameters (each shared one once): each tensor's norm in its own
    dtype (no float32 copy of a bf16 embedding), their squares summed in float64. One read of the weights; under
    DeepSpeed ZeRO-3 a process would see only its own shard (this pipeline's engines, DDP and ZeRO-2, replicate
    the weights)."""
    norms = [torch.linalg.vector_norm(p.detach()) for p in model.parameters() if p.requires_grad and p.numel()]
    if not norms:
        return 0.0
    device = norms[0].device
    return math.sqrt(float(torch.stack([norm.to(device, torch.float64) for norm in norms]).square().sum()))


def weight_metrics(model: torch.nn.Module, start_norm: float) -> dict[str, float]:
    """The row's weight metrics: ``weight_norm`` and ``weight_growth`` (over ``start_norm``, the start model's)."""
    norm = weight_norm(model)
    return {WEIGHT_NORM_KEY: norm, WEIGHT_GROWTH_KEY: norm / start_norm if start_norm > 0 else math.inf}
