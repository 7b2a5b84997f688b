"""Bound ``oracle``: the weight placed by the task's ground truth, the ceiling a credit method is measured against.

On the decisive-step task (pipeline.tasks.decisive) the generator knows which tokens of every rollout decide its
answer's correctness: the queried step and the boxed content. The oracle weights exactly those:

    r_{i,t} = decisive_weight   on the decisive tokens of row i      (pipeline.tasks.decisive.decisive_tokens)
    r_{i,t} = other_weight      on its other valid tokens
    w_{i,t} = r_{i,t} · n_i / Σ_t r_{i,t} m_{i,t}    with keep_scale (n_i = Σ_t m_{i,t}: the row's mean weight is 1)
    w_{i,t} = r_{i,t}                                without it
    Â_{i,t} = A_i · w_{i,t} m_{i,t}

With ``keep_scale`` (the default) a row's update is as large as GRPO's and only its placement differs, so the gap
between GRPO and the oracle measures placement, not step size. A row with no decisive token (no queried step and no
complete box: such a completion is wrong for want of an answer) keeps GRPO's weights, 1 on every valid token.
The truth is read from the decoded prompt and completion of each row with the trainer's tokenizer; a prompt that
holds no decisive-step problem is refused, naming the row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipeline.core.deferred import DeferredModule
from pipeline.core.io import InputError
from pipeline.credit.method import CreditInputs, CreditMethod, CreditResult, Range, scaled
from pipeline.credit.stats import fraction, weight_stats
from pipeline.tasks.decisive import decisive_tokens

if TYPE_CHECKING:
    import torch
else:  # torch at first use: planning loads the credit methods without it (pipeline.core.deferred)
    torch = DeferredModule("torch")


@dataclass
class OracleOptions:
    decisive_weight: float = field(
        default=1.0,
        metadata={"help": "Raw weight of a decisive token (before keep_scale).", "range": Range(exclusive_minimum=0)},
    )
    other_weight: float = field(
        default=0.0,
        metadata={"help": "Raw weight of every other valid token (0: no credit at all).", "range": Range(minimum=0)},
    )
    keep_scale: bool = field(
        default=True,
        metadata={"help": "Rescale each row so its mean weight over valid tokens is 1 (GRPO's update size)."},
    )


def oracle_weights(
    decisive: torch.Tensor, completion_mask: torch.Tensor, decisive_weight: float, other_weight: float, keep_scale: bool
) -> torch.Tensor:
    """(B, T) float32 weights of the module docstring from (B, T) bool ``decisive`` labels."""
    valid = completion_mask.bool()
    raw = torch.where(decisive & valid, decisive_weight, other_weight) * valid
    without_truth = ~(decisive & valid).any(dim=1, keepdim=True)
    raw = torch.where(without_truth, valid.float(), raw)
    if not keep_scale:
        return raw
    total = raw.sum(dim=1, keepdim=True)
    return raw * (valid.sum(dim=1, keepdim=True) / total.clamp(min=torch.finfo(raw.dtype).tiny))


def batch_truth(inputs: CreditInputs) -> torch.Tensor:
    """(B, T) bool: the decisive tokens of every row of the batch, from its decoded prompt and completion."""
    tokenizer = getattr(inputs.host, "processing_class", None)
    if tokenizer is None:
        raise InputError("credit oracle: the host has no tokenizer (processing_class) to read the problems with")
    batch = inputs.batch
    truth = torch.zeros_like(batch["completion_mask"], dtype=torch.bool)
    for row in range(truth.size(0)):
        prompt = tokenizer.decode(batch["prompt_ids"][row][batch["prompt_mask"][row].bool()].tolist())
        length = int(batch["completion_mask"][row].sum())
        try:
            labels = decisive_tokens(tokenizer, prompt, batch["completion_ids"][row][:length].tolist())
        except ValueError:
            raise InputError(
                f"credit oracle: row {row}'s prompt holds no decisive-step problem (the oracle needs the task of "
                f"pipeline.tasks.decisive: a generated source with steps > 1): {prompt[-200:]!r}"
            ) from None
        truth[row, :length] = torch.tensor(labels, dtype=torch.bool)
    return truth


class Oracle(CreditMethod):
    name = "oracle"
    options = OracleOptions
    needs_spans = False
    headline = ("decisive_fraction", "no_truth_rate", "weight_mean")

    def advantages(self, inputs: CreditInputs) -> CreditResult:
        mask = inputs.batch["completion_mask"]
        truth = batch_truth(inputs)
        opts = self.opts
        weights = oracle_weights(truth, mask, opts.decisive_weight, opts.other_weight, opts.keep_scale)
        valid = mask.bool()
        stats = {
            "decisive_fraction": fraction(truth[valid]),
            "no_truth_rate": fraction(~(truth & valid).any(dim=1)),
            **weight_stats(weights, valid),
        }
        return CreditResult(scaled(inputs.batch["advantages"], weights), weights, stats)


METHOD = Oracle
