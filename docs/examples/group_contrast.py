"""An out-of-tree group credit method (docs/credit-methods.md, "Methods that see their group"): a token's credit is
how much more often the group's rewarded rollouts hold it than its unrewarded ones, a contingency score over each
prompt's group in the spirit of KTAE.

For a group g with mean reward m_g, its winners W_g = {i in g: r_i > m_g} and losers L_g = {i in g: r_i <= m_g},
and v a token id:

    c_{g,v}  = |{i in W_g: v in y_i}| / |W_g|  -  |{i in L_g: v in y_i}| / |L_g|        (0 when W_g or L_g is empty)
    w_{i,t}  = max(0, 1 + beta · sign(A_i) · c_{g(i), y_{i,t}}) m_{i,t}
    Â_{i,t}  = A_i · w_{i,t}

so a token typical of the group's wins gets more credit in a winning rollout, a token typical of its losses more
blame in a losing one, and a group whose rewards are all equal (A_i = 0) trains on nothing, as in GRPO. A reward that
no reward function scored (NaN) counts as a loser. Name it by import path: ``credit: examples.group_contrast``
with ``docs/`` on the PYTHONPATH (or copy the file into a package of your own).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pipeline.credit.method import CreditMethod, CreditResult, GroupInputs, Range, scaled
from pipeline.credit.stats import weight_stats


@dataclass
class GroupContrastOptions:
    beta: float = field(
        default=1.0,
        metadata={"help": "How far a token's win/loss contrast moves its weight from 1.", "range": Range(minimum=0)},
    )


def token_contrast(ids: torch.Tensor, mask: torch.Tensor, winners: torch.Tensor, vocabulary: int) -> torch.Tensor:
    """(G, T) c_{g, y_{i,t}} of one group's G rollouts: the share of winners holding each of its tokens minus the
    share of losers (module docstring); ``winners`` (G,) bool."""
    holds = torch.zeros(ids.size(0), vocabulary, dtype=torch.float64, device=ids.device)
    holds.scatter_reduce_(1, ids, mask.double(), reduce="amax")  # 1 where a valid token of the row is v
    losers = ~winners
    contrast = torch.zeros(vocabulary, dtype=torch.float64, device=ids.device)
    if winners.any() and losers.any():
        contrast = holds[winners].mean(dim=0) - holds[losers].mean(dim=0)
    return contrast[ids] * mask


def group_contrast_weights(inputs: GroupInputs, beta: float) -> torch.Tensor:
    """(N, T) float32 weights w_{i,t} of the module docstring, group by group; 0 on padding."""
    ids, mask = inputs.completion_ids, inputs.completion_mask.long()
    vocabulary = int(ids.max().item()) + 1
    rewards = torch.nan_to_num(inputs.rewards.double(), nan=float("-inf"))
    weights = torch.zeros(ids.shape, dtype=torch.float64, device=ids.device)
    for group in range(inputs.groups):
        rows = slice(group * inputs.group_size, (group + 1) * inputs.group_size)
        finite = rewards[rows][torch.isfinite(rewards[rows])]
        mean = finite.mean() if finite.numel() else torch.tensor(0.0, dtype=torch.float64)
        contrast = token_contrast(ids[rows], mask[rows], rewards[rows] > mean, vocabulary)
        sign = torch.sign(inputs.advantages[rows].double())[:, None]
        weights[rows] = (1 + beta * sign * contrast).clamp(min=0) * mask[rows]
    return weights.float()


class GroupContrast(CreditMethod):
    name = "group_contrast"
    options = GroupContrastOptions
    needs_spans = False
    groups = True  # group_advantages is called once per generation batch with every group whole
    headline = ("weight_mean", "weight_std")

    def group_advantages(self, inputs: GroupInputs) -> CreditResult:
        weights = group_contrast_weights(inputs, self.opts.beta)
        mask = inputs.completion_mask.bool()
        rows = inputs.advantages != 0
        stats = weight_stats(weights[rows], mask[rows])
        return CreditResult(scaled(inputs.advantages, weights), weights, stats)


METHOD = GroupContrast
