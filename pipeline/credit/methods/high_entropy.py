"""Baseline ``high_entropy``: policy gradient only through the top ``entropy_quantile`` of tokens by entropy
(Wang et al. 2025, arXiv 2506.01939, "the 20 % high-entropy minority").

It is TRL's own ``top_entropy_quantile`` option (GRPOTrainer masks the loss to tokens whose entropy is at or
above the batch's (1 - ρ) quantile), set from this method's option: the advantages stay TRL's, so does the loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.core.io import InputError
from pipeline.credit.method import CreditMethod, Range


@dataclass
class HighEntropyOptions:
    entropy_quantile: float = field(
        default=0.2,
        metadata={
            "help": "ρ: the fraction of tokens, by entropy, that carry the gradient (the paper's 0.2).",
            "range": Range(exclusive_minimum=0, maximum=1),
        },
    )


class HighEntropy(CreditMethod):
    name = "high_entropy"
    options = HighEntropyOptions
    needs_spans = False
    per_token = False

    @classmethod
    def configure(cls, options: HighEntropyOptions, args: Any) -> None:
        if args.top_entropy_quantile not in (1.0, options.entropy_quantile):
            raise InputError(
                f"credit {cls.name}: top_entropy_quantile is set to {args.top_entropy_quantile}; set the method's "
                "entropy_quantile instead"
            )
        args.top_entropy_quantile = options.entropy_quantile


METHOD = HighEntropy
