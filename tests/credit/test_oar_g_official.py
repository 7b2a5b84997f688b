"""OAR-G as the OAR paper's official code defines it: known answers of the reshaping (numpy, as the official code
computes it), and a float64 reference of the whole weight function with plain per-row loops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.credit import oar_g_official_weights, oar_g_official_weights_with_stats, oar_g_weights
from pipeline.credit.oar_g_official import official_reshape, reasoning_mask, reasoning_noise


def numpy_reshape(scores: np.ndarray, tau: float, beta: float) -> np.ndarray:
    """The official reshaping of one row's reasoning scores, in numpy (np.quantile, 1e-8, sum to L)."""
    log_score = np.log1p(scores)
    spread = log_score.max() - log_score.min()
    normalized = (log_score - log_score.min()) / (spread if spread > 0 else 1.0)
    threshold = np.quantile(normalized, tau)
    weights = np.where(
        normalized < threshold,
        np.maximum(normalized / (threshold + 1e-8), 0.1),
        1.0 + beta * (normalized - threshold) / (1.0 - threshold + 1e-8),
    )
    return weights * (len(weights) / (weights.sum() + 1e-8))


def test_reshape_known_answer():
    # Ihat = 0, .25, .5, .75, 1; np.quantile(., 0.4) = 0.4 (interpolated; upstream's floor index would give 0.5)
    importance = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 9.0]], dtype=torch.float64)
    reasoning = torch.tensor([[True] * 5 + [False]])
    weights = official_reshape(torch.expm1(importance), reasoning, tau=0.4, beta=2.0)
    raw = [
        0.1,
        0.25 / (0.4 + 1e-8),
        1 + 2 * 0.1 / (0.6 + 1e-8),
        1 + 2 * 0.35 / (0.6 + 1e-8),
        1 + 2 * 0.6 / (0.6 + 1e-8),
    ]
    expected = [w * 5 / (sum(raw) + 1e-8) for w in raw] + [1.0]  # the answer token keeps weight 1
    torch.testing.assert_close(weights[0], torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("tau", [0.4, 0.55, 0.9])
def test_reshape_matches_numpy(tau):
    scores = np.random.default_rng(0).exponential(size=(3, 11))
    reasoning = torch.ones(3, 11, dtype=torch.bool)
    ours = official_reshape(torch.tensor(scores), reasoning, tau=tau, beta=1.5).numpy()
    for row in range(3):
        np.testing.assert_allclose(ours[row], numpy_reshape(scores[row], tau, 1.5), rtol=1e-12)


def test_reshape_of_equal_scores_and_of_a_row_without_reasoning():
    weights = official_reshape(
        torch.full((2, 4), 3.0), torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0]]).bool(), tau=0.4, beta=2
    )
    # all equal: Ihat = 0 = threshold, so every token is boosted by 0 -> 1, and the renormalization keeps 1
    torch.testing.assert_close(weights, torch.ones(2, 4))


def test_reasoning_is_the_valid_completion_before_the_first_answer_token():
    completion_mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    answer_mask = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1]]).bool()
    assert reasoning_mask(completion_mask, answer_mask).int().tolist() == [
        [1, 1, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
    ]


def test_noise_only_at_the_reasoning_tokens_own_positions():
    embeddings = torch.zeros(1, 7, 4)  # P = 3, T = 4
    noise = reasoning_noise(embeddings, torch.tensor([[1, 1, 0, 0]]).bool(), 1.0, torch.Generator().manual_seed(0))
    assert noise.ne(0).any(dim=-1).tolist() == [[False, False, False, True, True, False, False]]


def reference_official(model, input_ids, attention_mask, completion_mask, answer_mask, noise, tau, beta, eps):
    """The official code's computation in float64, row by row; ``noise`` (B, T, d) is drawn at completion index t
    and added at the reasoning tokens' own input positions P+t."""
    B, T = answer_mask.shape
    P = input_ids.shape[1] - T
    head = model.lm_head.weight.detach()
    weights = completion_mask.double().clone()
    for i in range(B):
        answer = [t for t in range(T) if answer_mask[i, t]]
        if not answer:
            continue
        reasoning = [t for t in range(answer[0]) if completion_mask[i, t]]
        if not reasoning:  # the official code has nothing to score: the row keeps weight 1
            continue
        ids, mask = input_ids[i : i + 1], attention_mask[i : i + 1]
        embeds = model.model.embed_tokens.weight[ids].detach().clone()

        def mean_answer_logits(inputs_embeds, ids_mask=mask, answer=answer):
            logits = model.model(inputs_embeds=inputs_embeds, attention_mask=ids_mask).last_hidden_state[0] @ head.T
            return torch.stack([logits[P + t - 1] for t in answer]).mean(dim=0)

        with torch.no_grad():
            p0 = torch.softmax(mean_answer_logits(embeds), dim=-1)
        leaf = embeds.clone().requires_grad_(True)
        noisy = leaf.clone()  # noise below at P+t
        for t in reasoning:
            noisy[0, P + t] = noisy[0, P + t] + noise[i, t]
        divergence = torch.sum(p0 * (torch.log(p0 + eps) - torch.log_softmax(mean_answer_logits(noisy), dim=-1)))
        (grad,) = torch.autograd.grad(divergence, leaf)
        scores = np.array([abs(torch.dot(grad[0, P + t], embeds[0, P + t]).item()) for t in reasoning])
        for t, w in zip(reasoning, numpy_reshape(scores, tau, beta), strict=True):
            weights[i, t] = w
    return weights


@pytest.mark.parametrize(("tau", "beta"), [(0.4, 2.0), (0.7, 0.5)])
def test_matches_float64_reading_of_the_official_code(model64, batch, answer_mask, tau, beta):
    B, T = answer_mask.shape
    args = (model64, batch["input_ids"], batch["attention_mask"], batch["completion_mask"], answer_mask)
    noise_std = 0.05
    weights = oar_g_official_weights(
        *args, tau=tau, beta=beta, noise_std=noise_std, generator=torch.Generator().manual_seed(3)
    )
    noise = torch.randn((B, T, 32), generator=torch.Generator().manual_seed(3)) * noise_std
    expected = reference_official(*args, noise.double(), tau, beta, 1e-12)
    # mean_answer_logits returns float32 logits (as for upstream's OAR-G), which bounds the agreement
    torch.testing.assert_close(weights.double(), expected, rtol=1e-4, atol=1e-5)
    assert all(p.grad is None for p in model64.parameters())


def test_differs_from_upstreams_oar_g_and_keeps_answer_tokens_at_one(small_model, batch, answer_mask):
    args = (small_model, batch["input_ids"], batch["attention_mask"], batch["completion_mask"], answer_mask)
    official, stats = oar_g_official_weights_with_stats(*args, generator=torch.Generator().manual_seed(0))
    upstream = oar_g_weights(*args, generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(official, upstream)
    assert official[answer_mask].eq(1).all()
    reasoning = reasoning_mask(batch["completion_mask"], answer_mask)
    for row in range(official.shape[0]):
        if reasoning[row].any():  # renormalized to mean 1 over the reasoning tokens
            assert official[row][reasoning[row]].mean().item() == pytest.approx(1.0, abs=1e-5)
    assert stats["answer_found_rate"] == pytest.approx(2 / 3)
