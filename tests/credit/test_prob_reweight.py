"""The advantage reweighting of "Do Not Let Low-Probability Tokens Over-Dominate" (pipeline/credit/methods/
prob_reweight.py) against its authors' code: on a fixed batch, A · w equals upstream's
``compute_reweight_advantage(A m, log_probs, "both_linear_normal", alpha, 1 - alpha, neg_adv_weight)``
(github.com/zhyang2226/AR-Lopti at b92ba16, verl/trainer/ppo/ray_evaluator.py, run once on this batch; its outputs
below, to 7 significant digits) within 1e-6; and the weights by hand."""

from __future__ import annotations

import pytest
import torch

from pipeline.credit.method import scaled
from pipeline.credit.methods.prob_reweight import prob_weights

LOGPS = [
    [-5.45766, -2.248387, -1.252314, -3.613593, -0.7515936, -2.811474],
    [-0.2589445, -0.2961184, -0.5201671, -0.118945, -0.7962185, -0.2237805],
    [-1.898181, -0.9126254, -2.9155, -0.7778226, -1.739517, -0.0521538],
    [-0.1656784, -0.1336957, -0.4333856, -1.538245, -0.05202514, -4.413833],
]
ADVANTAGES = [1.2, -0.7, 0.0, -1.5]
MASK = [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0]]
UPSTREAM = {  # (alpha, neg_adv_weight): upstream's reweighted advantages
    (0.2, 1.0): [
        [0.9610233, 0.9853367, 1.028602, 0.9664692, 1.073187, 0.974428],
        [-0.6680612, -0.6641179, -0.643219, -0.6842999, 0, 0],
        [0, 0, 0, 0, 0, 0],
        [-1.454196, -1.462457, -1.394493, -1.264427, -1.484792, 0],
    ],
    (0.3, 0.8): [
        [0.8415349, 0.878005, 0.9429033, 0.8497037, 1.009781, 0.8616419],
        [-0.5216734, -0.5169415, -0.4918628, -0.5411599, 0, 0],
        [0, 0, 0, 0, 0, 0],
        [-1.145035, -1.154948, -1.073392, -0.9173128, -1.18175, 0],
    ],
}


@pytest.mark.parametrize(("alpha", "neg_weight"), list(UPSTREAM))
def test_reweighted_advantages_match_the_authors_code(alpha: float, neg_weight: float) -> None:
    advantages, mask = torch.tensor(ADVANTAGES), torch.tensor(MASK)
    weights = prob_weights(torch.tensor(LOGPS), advantages, mask, alpha, neg_weight)
    assert torch.allclose(scaled(advantages, weights), torch.tensor(UPSTREAM[(alpha, neg_weight)]), atol=1e-6)


def test_weights_by_hand() -> None:
    """p = 0.5 and 0.1 on a winning row, the same on a losing one; alpha = 0.2: w = 0.2 p + 0.8 = 0.9 and 0.82;
    the losing row's times neg_weight 0.5; padding 0; alpha = 0 is GRPO (w = 1)."""
    logps = torch.log(torch.tensor([[0.5, 0.1, 1.0], [0.5, 0.1, 1.0]]))
    advantages, mask = torch.tensor([1.0, -1.0]), torch.tensor([[1, 1, 0], [1, 1, 1]])
    weights = prob_weights(logps, advantages, mask, 0.2, 0.5)
    assert torch.allclose(weights, torch.tensor([[0.9, 0.82, 0.0], [0.45, 0.41, 0.5]]), atol=1e-6)
    assert torch.equal(prob_weights(logps, advantages, mask, 0.0, 1.0), mask.float())
