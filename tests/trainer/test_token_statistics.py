"""``CreditInputs.token_statistics()`` (docs/credit-methods.md "Log-probs and entropies"): the policy's per-token
log-probs and entropies at the sampling temperature, from the loss's own forward in training (memoised: the loss
makes none) and from a plain forward in the viewer's ``OfflineHost``; and the docs' example method
docs/examples/entropy_weights.py, trained, adds no forward to a micro-step.

Broken on purpose to check these tests: ``OfflineHost.loss_forward`` without the temperature fails the first; the
example's ``shares_loss_forward`` returning False (its own no-grad forward, then the loss's) makes two forwards per
micro-step and fails the last, and so does ``token_statistics`` without ``memoise_loss_forward``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from trainer_support import COMPLETIONS, boxed_batch, make_trainer

from pipeline.credit.method import CreditInputs, OfflineHost, full_sequence

DOCS = Path(__file__).resolve().parents[2] / "docs"  # the example is importable as examples.entropy_weights
TEMPERATURE = 0.7  # the default and quick studies' sampling temperature: not 1, so a missing scaling shows
PRECISION = {"bf16": False}  # fp32 as the studies on the CPU (TRL's default autocasts to bf16: 5e-3 apart)


@pytest.fixture
def examples_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(DOCS))


def reference_statistics(model, batch: dict, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """log π_τ(y_t) and the entropy of π_τ = softmax(logits / τ) from the model's plain logits, 0 on padding, as
    ``dtype`` (computed in float64)."""
    input_ids, attention_mask = full_sequence(batch)
    T = batch["completion_ids"].size(1)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -T - 1 : -1] / TEMPERATURE
    logprobs = torch.log_softmax(logits.double(), dim=-1)
    mask = batch["completion_mask"].bool()
    chosen = logprobs.gather(-1, batch["completion_ids"][..., None]).squeeze(-1)
    entropy = -(logprobs.exp() * logprobs).sum(-1)
    return torch.where(mask, chosen, 0.0).to(dtype), torch.where(mask, entropy, 0.0).to(dtype)


def test_a_float64_models_loss_log_probs_stay_in_float64(random_model_dir, tmp_path):
    """TRL's fused LM head sums and back-propagates in float32, so a float64 model's loss moved with MKL's branch
    (1e-7 relative, docs/lab-notes.md); the trainer computes a float64 model's from its logits, in float64, in
    chunks of TRL's ``batch_size`` too. Broken on purpose (the float64 branch removed), it gets float32 log-probs."""
    trainer = make_trainer(random_model_dir, tmp_path, dtype=torch.float64, temperature=TEMPERATURE, **PRECISION)
    batch = boxed_batch(trainer.processing_class, COMPLETIONS, [1.0, -1.0, 0.5, -0.5, 0.0, 1.0])
    input_ids, attention_mask = full_sequence(batch)
    T = batch["completion_ids"].size(1)
    logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, input_ids, attention_mask, T, batch_size=4, compute_entropy=True
    )
    expected_logps, expected_entropies = reference_statistics(trainer.model, batch, torch.float64)
    torch.testing.assert_close(logps.detach(), expected_logps, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(entropies.detach(), expected_entropies, rtol=1e-13, atol=1e-13)
    logps.sum().backward()
    head = trainer.accelerator.unwrap_model(trainer.model).get_output_embeddings().weight
    assert head.grad is not None and head.grad.dtype == torch.float64


def test_statistics_are_the_losss_at_the_sampling_temperature_in_training_and_offline(random_model_dir, tmp_path):
    trainer = make_trainer(random_model_dir, tmp_path, temperature=TEMPERATURE, **PRECISION)
    batch = boxed_batch(trainer.processing_class, COMPLETIONS, [1.0, -1.0, 0.5, -0.5, 0.0, 1.0])
    logps, entropies = reference_statistics(trainer.model, batch)

    shared = CreditInputs(batch, None, trainer.model, trainer, share_loss_forward=True)
    statistics = shared.token_statistics()
    torch.testing.assert_close(statistics.logps, logps, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(statistics.entropies, entropies, atol=1e-4, rtol=1e-4)
    assert statistics.logps.shape == batch["completion_ids"].shape and not statistics.logps.requires_grad
    memoised = trainer._memoised_forward  # the loss's forward, with its graph, for the loss to use
    assert memoised is not None and memoised[0].requires_grad
    assert shared.token_statistics() is statistics and trainer._memoised_forward is memoised  # one forward
    trainer._memoised_forward = None

    own = CreditInputs(batch, None, trainer.model, trainer, share_loss_forward=False).token_statistics()
    torch.testing.assert_close(own.entropies, statistics.entropies)
    assert trainer._memoised_forward is None

    model = trainer.accelerator.unwrap_model(trainer.model)
    host = OfflineHost(trainer.args, Accelerator(cpu=True))
    offline = CreditInputs(batch, None, model, host, share_loss_forward=False).token_statistics()
    torch.testing.assert_close(offline.logps, logps, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(offline.entropies, entropies, atol=1e-4, rtol=1e-4)
    with pytest.raises(RuntimeError, match="no loss forward outside training"):
        CreditInputs(batch, None, model, host, share_loss_forward=True).token_statistics()


def loss_forwards_per_micro_step(trainer) -> list[int]:
    """Train, counting the policy's forwards (its backbone's calls) inside each ``_compute_loss``: the loss's own
    and any a credit method adds at that micro-step; generation's forwards fall outside."""
    backbone = trainer.accelerator.unwrap_model(trainer.model).model
    calls, per_step = [0], []
    backbone.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    compute_loss = trainer._compute_loss

    def counted(model, inputs):
        before = calls[0]
        try:
            return compute_loss(model, inputs)
        finally:
            per_step.append(calls[0] - before)

    trainer._compute_loss = counted
    trainer.train()
    return per_step


def test_entropy_example_trains_with_one_forward_per_micro_step_as_grpo(random_model_dir, tmp_path, examples_on_path):
    settings = {"temperature": TEMPERATURE, "max_steps": 2, "max_completion_length": 16, **PRECISION}
    grpo = make_trainer(random_model_dir, tmp_path / "grpo", credit="grpo", **settings)
    example = make_trainer(
        random_model_dir,
        tmp_path / "entropy",
        credit="examples.entropy_weights",
        credit_options={"scale": 1.0, "w_min": 0.25, "w_max": 4.0},
        **settings,
    )
    assert loss_forwards_per_micro_step(grpo) == [1, 1]
    assert loss_forwards_per_micro_step(example) == [1, 1]
    for trainer in (grpo, example):  # the trainer's own count, as metrics.jsonl shows it
        assert [row["credit/loss_forwards"] for row in trainer.state.log_history if "loss" in row] == [1.0, 1.0]
    logged = [row for row in example.state.log_history if "entropy_weights/weight_std" in row]
    assert logged and all(row["entropy_weights/weight_std"] > 0 for row in logged)  # weights that vary
    assert all(row["entropy_weights/entropy_mean"] > 0 for row in logged)


def test_token_viewer_weights_the_entropy_example_offline(random_model_dir, tmp_path, examples_on_path):
    """The viewer's path (``pipeline.evaluation.offline_credit.method_result``, an ``OfflineHost``): the example's weights on
    every real token, within its clip, 0 on padding."""
    from pipeline.evaluation.offline_credit import credit_methods, method_result

    trainer = make_trainer(random_model_dir, tmp_path, **PRECISION)
    batch = boxed_batch(trainer.processing_class, COMPLETIONS, [1.0, -1.0, 0.5, -0.5, 0.0, 1.0])
    methods, unweighted = credit_methods({"entropy": {"credit": "examples.entropy_weights"}}, TEMPERATURE, seed=0)
    model = trainer.accelerator.unwrap_model(trainer.model)
    weights = method_result(methods["entropy"], model, trainer.processing_class, batch).weights
    mask = batch["completion_mask"].bool()
    assert not unweighted and weights.shape == mask.shape and not weights[~mask].any()
    assert ((weights[mask] >= 0.5) & (weights[mask] <= 2.0)).all() and weights[mask].std() > 0
