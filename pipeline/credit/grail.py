"""GRAIL token weights from saliency scores (spec 1.5-1.7, metrics 1.9).

With m the completion mask, n_i = max(sum_t m_{i,t}, 1):

    lambda_{i,t} = ln(s_{i,t} + 1e-8)
    mu_i         = sum_t m lambda / n_i
    sigma_i      = sqrt(sum_t m (lambda - mu_i)^2 / n_i + 1e-8)          (population variance, valid tokens)
    raw_{i,t}    = mean + std (lambda_{i,t} - mu_i) / sigma_i
    w_{i,t}      = clamp(raw_{i,t}, w_min, w_max), or 1 on fallback rows; then w <- w m

Fallback rows: no boxed span, the symmetry rule ("correct": A_i <= 0, "wrong": A_i > 0, "both": none), or (a
robustness addition) a non-finite score on a valid token or a non-finite advantage. Then, on every row with a span
(fallback or not), in this order: w[content] = w_max, w[boundary] = mean, w[post and valid] = mean. As upstream,
the content and boundary overrides are not intersected with the mask (harmless: the loss is masked).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, NamedTuple, get_args

from pipeline.core.deferred import DeferredModule
from pipeline.credit.spans import span_masks
from pipeline.credit.stats import fraction, weight_stats

if TYPE_CHECKING:
    import torch
else:  # torch at first use: planning loads the credit methods without it (pipeline.core.deferred)
    torch = DeferredModule("torch")

Symmetry = Literal["both", "all", "correct", "wrong"]  # "all" is the upstream README's word for "both"
SYMMETRIES = {name: "both" if name == "all" else name for name in get_args(Symmetry)}
LOG_EPS = 1e-8
VAR_EPS = 1e-8


class _GrailParts(NamedTuple):
    weights: torch.Tensor  # (B, T) final weights
    raw: torch.Tensor  # (B, T) mean + std z, before clamping and overrides
    valid: torch.Tensor  # (B, T) bool completion mask
    fallback: torch.Tensor  # (B,) bool
    found: torch.Tensor  # (B,) bool: the row has a span
    nonfinite: torch.Tensor  # (B,) bool


def canonical_symmetry(symmetry: str) -> str:
    """ "both" | "correct" | "wrong" ("all" is the upstream README's word for "both"); anything else: ValueError."""
    if symmetry not in SYMMETRIES:
        raise ValueError(f"GRAIL symmetry must be one of {sorted(SYMMETRIES)}, got {symmetry!r}")
    return SYMMETRIES[symmetry]


def row_advantages(advantages: torch.Tensor) -> torch.Tensor:
    """(B,) advantages; a (B, T) tensor whose rows keep one sign (A_i times non-negative weights, e.g. after
    OAR-G) is reduced to its row sum, which has that sign."""
    return advantages if advantages.dim() == 1 else advantages.sum(dim=-1)


def symmetry_fallback(advantages: torch.Tensor, symmetry: str) -> torch.Tensor:
    """(B,) bool: rows that the symmetry rule leaves at weight 1."""
    symmetry = canonical_symmetry(symmetry)
    if symmetry == "correct":
        return advantages <= 0
    if symmetry == "wrong":
        return advantages > 0
    return torch.zeros_like(advantages, dtype=torch.bool)


def standardized_log_scores(scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """z_{i,t} = (lambda - mu_i) / sigma_i with the masked population statistics of the module docstring."""
    m = valid.float()
    log_scores = torch.where(valid, torch.log(scores.float() + LOG_EPS), 0.0)
    n = m.sum(dim=-1, keepdim=True).clamp(min=1.0)
    mu = (m * log_scores).sum(dim=-1, keepdim=True) / n
    sigma = torch.sqrt((m * (log_scores - mu) ** 2).sum(dim=-1, keepdim=True) / n + VAR_EPS)
    return (log_scores - mu) / sigma


def _grail_parts(scores, completion_mask, advantages, spans, mean, std, w_min, w_max, symmetry) -> _GrailParts:
    if not std:
        raise ValueError("A non-zero GRAIL std was not enabled (grail_std must be set and non-zero)")
    valid = completion_mask.bool()
    advantages = row_advantages(advantages).to(scores.device)
    raw = mean + std * standardized_log_scores(scores, valid)
    nonfinite = ~torch.isfinite(torch.where(valid, raw, 0.0)).all(dim=-1) | ~torch.isfinite(advantages)
    masks = span_masks(spans.to(scores.device), scores.shape[1])
    found = masks.answer.any(dim=-1)
    fallback = ~found | symmetry_fallback(advantages, symmetry) | nonfinite
    weights = torch.where(fallback[:, None], 1.0, raw.clamp(w_min, w_max)) * valid
    weights = weights.masked_fill(masks.content, w_max).masked_fill(masks.boundary, mean)
    weights = weights.masked_fill(masks.post & valid, mean)
    return _GrailParts(weights, raw, valid, fallback, found, nonfinite)


def grail_weights(
    scores: torch.Tensor,
    completion_mask: torch.Tensor,
    advantages: torch.Tensor,
    spans: torch.Tensor,
    *,
    mean: float = 1.0,
    std: float = 0.5,
    w_min: float = 0.5,
    w_max: float = 5.0,
    symmetry: str = "both",
) -> torch.Tensor:
    """(B, T) float32 GRAIL weights (module docstring). ``scores`` (B, T) saliency, ``completion_mask`` (B, T),
    ``advantages`` (B,) or (B, T), ``spans`` (B, 3) from ``find_boxed_spans``."""
    return _grail_parts(scores, completion_mask, advantages, spans, mean, std, w_min, w_max, symmetry).weights


def grail_weights_with_stats(
    scores: torch.Tensor,
    completion_mask: torch.Tensor,
    advantages: torch.Tensor,
    spans: torch.Tensor,
    *,
    mean: float = 1.0,
    std: float = 0.5,
    w_min: float = 0.5,
    w_max: float = 5.0,
    symmetry: str = "both",
) -> tuple[torch.Tensor, dict[str, float]]:
    """``grail_weights`` and the spec 1.9 weight metrics (log them under ``grail/``):

    clip_frac_min / clip_frac_max: fraction of active tokens (valid, non-fallback rows) with raw <= w_min /
    raw >= w_max, before the overrides (NaN without active tokens); fallback_rate; answer_found_rate;
    weight_mean / weight_std (unbiased) of the final weights over valid tokens; nonfinite_rows (count).
    """
    parts = _grail_parts(scores, completion_mask, advantages, spans, mean, std, w_min, w_max, symmetry)
    active = parts.valid & ~parts.fallback[:, None]
    stats = {
        "clip_frac_min": fraction(parts.raw[active] <= w_min),
        "clip_frac_max": fraction(parts.raw[active] >= w_max),
        "fallback_rate": fraction(parts.fallback),
        "answer_found_rate": fraction(parts.found),
        **weight_stats(parts.weights, parts.valid),
        "nonfinite_rows": float(parts.nonfinite.sum().item()),
    }
    return parts.weights, stats
