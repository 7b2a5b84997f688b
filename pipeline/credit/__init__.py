"""Token-level credit assignment (pure functions): boxed-answer spans, GRAIL saliency and weights, OAR-G weights.

Spec: docs/spec.md sections 1-2. Every function is side-effect free (no parameter ``.grad`` is touched).
"""

from pipeline.credit.grail import grail_weights, grail_weights_with_stats
from pipeline.credit.oar_g import oar_g_reshape, oar_g_weights, oar_g_weights_with_stats
from pipeline.credit.saliency import answer_token_logprobs, saliency_from_grad, saliency_scores
from pipeline.credit.spans import SpanMasks, answer_mask_from_spans, find_boxed_spans, span_masks

__all__ = [
    "SpanMasks",
    "answer_mask_from_spans",
    "answer_token_logprobs",
    "find_boxed_spans",
    "grail_weights",
    "grail_weights_with_stats",
    "oar_g_reshape",
    "oar_g_weights",
    "oar_g_weights_with_stats",
    "saliency_from_grad",
    "saliency_scores",
    "span_masks",
]
