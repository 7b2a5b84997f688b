"""The subclass's loss and gradients equal TRL's own GRPOTrainer on the same prepared batch.

- credit="grpo": TRL's loss unchanged;
- credit="grail" with w_min = w_max = mean = 1 (all-one weights, yet the fast saliency pass runs): TRL's loss;
- credit="grail" with real weights: TRL's loss for the (B, T) advantages A_i * w_{i,t}, w from the reference path
  (so the memoised forward and the weighting are what TRL would compute).

In float64: the fast path runs the forward in two row chunks, and in float32 the summation order of the
parameter gradients then moves them by ~1e-4 (identical prompts make + and - advantage rows cancel).
"""

from __future__ import annotations

import pytest
import torch
from trainer_support import COMPLETIONS, boxed_batch, make_trainer

ADVANTAGES = [1.0, -1.0, 0.5, -0.5, 0.0, 1.0]


def loss_and_grads(trainer, batch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    trainer.model.train()
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, batch)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in trainer.model.parameters()]


def assert_same(first, second) -> None:
    torch.testing.assert_close(first[0], second[0], rtol=1e-9, atol=1e-12)
    for a, b in zip(first[1], second[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def float64_trainer(model_dir, tmp_path, **overrides):
    return make_trainer(model_dir, tmp_path, dtype=torch.float64, **overrides)


@pytest.fixture
def batch(random_model_dir):
    tokenizer = float64_trainer(random_model_dir, random_model_dir, trl_baseline=True).processing_class
    return boxed_batch(tokenizer, COMPLETIONS, ADVANTAGES)


@pytest.fixture
def trl_result(random_model_dir, tmp_path, batch):
    return loss_and_grads(float64_trainer(random_model_dir, tmp_path, trl_baseline=True), batch)


def test_grpo_credit_is_trl(random_model_dir, tmp_path, batch, trl_result):
    assert_same(loss_and_grads(float64_trainer(random_model_dir, tmp_path, credit="grpo"), batch), trl_result)


@pytest.mark.parametrize("recompute", ["every_step", "per_generation"])
def test_grail_with_unit_weights_is_trl(random_model_dir, tmp_path, batch, trl_result, recompute):
    grail = float64_trainer(
        random_model_dir, tmp_path, credit="grail", grail_w_min=1.0, grail_w_max=1.0, grail_recompute=recompute
    )
    grail.model.train()
    if recompute == "per_generation":  # what _generate_and_score_completions adds to the round
        batch = {**batch, "credit_weights": grail._credit_weights(grail.model, batch, share_loss_forward=False)}
    assert_same(loss_and_grads(grail, batch), trl_result)
    assert grail._metrics["train"]["grail/saliency_rows_frac"][-1] == pytest.approx(
        3 / 6
    )  # rows 0, 1, 3: a box and A != 0


def test_grail_loss_is_trl_loss_of_weighted_advantages(random_model_dir, tmp_path, batch):
    reference = float64_trainer(random_model_dir, tmp_path, credit="grail", grail_implementation="reference")
    reference.model.train()
    weights = reference._credit_weights(reference.model, batch, share_loss_forward=False)
    assert not torch.allclose(weights, batch["completion_mask"].float())
    weighted = {**batch, "advantages": batch["advantages"][:, None] * weights}
    expected = loss_and_grads(float64_trainer(random_model_dir, tmp_path, trl_baseline=True), weighted)
    fast = float64_trainer(random_model_dir, tmp_path, credit="grail")
    assert_same(loss_and_grads(fast, batch), expected)
    metrics = fast._metrics["train"]
    assert metrics["grail/advantages_scale_ratio"][-1] == pytest.approx(
        metrics["grail/advantages_weighted_abs_mean"][-1] / metrics["grail/advantages_raw_abs_mean"][-1]
    )
