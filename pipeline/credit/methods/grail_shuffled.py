"""Control ``grail_shuffled``: GRAIL's own weights, permuted among each row's reasoning tokens.

    w'_{i, r_k} = w_{i, r_{π_i(k)}}     r_1 < ... < r_n: the valid tokens of row i before its boxed answer
                                         π_i: a uniform random permutation of 1..n from the run's seeded generator
    w'_{i,t}    = w_{i,t} elsewhere      (the boxed content's w_max, the markers and what follows them)
    Â_{i,t}     = A_i · w'_{i,t}

Each row keeps GRAIL's weight distribution and answer override; where the saliency put the weight is destroyed.
If GRAIL's gain comes from that placement, this control loses it. Options: GRAIL's (``grail_*``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.core.deferred import DeferredModule
from pipeline.credit.method import CreditInputs, CreditResult, scaled
from pipeline.credit.methods.grail import Grail
from pipeline.credit.spans import span_masks

if TYPE_CHECKING:
    import torch
else:  # torch at first use: planning loads the credit methods without it (pipeline.core.deferred)
    torch = DeferredModule("torch")


def reasoning_mask(completion_mask: torch.Tensor, spans: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: valid tokens before the boxed answer (every valid token of a row without one)."""
    masks = span_masks(spans, completion_mask.size(1))
    return completion_mask.bool() & ~(masks.answer | masks.post)


def shuffle_within(weights: torch.Tensor, mask: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``weights`` (B, T) with each row's values at ``mask`` permuted by ``torch.randperm(n_i, generator)``,
    rows in order; the other positions unchanged."""
    shuffled = weights.clone()
    for row in range(weights.size(0)):
        positions = mask[row].nonzero().squeeze(-1)
        order = torch.randperm(positions.numel(), generator=generator, device=generator.device).to(positions.device)
        shuffled[row, positions] = weights[row, positions[order]]
    return shuffled


class GrailShuffled(Grail):
    name = "grail_shuffled"

    def advantages(self, inputs: CreditInputs) -> CreditResult:
        weights, stats = self.weights(inputs)
        reasoning = reasoning_mask(inputs.batch["completion_mask"], inputs.spans)
        shuffled = shuffle_within(weights, reasoning, inputs.host.credit_generator())
        return CreditResult(scaled(inputs.batch["advantages"], shuffled), shuffled, stats)


METHOD = GrailShuffled
