"""OAR-G as the OAR paper's official code defines it (Valsure/Outcome-Grounded-Advantage-Reshaping, arXiv
2601.07408), the ``oar_g_variant: official`` option; ``pipeline.credit.oar_g`` is upstream GRAIL's OAR-G.

Only the reasoning segment R_i (the valid completion tokens before the first answer token) is scored, each token
at its own input position P+t, with noise on the reasoning positions only:

    zbar_i  = mean of the logits that predict the answer tokens,  P0_i = softmax(zbar_i(e)) (no gradient)
    J_i     = sum_v P0_{i,v} (ln(P0_{i,v} + eps) - log softmax(zbar_i(e + xi))_v),  xi ~ N(0, std^2) on R_i
    s_{i,t} = | sum_d dJ_i/de_{i,P+t,d} e_{i,P+t,d} |                   (clean embeddings, t in R_i)
    I       = ln(1 + s),  Ihat = (I - min_R I) / (max_R I - min_R I)  (divided by 1 when max = min)
    tau_i   = quantile(Ihat over R_i, tau), linearly interpolated (numpy's default, torch.quantile's too)
    w_t     = max(Ihat_t / (tau_i + 1e-8), 0.1) if Ihat_t < tau_i else 1 + beta (Ihat_t - tau_i) / (1 - tau_i + 1e-8)
    w_t    <- w_t |R_i| / (sum_R w + 1e-8)                                (the official code's sum_to_L)

Answer and post-answer tokens keep weight 1; rows without an answer, or without reasoning tokens, are all 1; then
x completion mask. The official loss is the per-sequence token mean (TRL ``loss_type: grpo``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pipeline.core.deferred import DeferredModule
from pipeline.credit.oar_g import SUPPRESS_FLOOR, mean_answer_logits
from pipeline.credit.stats import weight_stats

if TYPE_CHECKING:
    import torch
else:  # torch at first use: planning loads the credit methods without it (pipeline.core.deferred)
    torch = DeferredModule("torch")

OarGVariant = Literal["upstream", "official"]  # pipeline.credit.oar_g, or this module
OFFICIAL_EPS = 1e-8  # the official code's constant in the threshold ratios and the renormalization


def reasoning_mask(completion_mask: torch.Tensor, answer_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: valid completion tokens before each row's first answer token (none on rows without one)."""
    before_answer = answer_mask.long().cumsum(dim=-1).eq(0) & answer_mask.any(dim=-1, keepdim=True)
    return before_answer & completion_mask.bool()


def reasoning_noise(embeddings: torch.Tensor, reasoning: torch.Tensor, std: float, generator) -> torch.Tensor:
    """xi: N(0, std^2) at the input positions P+t of the reasoning tokens, zero elsewhere, shaped like embeddings."""
    B, _, d = embeddings.shape
    T = reasoning.shape[1]
    device = generator.device if generator is not None else embeddings.device
    noise = torch.randn((B, T, d), generator=generator, device=device, dtype=torch.float32) * std
    padded = torch.zeros_like(embeddings)
    padded[:, -T:] = noise.to(padded) * reasoning[..., None].to(padded)
    return padded


def official_scores(model, input_ids, attention_mask, answer_mask, noise, *, eps=1e-12) -> torch.Tensor:
    """s_{i,t} of the module docstring for every completion position t (B, T), in the model's working dtype."""
    T = answer_mask.shape[1]
    has_answer = answer_mask.any(dim=-1)
    decoder = model.get_decoder()
    with torch.no_grad():
        embeddings = model.get_input_embeddings()(input_ids)
        clean_hidden = decoder(inputs_embeds=embeddings, attention_mask=attention_mask, use_cache=False)
        clean = torch.softmax(mean_answer_logits(model, clean_hidden.last_hidden_state, answer_mask), dim=-1)
    leaf = embeddings.detach().requires_grad_(True)
    with torch.enable_grad():
        noisy_hidden = decoder(inputs_embeds=leaf + noise, attention_mask=attention_mask, use_cache=False)
        noisy_logprobs = torch.log_softmax(mean_answer_logits(model, noisy_hidden.last_hidden_state, answer_mask), -1)
        divergence = (clean * (torch.log(clean + eps) - noisy_logprobs)).sum(dim=-1)
        (grad,) = torch.autograd.grad((divergence * has_answer).sum(), leaf)
    dtype = torch.promote_types(grad.dtype, torch.float32)
    return (grad[:, -T:].to(dtype) * embeddings[:, -T:].to(dtype)).sum(dim=-1).abs()


def official_reshape(scores: torch.Tensor, reasoning: torch.Tensor, *, tau: float, beta: float) -> torch.Tensor:
    """Weights on the reasoning tokens (module docstring), 1 elsewhere; a row without reasoning tokens is all 1."""
    weights = torch.ones_like(scores)
    for row in range(scores.shape[0]):
        positions = reasoning[row].nonzero().squeeze(-1)
        if positions.numel() == 0:
            continue
        importance = torch.log1p(scores[row, positions])
        low, high = importance.min(), importance.max()
        normalized = (importance - low) / (high - low if high > low else 1.0)
        threshold = torch.quantile(normalized, tau)
        suppressed = (normalized / (threshold + OFFICIAL_EPS)).clamp(min=SUPPRESS_FLOOR)
        boosted = 1 + beta * (normalized - threshold) / (1 - threshold + OFFICIAL_EPS)
        raw = torch.where(normalized < threshold, suppressed, boosted)
        total = raw.sum()
        if total > 0:  # the official code keeps ones when the weights sum to zero
            weights[row, positions] = raw * positions.numel() / (total + OFFICIAL_EPS)
    return weights


def oar_g_official_weights_with_stats(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    answer_mask: torch.Tensor,
    *,
    tau: float = 0.4,
    beta: float = 2.0,
    eps: float = 1e-12,
    noise_std: float = 1e-3,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """(B, T) float32 weights of the module docstring and their stats (as ``oar_g_weights_with_stats``).

    ``eps`` smooths the divergence's logarithm (the official 1e-12); the reshaping uses the official 1e-8.
    """
    reasoning = reasoning_mask(completion_mask, answer_mask)
    has_answer = answer_mask.any(dim=-1)
    if reasoning.any():
        embeddings = model.get_input_embeddings()(input_ids)
        noise = reasoning_noise(embeddings, reasoning, noise_std, generator)
        scores = official_scores(model, input_ids, attention_mask, answer_mask, noise, eps=eps)
    else:
        scores = torch.zeros(answer_mask.shape, device=answer_mask.device)
    weights = official_reshape(scores, reasoning, tau=tau, beta=beta).float() * completion_mask
    stats = {
        "fallback_rate": (~reasoning.any(dim=-1)).float().mean().item(),
        "answer_found_rate": has_answer.float().mean().item(),
        **weight_stats(weights, completion_mask.bool()),
    }
    return weights, stats


def oar_g_official_weights(*args, **kwargs) -> torch.Tensor:
    """``oar_g_official_weights_with_stats`` without the statistics (the trainer logs its own)."""
    return oar_g_official_weights_with_stats(*args, **kwargs)[0]
