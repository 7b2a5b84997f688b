"""Credit methods applied outside training, as the trainer applies them: built from a study's method options
(``GrailGRPOConfig``) and run through an ``OfflineHost`` on a checkpoint's model and evaluation rollouts. The token
viewer and the credit placement stage use these.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from pipeline.core.io import InputError
from pipeline.credit import find_boxed_spans
from pipeline.credit.method import CreditInputs, CreditMethod, OfflineHost, credit_method

logger = logging.getLogger(__name__)


def credit_methods(specs: Any, temperature: float, seed: int) -> tuple[dict[str, CreditMethod], list[str]]:
    """The methods of METHODS that may weight tokens (per-token ones), by study name, each built from its options
    as the trainer builds it (``GrailGRPOConfig``, whose validation names the method and the key), at the saliency
    ``temperature`` with ``seed`` for its noise; and the names of the others, whose advantages stay TRL's. A group
    method is left out of both, with a warning."""
    from pipeline.training.grpo_config import GrailGRPOConfig, credit_fields  # imports TRL: only when the stage runs

    if not isinstance(specs, dict) or not all(isinstance(spec, dict) for spec in specs.values()):
        raise InputError(f"methods: expected a mapping of method names to credit options, got {specs!r}")
    own = {field.name for field in credit_fields()}
    weighting, others = {}, []
    for name, spec in specs.items():
        if unknown := sorted(set(spec) - own):
            raise InputError(f"methods: {name}: unknown key(s) {unknown} (allowed: {sorted(own)})")
        if "credit" not in spec:
            raise InputError(f"methods: {name}: `credit` missing")
        method = credit_method(spec["credit"])
        if method.groups:
            # its statistic needs whole groups of rollouts, which these tools do not select yet (issue 56, item 2):
            # weighing a sample of unrelated rollouts would show weights that training never uses
            logger.warning(
                "methods: %s: a group method (credit %s) is left out of the offline tools", name, method.name
            )
            continue
        if not method.per_token:
            others.append(name)
            continue
        try:
            args = GrailGRPOConfig(**spec, temperature=temperature, seed=seed, bf16=False, report_to="none")
        except (TypeError, ValueError) as error:
            raise InputError(f"methods: {name}: {error}") from None
        weighting[name] = args.credit_method()
    return weighting, others


def group_advantages(rewards: list[float]) -> list[float]:
    """GRPO's centred group reward ``A_i = r_i - mean_j r_j`` (no scaling)."""
    mean = sum(rewards) / len(rewards)
    return [reward - mean for reward in rewards]


def method_weights(
    method: CreditMethod, model: Any, tokenizer: Any, batch: dict[str, torch.Tensor]
) -> torch.Tensor | None:
    """(B, T) weights of ``method`` on ``batch`` (prompt/completion ids and masks, advantages), computed by the
    method as in training, with a fresh ``OfflineHost``; None for a per-token method without weights (additive)."""
    from accelerate import Accelerator

    args = method.args
    spans = None
    if method.needs_spans:
        ids, mask = batch["completion_ids"], batch["completion_mask"]
        spans = find_boxed_spans(tokenizer, ids, mask, which=args.answer_span, alignment=args.answer_alignment)
    host = OfflineHost(args, Accelerator(cpu=next(model.parameters()).device.type == "cpu"), tokenizer)
    with torch.enable_grad():
        result = method.advantages(CreditInputs(batch, spans, model, host, share_loss_forward=False))
    return None if result.weights is None else result.weights.detach()
