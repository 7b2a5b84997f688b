"""Control ``answer_only``: GRAIL's answer override alone, no saliency pass.

    w_{i,t} = answer_weight   on the boxed content of row i (GRAIL's w_max there)
    w_{i,t} = 1               on every other valid token (the \\boxed{ and } markers, the reasoning, what follows)
    Â_{i,t} = A_i · w_{i,t} m_{i,t}

If GRAIL's gain is the up-weighted answer, this control keeps it at no model cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipeline.core.deferred import DeferredModule
from pipeline.credit.method import CreditInputs, CreditMethod, CreditResult, Range, scaled
from pipeline.credit.spans import span_masks
from pipeline.credit.stats import fraction, weight_stats

if TYPE_CHECKING:
    import torch
else:  # torch at first use: planning loads the credit methods without it (pipeline.core.deferred)
    torch = DeferredModule("torch")


@dataclass
class AnswerOnlyOptions:
    answer_weight: float = field(
        default=5.0,
        metadata={"help": "Weight of the boxed content (GRAIL's grail_w_max; upstream 5).", "range": Range(minimum=0)},
    )


def answer_only_weights(completion_mask: torch.Tensor, spans: torch.Tensor, answer_weight: float) -> torch.Tensor:
    """(B, T) float32 weights of the module docstring."""
    valid = completion_mask.bool()
    content = span_masks(spans, completion_mask.size(1)).content
    return torch.where(content, answer_weight, 1.0) * valid


class AnswerOnly(CreditMethod):
    name = "answer_only"
    options = AnswerOnlyOptions
    headline = ("answer_found_rate", "weight_mean", "advantages_scale_ratio")

    def advantages(self, inputs: CreditInputs) -> CreditResult:
        mask = inputs.batch["completion_mask"]
        weights = answer_only_weights(mask, inputs.spans, self.opts.answer_weight)
        stats = {"answer_found_rate": fraction(inputs.spans[:, 0] >= 0), **weight_stats(weights, mask.bool())}
        return CreditResult(scaled(inputs.batch["advantages"], weights), weights, stats)


METHOD = AnswerOnly
