"""Advantage reweighting (AR) of "Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs" (Yang et al. 2025,
arXiv 2505.12929; code: github.com/zhyang2226/AR-Lopti, ``reweight_method: both_linear_normal``): a low-probability
token's large gradient is damped by weighting its advantage with the sampling policy's probability of it.

    w_{i,t} = (alpha π_old(y_{i,t} | x_i, y_{i,<t}) + (1 - alpha)) · (neg_weight if A_i <= 0 else 1) · m_{i,t}
    Â_{i,t} = A_i · w_{i,t}

π_old is the policy that sampled the rollouts, at the sampling temperature: TRL's ``old_per_token_logps`` where the
batch carries them (num_iterations > 1, or vLLM's sampling), else the loss's own forward on the same weights
(``inputs.token_statistics()``: no forward beyond GRPO's). alpha = 0 is GRPO. Upstream's AR runs use alpha = 0.2
(0.3 with Lopti) and neg_weight = 1 (scripts/train_kklogic_AR_4x80GB.sh). Lopti, the paper's second technique
(updating low-probability tokens in a separate step first), changes the optimizer's schedule, not the advantages,
and is not part of this method.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipeline.core.deferred import DeferredModule
from pipeline.credit.method import CreditInputs, CreditMethod, CreditResult, Range, carries_loss, scaled
from pipeline.credit.stats import weight_stats

if TYPE_CHECKING:
    import torch
else:  # torch at first use: planning loads the credit methods without it (pipeline.core.deferred)
    torch = DeferredModule("torch")


@dataclass
class ProbReweightOptions:
    ar_alpha: float = field(
        default=0.2,
        metadata={"help": "alpha: the weight's share that follows the token's probability (upstream's AR: 0.2).",
                  "range": Range(minimum=0, maximum=1)},
    )  # fmt: skip
    ar_neg_weight: float = field(
        default=1.0,
        metadata={"help": "Extra factor on the weights of rows with A <= 0 (upstream 1).", "range": Range(minimum=0)},
    )


def prob_weights(
    logps: torch.Tensor, advantages: torch.Tensor, completion_mask: torch.Tensor, alpha: float, neg_weight: float
) -> torch.Tensor:
    """(B, T) float32 weights w_{i,t} of the module docstring from the sampling policy's log-probs; 0 on padding."""
    weights = alpha * torch.exp(logps.float()) + (1 - alpha)
    weights = torch.where((advantages <= 0)[:, None], weights * neg_weight, weights)
    return weights * completion_mask


class ProbReweight(CreditMethod):
    name = "prob_reweight"
    options = ProbReweightOptions
    needs_model = True  # π_old from the loss's forward where the batch has no old log-probs
    needs_spans = False
    headline = ("weight_mean", "prob_mean")

    @property
    def shares_loss_forward(self) -> bool:
        return True

    def advantages(self, inputs: CreditInputs) -> CreditResult:
        batch = inputs.batch
        mask, advantages = batch["completion_mask"], batch["advantages"]
        old = batch.get("old_per_token_logps")
        logps = inputs.token_statistics().logps if old is None else old.detach()
        weights = prob_weights(logps, advantages, mask, self.opts.ar_alpha, self.opts.ar_neg_weight)
        rows = carries_loss(batch)
        valid = mask[rows].bool()
        prob_mean = torch.exp(logps[rows].float())[valid].mean().item() if valid.any() else float("nan")
        stats = {**weight_stats(weights[rows], valid), "prob_mean": prob_mean}
        return CreditResult(scaled(advantages, weights), weights, stats)


METHOD = ProbReweight
