"""The subclass's loss and gradients equal TRL's own GRPOTrainer on the same prepared batch.

- credit="grpo": TRL's loss unchanged;
- credit="grail" with w_min = w_max = mean = 1 (all-one weights, yet the fast saliency pass runs): TRL's loss;
- credit="grail" with real weights: TRL's loss for the (B, T) advantages A_i * w_{i,t}, w from the reference path
  (so the memoised forward and the weighting are what TRL would compute).

Each in two settings: on-policy at temperature 1 (one iteration: the ratio is 1 everywhere), and the paper's
num_iterations > 1, where the batch carries the log-probabilities of the policy that sampled it (here a perturbed
copy of the model, as after an update), at temperature 0.7: the clipped ratio is then active on some tokens and
not on others (asserted from TRL's own clip-ratio metrics).

In float64 without autocast (``bf16=False``; TRL's default autocasts to bf16): the fast path runs the forward in
two row chunks, and in float32 the summation order of the parameter gradients then moves them by ~1e-4 (identical
prompts make + and - advantage rows cancel). TRL's fused LM head sums the log-probs in float32 whatever the model's
precision, while the subclass keeps a float64 model's in float64 (``GrailGRPOTrainer._logps_and_entropies``): the
two agree to float32's precision.
"""

from __future__ import annotations

import copy

import pytest
import torch
from trainer_support import COMPLETIONS, boxed_batch, make_trainer

ADVANTAGES = [1.0, -1.0, 0.5, -0.5, 0.0, 1.0]
SETTINGS = {
    "on_policy": {},
    "two_iterations_clipped_t0.7": {"num_iterations": 2, "temperature": 0.7},
}
# Parameter noise of the sampling policy: large enough that some token ratios leave [1 - 0.2, 1 + 0.2].
BEHAVIOUR_NOISE = 0.05


def loss_and_grads(trainer, batch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    trainer.model.train()
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, batch)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in trainer.model.parameters()]


def assert_same(first, second) -> None:
    torch.testing.assert_close(first[0], second[0], rtol=1e-6, atol=1e-9, check_dtype=False)
    for a, b in zip(first[1], second[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def float64_trainer(model_dir, tmp_path, **overrides):
    return make_trainer(model_dir, tmp_path, dtype=torch.float64, bf16=False, **overrides)


@pytest.fixture(params=list(SETTINGS))
def setting(request) -> dict:
    return SETTINGS[request.param]


def behaviour_logps(trainer, batch) -> torch.Tensor:
    """Per-token log-probabilities of the completions under a perturbed copy of the trainer's model (the policy
    that sampled them, one update ago), at the trainer's temperature: what TRL stores as old_per_token_logps."""
    behaviour = copy.deepcopy(trainer.model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in behaviour.parameters():
            parameter.add_(BEHAVIOUR_NOISE * torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype))
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        logps, *_ = trainer._get_per_token_logps_and_entropies(
            behaviour, input_ids, attention_mask, batch["completion_ids"].size(1)
        )
    return logps


@pytest.fixture
def batch(random_model_dir, tmp_path, setting):
    trl = float64_trainer(random_model_dir, tmp_path, trl_baseline=True, **setting)
    batch = boxed_batch(trl.processing_class, COMPLETIONS, ADVANTAGES)
    if setting.get("num_iterations", 1) > 1:
        batch["old_per_token_logps"] = behaviour_logps(trl, batch)
    return batch


def assert_clipping(trainer, setting) -> None:
    """TRL's own metric: the fraction of completion tokens whose ratio the clip holds (0 on-policy)."""
    clipped = trainer._metrics["train"]["clip_ratio/region_mean"][-1]
    if setting.get("num_iterations", 1) > 1:
        assert 0 < clipped < 1, clipped
    else:
        assert clipped == 0


@pytest.fixture
def trl_result(random_model_dir, tmp_path, batch, setting):
    trl = float64_trainer(random_model_dir, tmp_path, trl_baseline=True, **setting)
    result = loss_and_grads(trl, batch)
    assert_clipping(trl, setting)
    return result


def test_grpo_credit_is_trl(random_model_dir, tmp_path, batch, trl_result, setting):
    grpo = float64_trainer(random_model_dir, tmp_path, credit="grpo", **setting)
    assert_same(loss_and_grads(grpo, batch), trl_result)
    assert_clipping(grpo, setting)


@pytest.mark.parametrize("recompute", ["every_step", "per_generation"])
def test_grail_with_unit_weights_is_trl(random_model_dir, tmp_path, batch, trl_result, setting, recompute):
    grail = float64_trainer(
        random_model_dir,
        tmp_path,
        credit="grail",
        grail_w_min=1.0,
        grail_w_max=1.0,
        grail_recompute=recompute,
        **setting,
    )
    grail.model.train()
    if recompute == "per_generation":  # what _generate_and_score_completions adds to the round
        batch = {**batch, "credit_weights": grail._credit_weights(grail.model, batch, share_loss_forward=False)}
    assert_same(loss_and_grads(grail, batch), trl_result)
    assert_clipping(grail, setting)
    assert grail._metrics["train"]["grail/saliency_rows_frac"][-1] == pytest.approx(
        3 / 6
    )  # rows 0, 1, 3: a box and A != 0


def test_grail_loss_is_trl_loss_of_weighted_advantages(random_model_dir, tmp_path, batch, setting):
    reference = float64_trainer(random_model_dir, tmp_path, credit="grail", grail_implementation="reference", **setting)
    reference.model.train()
    weights = reference._credit_weights(reference.model, batch, share_loss_forward=False)
    assert not torch.allclose(weights, batch["completion_mask"].float())
    weighted = {**batch, "advantages": batch["advantages"][:, None] * weights}
    expected = loss_and_grads(float64_trainer(random_model_dir, tmp_path, trl_baseline=True, **setting), weighted)
    fast = float64_trainer(random_model_dir, tmp_path, credit="grail", **setting)
    assert_same(loss_and_grads(fast, batch), expected)
    assert_clipping(fast, setting)
    metrics = fast._metrics["train"]
    assert metrics["grail/advantages_scale_ratio"][-1] == pytest.approx(
        metrics["grail/advantages_weighted_abs_mean"][-1] / metrics["grail/advantages_raw_abs_mean"][-1]
    )
