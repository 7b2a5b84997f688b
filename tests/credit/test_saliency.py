"""saliency_scores / saliency_from_grad (spec 1.2-1.4) against an independent float64 computation."""

from __future__ import annotations

import copy

import pytest
import torch

from pipeline.credit import find_boxed_spans, grail_weights, saliency_from_grad, saliency_scores

NUM_LAYERS = 4
LEAF_LAYER = {"first": 1, "middle": NUM_LAYERS // 2, "last": NUM_LAYERS - 1}  # hidden_states index, spec 1.2


def reference_scores(model, input_ids, attention_mask, answer_mask, leaf, temperature, position):
    """Full causal-LM forward on a detached embedding leaf, full-vocabulary log-softmax, per-element loops."""
    B, T = answer_mask.shape
    P = input_ids.shape[1] - T
    embeddings = model.model.embed_tokens.weight[input_ids].detach().clone().requires_grad_(True)
    captured = {}
    if leaf != "embeddings":  # hidden_states[k] is the output of decoder layer k (1-based)
        layer = model.model.layers[LEAF_LAYER[leaf] - 1]
        handle = layer.register_forward_hook(lambda module, args, output: captured.setdefault("h", output))
    logits = model(inputs_embeds=embeddings, attention_mask=attention_mask, use_cache=False).logits
    if leaf != "embeddings":
        handle.remove()
    activation = captured.get("h", embeddings)
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    loss = 0.0
    for i in range(B):
        for t in range(T):
            if answer_mask[i, t]:
                loss = loss - logprobs[i, P + t - 1, input_ids[i, P + t]]
    (grad,) = torch.autograd.grad(loss, activation)
    shift = -1 if position == "previous" else 0
    scores = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        for t in range(T):
            p = P + t + shift
            product = grad[i, p] * activation[i, p]
            scores[i, t] = torch.sqrt(torch.dot(product, product))
    return scores


@pytest.mark.parametrize("leaf", ["embeddings", "first", "middle", "last"])
@pytest.mark.parametrize("position", ["previous", "same"])
def test_matches_float64_reference(model64, batch, answer_mask, leaf, position):
    temperature = 0.7
    args = (model64, batch["input_ids"], batch["attention_mask"], answer_mask)
    scores = saliency_scores(*args, leaf=leaf, temperature=temperature, position=position)
    expected = reference_scores(*args, leaf, temperature, position)
    assert scores.dtype == torch.float32 and scores.shape == answer_mask.shape
    torch.testing.assert_close(scores.double(), expected, rtol=1e-5, atol=1e-12)
    assert expected[answer_mask].gt(0).any()
    assert all(p.grad is None for p in model64.parameters())


def test_causality_and_no_parameter_grad(small_model, batch, answer_mask):
    small_model.train()  # mode is the caller's; dropout is 0 in the tiny config
    try:
        scores = saliency_scores(small_model, batch["input_ids"], batch["attention_mask"], answer_mask)
    finally:
        small_model.eval()
    assert all(p.grad is None for p in small_model.parameters())
    ends = answer_mask.cumsum(dim=1).argmax(dim=1) + 1  # one past each row's last answer token
    for row, end in enumerate(ends.tolist()):
        assert scores[row, end:].eq(0).all() if answer_mask[row].any() else scores[row].eq(0).all()
    no_answer = saliency_scores(small_model, batch["input_ids"], batch["attention_mask"], torch.zeros_like(answer_mask))
    assert no_answer.eq(0).all()


def test_saliency_from_grad_known_answer():
    # P = 1, T = 2, d = 2: positions 0 (prompt), 1, 2 (completion).
    grad = torch.tensor([[[1.0, 2.0], [3.0, 0.0], [0.0, -1.0]]])
    activation = torch.tensor([[[3.0, 2.0], [1.0, 5.0], [4.0, 2.0]]])
    # products: [3, 4] -> 5, [3, 0] -> 3, [0, -2] -> 2
    assert saliency_from_grad(grad, activation, 2).tolist() == [[5.0, 3.0]]
    assert saliency_from_grad(grad, activation, 2, position="same").tolist() == [[3.0, 2.0]]
    with pytest.raises(ValueError, match="position"):
        saliency_from_grad(grad, activation, 2, position="next")


def test_saliency_from_grad_matches_a_captured_pass(model64, batch, answer_mask):
    """The fast path's ingredients: the leaf activation of an ordinary forward pass and its gradient."""
    T = answer_mask.shape[1]
    captured = {}
    layer = model64.model.layers[LEAF_LAYER["middle"] - 1]
    handle = layer.register_forward_hook(lambda module, args, output: captured.setdefault("h", output))
    logits = model64(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    handle.remove()
    logprobs = torch.log_softmax(logits[:, -(T + 1) : -1], dim=-1)
    token_logprobs = logprobs.gather(-1, batch["input_ids"][:, -T:, None]).squeeze(-1)
    (grad,) = torch.autograd.grad(-(token_logprobs * answer_mask).sum(), captured["h"])
    for position in ("previous", "same"):
        expected = saliency_scores(
            model64, batch["input_ids"], batch["attention_mask"], answer_mask, leaf="middle", position=position
        )
        torch.testing.assert_close(saliency_from_grad(grad, captured["h"].detach(), T, position), expected)
    assert all(p.grad is None for p in model64.parameters())


def test_bad_leaf(small_model, batch, answer_mask):
    with pytest.raises(ValueError, match="leaf"):
        saliency_scores(small_model, batch["input_ids"], batch["attention_mask"], answer_mask, leaf="final")


def test_grail_in_bf16_agrees_with_fp32_within_the_tolerance_bf16_rounding_allows(
    small_model, char_tokenizer, batch, answer_mask
) -> None:
    """The paper trains in bf16; the CPU studies in fp32. bf16 keeps 8 significant bits (unit roundoff
    u = 2^-9, 0.2 %); through the small model's forward and backward the saliency s = |g . h| stays within
    R = 10u = 2 % relative (0.7 % measured). A weight is mean + std (lambda - mu) / sigma with lambda = ln s
    (spec 1.6), and d lambda = ds / s, so it moves by at most about 2 std R / sigma (lambda and its row mean mu
    both move): with std = 0.5 and each row's sigma of lambda (about 6 here) the bound is about 3e-3 (3e-4
    measured). A larger gap is an error beyond bf16's rounding."""
    spans = find_boxed_spans(char_tokenizer, batch["completion_ids"], batch["completion_mask"])
    mask, std, relative = batch["completion_mask"], 0.5, 10 * 2.0**-9
    advantages = torch.tensor([1.0, -1.0, 0.5])
    inputs = (batch["input_ids"], batch["attention_mask"], answer_mask)
    fp32 = saliency_scores(small_model, *inputs)
    bf16 = saliency_scores(copy.deepcopy(small_model).to(torch.bfloat16), *inputs).float()
    valid = mask.bool() & answer_mask.any(dim=1, keepdim=True)
    torch.testing.assert_close(bf16[valid], fp32[valid], rtol=relative, atol=1e-30)
    weights32, weights16 = (grail_weights(s, mask, advantages, spans, std=std) for s in (fp32, bf16))
    for row in valid.any(dim=1).nonzero().squeeze(-1).tolist():
        sigma = torch.log(fp32[row][valid[row]] + 1e-8).std(unbiased=False).item()
        difference = (weights16[row] - weights32[row]).abs().max().item()
        assert difference <= 2 * std * relative / sigma, (row, difference, sigma)
