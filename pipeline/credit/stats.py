"""Summary statistics of credit weights and advantages (the numbers the trainer logs; see docs/output.md "Logged metrics")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.core.deferred import DeferredModule

if TYPE_CHECKING:
    import torch
else:  # torch at first use: planning loads the credit methods without it (pipeline.core.deferred)
    torch = DeferredModule("torch")


def fraction(flags: torch.Tensor) -> float:
    """Mean of a bool tensor; NaN when empty."""
    return flags.float().mean().item() if flags.numel() else float("nan")


def weight_stats(weights: torch.Tensor, valid: torch.Tensor) -> dict[str, float]:
    """Mean and unbiased std of the weights over valid tokens (NaN when there are too few)."""
    values = weights[valid].double()
    return {
        "weight_mean": values.mean().item() if values.numel() else float("nan"),
        "weight_std": values.std().item() if values.numel() > 1 else float("nan"),
    }


def advantage_magnitudes(raw: torch.Tensor, weighted: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """(4,) float32: mean_i |A_i|, Σ|Â·m| / max(Σm, 1), max_i |A_i|, max |Â·m| for raw (B,) and weighted (B, T)
    advantages; the loss-side metrics of spec 1.9 (scale_ratio = second / (first + 1e-8))."""
    mask = completion_mask.float()
    weighted_abs = (weighted * mask).abs()
    return torch.stack(
        [raw.abs().mean(), weighted_abs.sum() / mask.sum().clamp(min=1), raw.abs().max(), weighted_abs.max()]
    ).float()
