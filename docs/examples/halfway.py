"""An out-of-tree credit method (docs/credit-methods.md): more credit to the second half of each completion.

    w_{i,t} = late_weight  if t >= n_i / 2, else 1        (n_i: the number of valid tokens of row i)
    Â_{i,t} = A_i · w_{i,t} m_{i,t}

Name it in a study config by its import path, e.g. ``credit: mylab.credit.halfway`` with
``credit_options: {late_weight: 2.0}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipeline.core.deferred import DeferredModule
from pipeline.credit.method import CreditInputs, CreditMethod, CreditResult, Range, carries_loss, scaled
from pipeline.credit.stats import weight_stats

if TYPE_CHECKING:
    import torch
else:  # imported at first use: every Snakemake start loads this module to check its options, and needs no torch
    torch = DeferredModule("torch")


@dataclass
class HalfwayOptions:
    late_weight: float = field(
        default=2.0, metadata={"help": "Weight of the second half of a completion.", "range": Range(minimum=0)}
    )


def halfway_weights(completion_mask: torch.Tensor, late_weight: float) -> torch.Tensor:
    """(B, T) float32 weights of the module docstring; 0 on padding, so a row without a real token (truncated,
    under mask_truncated_completions) is all 0, and a row of one token has weight 1 (0 < 1 / 2)."""
    t = torch.arange(completion_mask.size(1), device=completion_mask.device)[None, :]
    late = t >= completion_mask.sum(dim=-1, keepdim=True) / 2
    return torch.where(late, late_weight, 1.0) * completion_mask


class Halfway(CreditMethod):
    name = "halfway"  # the prefix of its logged statistics: halfway/weight_mean, ...
    options = HalfwayOptions
    needs_spans = False  # no boxed answer needed; needs_model stays False: no model pass
    headline = ("weight_mean",)

    def advantages(self, inputs: CreditInputs) -> CreditResult:
        mask = inputs.batch["completion_mask"]  # inputs.batch is a dict; self.opts holds the options
        weights = halfway_weights(mask, self.opts.late_weight)
        rows = carries_loss(inputs.batch)  # the statistics cover the rows that carry loss, as the built-ins'
        stats = weight_stats(weights[rows], mask[rows].bool())
        return CreditResult(scaled(inputs.batch["advantages"], weights), weights, stats)


METHOD = Halfway
