"""An out-of-tree credit method that reads the policy's entropies (docs/credit-methods.md, "Log-probs and
entropies"): more credit to the tokens where the policy was uncertain, less where it was sure.

    z_{i,t} = (H_{i,t} - μ_i) / sqrt(σ_i² + ε)     H: entropy at the sampling temperature; μ_i, σ_i² over row i's
                                                  n_i real tokens (population variance), ε = 1e-8
    w_{i,t} = clip(1 + scale · z_{i,t}, w_min, w_max) · m_{i,t}
    Â_{i,t} = A_i · w_{i,t}

A row of one real token has z = 0 (w = 1), a row without one w = 0. The entropies come from
``inputs.token_statistics()``, which makes the loss's own forward: the method adds no forward pass to a step.

Name it in a study config by its import path, e.g. ``credit: examples.entropy_weights`` with ``docs/`` on the
PYTHONPATH and ``credit_options: {scale: 0.5}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pipeline.core.io import InputError
from pipeline.credit.method import CreditInputs, CreditMethod, CreditResult, Range, carries_loss, scaled
from pipeline.credit.stats import weight_stats

VAR_EPS = 1e-8


@dataclass
class EntropyWeightsOptions:
    scale: float = field(
        default=0.5, metadata={"help": "Weight change per standard deviation of entropy.", "range": Range(minimum=0)}
    )
    w_min: float = field(default=0.5, metadata={"help": "Lower clip of the weights.", "range": Range(minimum=0)})
    w_max: float = field(
        default=2.0, metadata={"help": "Upper clip of the weights.", "range": Range(exclusive_minimum=0)}
    )

    def check_values(self) -> None:
        if not self.w_max >= self.w_min:
            raise InputError(f"w_max ({self.w_max}) must be >= w_min ({self.w_min})")


def entropy_weights(
    entropies: torch.Tensor, completion_mask: torch.Tensor, scale: float, w_min: float, w_max: float
) -> torch.Tensor:
    """(B, T) float32 weights w_{i,t} of the module docstring, 0 on padding."""
    mask = completion_mask.float()
    n = mask.sum(dim=-1, keepdim=True).clamp(min=1)
    mean = (mask * entropies).sum(dim=-1, keepdim=True) / n
    variance = (mask * (entropies - mean) ** 2).sum(dim=-1, keepdim=True) / n
    z = (entropies - mean) / torch.sqrt(variance + VAR_EPS)
    return (1 + scale * z).clamp(w_min, w_max) * mask


class EntropyWeights(CreditMethod):
    name = "entropy_weights"
    options = EntropyWeightsOptions
    needs_model = True  # it reads the policy, through inputs.token_statistics()
    needs_spans = False
    headline = ("weight_std", "entropy_mean")

    @property
    def shares_loss_forward(self) -> bool:
        return True  # token_statistics() may make the loss's forward: one forward per micro-step, as GRPO's

    def advantages(self, inputs: CreditInputs) -> CreditResult:
        mask = inputs.batch["completion_mask"]
        entropies = inputs.token_statistics().entropies
        weights = entropy_weights(entropies, mask, self.opts.scale, self.opts.w_min, self.opts.w_max)
        rows = carries_loss(inputs.batch)
        valid = mask[rows].bool()
        entropy_mean = entropies[rows][valid].mean().item() if valid.any() else float("nan")
        stats = {**weight_stats(weights[rows], valid), "entropy_mean": entropy_mean}
        return CreditResult(scaled(inputs.batch["advantages"], weights), weights, stats)


METHOD = EntropyWeights
