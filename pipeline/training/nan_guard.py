"""The NaN guard of training: a non-finite loss or gradient norm stops the run before the optimizer step, and no
checkpoint or final model with non-finite weights is written.

Every process checks the same things at the same point and the verdict is shared (``any_process``), so all ranks
stop together instead of one waiting in a collective for the others until ``ddp_timeout``. A rerun resumes from the
last finite checkpoint with the same seed and would diverge at the same step again: the stage exits with
``pipeline.core.exit_codes.NONFINITE_EXIT_CODE``, not with the preemption code (a final status: a retry in the same
Snakemake invocation exits at once), and the fix is a change of settings (docs/troubleshooting.md).
"""

from __future__ import annotations

import math
from typing import Any

import torch


class NonFiniteTraining(RuntimeError):
    """Training produced a non-finite loss, gradient norm or weight; the message names the step, rank and the last
    finite checkpoint."""


def is_finite(value: torch.Tensor | float | None) -> bool:
    """Whether a loss or gradient norm (tensor or float; None when not computed) is finite."""
    if value is None:
        return True
    if isinstance(value, torch.Tensor):
        return bool(torch.isfinite(value).all())
    return math.isfinite(value)


def step_problem(loss: torch.Tensor | float, grad_norm: torch.Tensor | float | None) -> str | None:
    """What is non-finite in one optimizer step (``loss``: this process's losses summed since the last log, which a
    single non-finite micro-step makes non-finite), or None."""
    problems = [
        f"{name} {float(value)}"
        for name, value in (("loss", loss), ("gradient norm", grad_norm))
        if not is_finite(value)
    ]
    return " and ".join(problems) or None


def nonfinite_parameters(model: torch.nn.Module) -> list[str]:
    """Names of the parameters of ``model`` (this process's part of them, when sharded) that hold a NaN or inf."""
    return [name for name, parameter in model.named_parameters() if not bool(torch.isfinite(parameter).all())]


def any_process(accelerator: Any, flag: bool) -> bool:
    """Whether ``flag`` is set on any process of the run (a collective: every process must call it)."""
    if accelerator is None or accelerator.num_processes == 1:
        return flag
    total = accelerator.reduce(torch.tensor([float(flag)], device=accelerator.device), reduction="sum")
    return bool(total.item() > 0)
