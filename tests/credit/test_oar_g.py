"""OAR-G weights (spec 2): hand-checked reshaping, a float64 reference of the whole function, properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.credit import (
    oar_g_reshape,
    oar_g_weights,
    oar_g_weights_with_stats,
)
from pipeline.credit.oar_g import completion_noise


def test_reshape_known_answer():
    importance = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 0.0], [0.0, 1.0, 2.0, 3.0, 4.0, 0.0]])
    scores = torch.expm1(importance)  # log1p(scores) = importance
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0]])
    weights, fallback = oar_g_reshape(scores, mask, torch.tensor([True, False]))
    # Ihat = 0, .25, .5, .75, 1; q = floor(5 * 0.4) = 2 -> tau = .5; w = .1, .5, 1, 2, 3 (sum 6.6); x 5 / 6.6
    expected = [w * 5 / 6.6 for w in (0.1, 0.5, 1.0, 2.0, 3.0)] + [0.0]
    torch.testing.assert_close(weights[0], torch.tensor(expected), rtol=1e-5, atol=1e-6)
    assert weights[1].tolist() == [1.0] * 5 + [0.0]
    assert fallback.tolist() == [False, True]


def test_reshape_nonfinite_rows_fall_back():
    scores = torch.tensor([[1.0, float("nan"), 2.0], [1.0, 2.0, float("nan")]])
    weights, fallback = oar_g_reshape(scores, torch.tensor([[1, 1, 1], [1, 1, 0]]), torch.tensor([True, True]))
    assert fallback.tolist() == [True, False]
    assert weights[0].tolist() == [1.0, 1.0, 1.0] and torch.isfinite(weights).all()


def reference_oar_g(model, input_ids, attention_mask, completion_mask, answer_mask, noise, tau, beta, eps):
    """Spec 2 in float64 with full-vocabulary logits and plain loops; ``noise`` (B, T, d) is xi."""
    B, T = answer_mask.shape
    P = input_ids.shape[1] - T
    head = model.lm_head.weight.detach()
    embeddings = model.model.embed_tokens.weight[input_ids].detach().clone()

    def mean_answer_logits(inputs_embeds):
        hidden = model.model(inputs_embeds=inputs_embeds, attention_mask=attention_mask).last_hidden_state
        logits = hidden @ head.T
        rows = []
        for i in range(B):
            picked = [logits[i, P + t - 1] for t in range(T) if answer_mask[i, t]]
            rows.append(sum(picked) / max(len(picked), 1) if picked else torch.zeros(head.shape[0], dtype=head.dtype))
        return torch.stack(rows)

    with torch.no_grad():
        clean = torch.softmax(mean_answer_logits(embeddings), dim=-1)
    noisy = embeddings.clone()
    for t in range(T):
        noisy[:, P + t - 1] += noise[:, t]
    noisy.requires_grad_(True)
    noisy_logprobs = torch.log_softmax(mean_answer_logits(noisy), dim=-1)
    loss = sum(
        (clean[i] * (torch.log(clean[i] + eps) - noisy_logprobs[i])).sum() for i in range(B) if answer_mask[i].any()
    )
    (grad,) = torch.autograd.grad(loss, noisy)
    weights = []
    for i in range(B):
        valid = [t for t in range(T) if completion_mask[i, t]]
        if not answer_mask[i].any():
            weights.append([float(completion_mask[i, t]) for t in range(T)])
            continue
        importance = {t: math.log1p(abs(torch.dot(grad[i, P + t - 1], noisy[i, P + t - 1]).item())) for t in valid}
        low, high = min(importance.values()), max(importance.values())
        normalized = {t: (v - low) / (high - low + eps) for t, v in importance.items()}
        q = min(max(math.floor(len(valid) * tau), 0), len(valid) - 1)
        threshold = sorted(normalized.values())[q]
        raw = {
            t: max(v / (threshold + eps), 0.1) if v < threshold else 1 + beta * (v - threshold) / (1 - threshold + eps)
            for t, v in normalized.items()
        }
        total = sum(raw.values())
        weights.append([raw[t] * len(valid) / (total + 1e-8) if t in raw else 0.0 for t in range(T)])
    return torch.tensor(weights, dtype=torch.float64)


@pytest.mark.parametrize(("tau", "beta"), [(0.4, 2.0), (0.7, 0.5)])
def test_matches_float64_reference(model64, batch, answer_mask, tau, beta):
    B, T = answer_mask.shape
    args = (model64, batch["input_ids"], batch["attention_mask"], batch["completion_mask"], answer_mask)
    noise_std = 0.05  # large enough that the noise shapes the gradient
    weights = oar_g_weights(*args, tau=tau, beta=beta, noise_std=noise_std, generator=torch.Generator().manual_seed(3))
    # The noise as oar_g_weights draws it: float32 N(0, 1) of shape (B, T, d) from the generator, times std.
    noise = torch.randn((B, T, 32), generator=torch.Generator().manual_seed(3)) * noise_std
    expected = reference_oar_g(*args, noise.double(), tau, beta, 1e-12)
    torch.testing.assert_close(weights.double(), expected, rtol=1e-4, atol=1e-5)
    assert all(p.grad is None for p in model64.parameters())


def test_noise_only_on_positions_that_predict_the_completion():
    embeddings = torch.zeros(2, 7, 4)
    noise = completion_noise(embeddings, 3, 1.0, torch.Generator().manual_seed(0))
    touched = noise.ne(0).any(dim=-1)
    assert touched.tolist() == [[False, False, False, True, True, True, False]] * 2


def test_generator_seeds_the_noise(small_model, batch, answer_mask):
    args = (small_model, batch["input_ids"], batch["attention_mask"], batch["completion_mask"], answer_mask)

    def run(seed):
        return oar_g_weights(*args, noise_std=0.5, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(run(1), run(1))
    assert not torch.equal(run(1), run(2))


def test_stats_and_all_fallback(small_model, batch, answer_mask):
    args = (small_model, batch["input_ids"], batch["attention_mask"], batch["completion_mask"])
    weights, stats = oar_g_weights_with_stats(*args, answer_mask, generator=torch.Generator().manual_seed(0))
    valid = batch["completion_mask"].bool()
    assert stats["fallback_rate"] == pytest.approx(1 / 3) and stats["answer_found_rate"] == pytest.approx(2 / 3)
    assert stats["weight_mean"] == pytest.approx(weights[valid].double().mean().item(), abs=1e-6)
    assert stats["weight_std"] == pytest.approx(weights[valid].double().std().item(), abs=1e-6)
    none, stats = oar_g_weights_with_stats(*args, torch.zeros_like(answer_mask))
    assert torch.equal(none, valid.float()) and stats["fallback_rate"] == 1.0


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), data=st.data())
def test_weights_properties(small_model, batch, seed, data):
    B, T = batch["completion_mask"].shape
    lengths = batch["completion_mask"].sum(dim=1).tolist()
    answer_mask = torch.zeros(B, T, dtype=torch.bool)
    for row, n in enumerate(lengths):
        if data.draw(st.booleans()):
            start = data.draw(st.integers(0, n - 1))
            answer_mask[row, start : data.draw(st.integers(start + 1, n))] = True
    tau, beta = data.draw(st.sampled_from([0.0, 0.4, 0.9])), data.draw(st.sampled_from([0.5, 2.0]))
    weights = oar_g_weights(
        small_model, batch["input_ids"], batch["attention_mask"], batch["completion_mask"], answer_mask,
        tau=tau, beta=beta, noise_std=0.1, generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip
    check_reshaped(weights, batch["completion_mask"].bool(), answer_mask.any(dim=1), beta)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_reshape_properties(data):
    B, T = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 12))
    scores = torch.tensor(
        data.draw(st.lists(st.lists(st.floats(0, 1e4), min_size=T, max_size=T), min_size=B, max_size=B))
    )
    lengths = data.draw(st.lists(st.integers(0, T), min_size=B, max_size=B))
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    has_answer = torch.tensor(data.draw(st.lists(st.booleans(), min_size=B, max_size=B)))
    beta = data.draw(st.sampled_from([0.5, 2.0]))
    weights, _ = oar_g_reshape(scores, mask, has_answer, tau=data.draw(st.floats(0, 1)), beta=beta)
    check_reshaped(weights, mask, has_answer, beta)


def check_reshaped(weights, valid, has_answer, beta):
    """Fallback rows are 1 on valid tokens; others have mean 1 and weights in the renormalized [0.1, 1 + beta]."""
    assert torch.isfinite(weights).all() and weights[~valid].eq(0).all()
    for row in range(weights.shape[0]):
        values = weights[row][valid[row]].double()
        if not has_answer[row]:
            assert values.eq(1).all()
        elif values.numel():
            assert values.mean().item() == pytest.approx(1.0, rel=1e-5)
            assert values.max().item() <= values.min().item() * (1 + beta) / 0.1 * (1 + 1e-5)
            assert values.min().item() >= 0.1 / (1 + beta) * (1 - 1e-5)
