"""OAR-G token weights (spec 2): input-gradient attribution of the answer distribution, bi-level reshaping.

    zbar^0_i = mean over answer positions of the clean completion logits,      P0_i = softmax(zbar^0_i)
    e~       = e + xi,  xi ~ N(0, noise_std^2) at input positions P-1 .. P+T-2 only
    KL_i     = sum_v P0_{i,v} (ln(P0_{i,v} + eps) - log softmax(zbar^eps_i)_v),  Loss = sum_{i with answer} KL_i
    s_{i,t}  = | sum_d dLoss/de~_{i,P+t-1,d} e~_{i,P+t-1,d} |
    I_{i,t}  = ln(1 + s_{i,t}) m_{i,t},  Ihat = (I - min_i) / (max_i - min_i + eps)     (min/max over valid tokens)
    tau_i    = sorted valid Ihat_i [clamp(floor(n_i tau), 0, n_i - 1)]
    w_{i,t}  = max(Ihat / (tau_i + eps), 0.1) if Ihat < tau_i else 1 + beta (Ihat - tau_i) / (1 - tau_i + eps)
    w~_{i,t} = w m n_i / (sum_t w m + 1e-8)                                       (mean 1 over valid tokens)

Rows without an answer (and, as a robustness addition, rows with a non-finite score) get weight 1; then x m.
The mean answer logits are computed as head(mean answer hidden state), equal by linearity to the mean of the
logits and free of any (B, T, V) tensor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.core.deferred import DeferredModule
from pipeline.credit.saliency import at_least_float32, completion_hidden, detached_head
from pipeline.credit.stats import fraction, weight_stats

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # torch at first use: planning loads the credit methods without it (pipeline.core.deferred)
    torch = DeferredModule("torch")
    F = DeferredModule("torch.nn.functional")

SUPPRESS_FLOOR = 0.1
INVALID_OFFSET = 1e9
RENORM_EPS = 1e-8


def mean_answer_logits(model, last_hidden: torch.Tensor, answer_mask: torch.Tensor) -> torch.Tensor:
    """zbar_i = sum_t answer_{i,t} z_{i,t} / max(sum_t answer_{i,t}, 1), (B, V) at least float32, LM head
    detached."""
    weight, bias = detached_head(model)
    hidden = completion_hidden(last_hidden, answer_mask.shape[1])
    dtype = at_least_float32(hidden.dtype)  # average bf16 states in float32
    count = answer_mask.sum(dim=-1, keepdim=True)
    mean_hidden = (hidden.to(dtype) * answer_mask[..., None].to(dtype)).sum(dim=1) / count.clamp(min=1)
    logits = F.linear(mean_hidden.to(weight.dtype), weight).to(dtype)
    return logits if bias is None else logits + bias.to(dtype) * (count > 0)


def _last_hidden(model, embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    return model.get_decoder()(
        inputs_embeds=embeddings, attention_mask=attention_mask, use_cache=False
    ).last_hidden_state


def completion_noise(embeddings: torch.Tensor, T: int, std: float, generator: torch.Generator | None):
    """xi: N(0, std^2) at input positions P-1 .. P+T-2, zero elsewhere, shaped like ``embeddings``."""
    B, _, d = embeddings.shape
    device = generator.device if generator is not None else embeddings.device
    noise = torch.randn((B, T, d), generator=generator, device=device, dtype=torch.float32) * std
    padded = torch.zeros_like(embeddings)
    completion_hidden(padded, T).copy_(noise)
    return padded


def oar_g_scores(model, input_ids, attention_mask, answer_mask, *, eps=1e-12, noise_std=1e-3, generator=None):
    """s_{i,t} = |grad . input| of the KL between clean and noisy mean answer distributions, (B, T) at least
    float32."""
    T = answer_mask.shape[1]
    has_answer = answer_mask.any(dim=-1)
    with torch.no_grad():
        embeddings = model.get_input_embeddings()(input_ids)
        clean = torch.softmax(
            mean_answer_logits(model, _last_hidden(model, embeddings, attention_mask), answer_mask), -1
        )
        noisy_embeddings = (embeddings + completion_noise(embeddings, T, noise_std, generator)).requires_grad_(True)
    with torch.enable_grad():
        noisy_hidden = _last_hidden(model, noisy_embeddings, attention_mask)
        noisy_logprobs = torch.log_softmax(mean_answer_logits(model, noisy_hidden, answer_mask), dim=-1)
        kl = (clean * (torch.log(clean + eps) - noisy_logprobs)).sum(dim=-1)
        (grad,) = torch.autograd.grad((kl * has_answer).sum(), noisy_embeddings)
    dtype = at_least_float32(grad.dtype)
    products = completion_hidden(grad, T).to(dtype) * completion_hidden(noisy_embeddings.detach(), T).to(dtype)
    return products.sum(dim=-1).abs()


def oar_g_reshape(
    scores: torch.Tensor,
    completion_mask: torch.Tensor,
    has_answer: torch.Tensor,
    *,
    tau: float = 0.4,
    beta: float = 2.0,
    eps: float = 1e-12,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 5-9 of the module docstring: (weights (B, T) in the scores' precision, at least float32, fallback (B,)
    bool) from scores (B, T)."""
    valid = completion_mask.bool()
    dtype = at_least_float32(scores.dtype)
    m = valid.to(dtype)
    importance = torch.where(valid, torch.log1p(scores.to(dtype)), 0.0)
    low = (importance + (1 - m) * INVALID_OFFSET).amin(dim=-1, keepdim=True)
    high = (importance - (1 - m) * INVALID_OFFSET).amax(dim=-1, keepdim=True)
    normalized = (importance - low) / (high - low + eps)
    n_valid = m.sum(dim=-1, keepdim=True)
    index = torch.minimum(torch.floor(n_valid * tau), n_valid - 1).clamp(min=0).long()
    threshold = torch.where(valid, normalized, torch.inf).sort(dim=-1).values.gather(-1, index)
    suppressed = (normalized / (threshold + eps)).clamp(min=SUPPRESS_FLOOR)
    boosted = 1 + beta * (normalized - threshold) / (1 - threshold + eps)
    weights = torch.where(normalized < threshold, suppressed, boosted) * m
    weights = weights * n_valid / (weights.sum(dim=-1, keepdim=True) + RENORM_EPS)
    nonfinite = ~torch.isfinite(torch.where(valid, weights, 0.0)).all(dim=-1)
    fallback = ~has_answer.to(valid.device) | nonfinite
    return torch.where(fallback[:, None], 1.0, weights) * m, fallback


def _oar_g(model, input_ids, attention_mask, completion_mask, answer_mask, tau, beta, eps, noise_std, generator):
    """(weights, fallback, has_answer); both model passes are skipped when no row has an answer."""
    has_answer = answer_mask.any(dim=-1)
    if has_answer.any():
        scores = oar_g_scores(
            model, input_ids, attention_mask, answer_mask, eps=eps, noise_std=noise_std, generator=generator
        )
    else:
        scores = torch.zeros(answer_mask.shape, dtype=torch.float32, device=answer_mask.device)
    weights, fallback = oar_g_reshape(scores, completion_mask, has_answer, tau=tau, beta=beta, eps=eps)
    return weights, fallback, has_answer


def oar_g_weights(
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
) -> torch.Tensor:
    """(B, T) float32 OAR-G weights (module docstring); ``generator`` seeds the embedding noise.

    ``input_ids`` (B, P+T) = prompt + completion, ``completion_mask`` and ``answer_mask`` (B, T). Pass the plain
    Hugging Face module (unwrapped), in the mode the caller wants.
    """
    args = (model, input_ids, attention_mask, completion_mask, answer_mask, tau, beta, eps, noise_std, generator)
    return _oar_g(*args)[0]


def oar_g_weights_with_stats(
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
    """``oar_g_weights`` and its metrics (log under ``oar_g/``): fallback_rate, answer_found_rate,
    weight_mean, weight_std (unbiased, valid tokens)."""
    args = (model, input_ids, attention_mask, completion_mask, answer_mask, tau, beta, eps, noise_std, generator)
    weights, fallback, has_answer = _oar_g(*args)
    return weights, oar_g_stats(weights, completion_mask, fallback, has_answer)


def oar_g_stats(
    weights: torch.Tensor, completion_mask: torch.Tensor, fallback: torch.Tensor, has_answer: torch.Tensor
) -> dict[str, float]:
    """OAR-G's metrics (log under ``oar_g/``): fallback_rate and answer_found_rate over the rows (NaN without
    rows), weight_mean and weight_std (unbiased) of the weights (B, T) over valid tokens."""
    return {
        "fallback_rate": fraction(fallback),
        "answer_found_rate": fraction(has_answer),
        **weight_stats(weights, completion_mask.bool()),
    }
