"""Credit methods applied outside training, as the trainer applies them: each built from its own option declaration
(``build_options``) and the options every method shares (``OfflineSettings``), without TRL, and run through an
``OfflineHost`` on a checkpoint's model, one whole group of rollouts (an item's samples) at a time. The token viewer
and the credit placement stage use these.

A group is one batch: the item's prompt once (no prompt padding: a row's positions do not depend on the other
items) and its completions right-padded to the group's longest; a method splits it into chunks of
``per_device_train_batch_size`` rows as in training. Weights therefore never depend on which other items were
weighed, nor on the batch size while it holds a whole group; a group method (``groups = True``) gets its whole group.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import torch

from pipeline.core.io import InputError
from pipeline.credit import find_boxed_spans
from pipeline.credit.method import (
    CreditInputs,
    CreditMethod,
    CreditResult,
    GroupInputs,
    OfflineHost,
    TokenStatistics,
    build_options,
    credit_method,
    full_sequence,
)
from pipeline.credit.settings import OfflineSettings, SharedCreditOptions

SHARED_KEYS = frozenset(option.name for option in dataclasses.fields(SharedCreditOptions))


def credit_methods(
    specs: Any, temperature: float, seed: int, batch_size: int = 16
) -> tuple[dict[str, CreditMethod], list[str]]:
    """The methods of METHODS that give per-token advantages (per-row and group methods), by study name, each
    built from its options (``build_options``: the method and the key are named in an error) and the shared ones,
    at the saliency ``temperature``, with ``seed`` for its noise and ``batch_size`` rows per forward and backward;
    and the names of the others, whose advantages stay TRL's."""
    if not isinstance(specs, dict) or not all(isinstance(spec, dict) for spec in specs.values()):
        raise InputError(f"methods: expected a mapping of method names to credit options, got {specs!r}")
    weighting, others = {}, []
    for name, spec in specs.items():
        if "credit" not in spec:
            raise InputError(f"methods: {name}: `credit` missing")
        method = credit_method(spec["credit"])
        own = {option.name for option in dataclasses.fields(method.options)}
        if unknown := sorted(set(spec) - SHARED_KEYS - own):
            raise InputError(f"methods: {name}: unknown key(s) {unknown} (allowed: {sorted(SHARED_KEYS | own)})")
        if not method.per_token:
            others.append(name)
            continue
        shared = {key: value for key, value in spec.items() if key in SHARED_KEYS}
        try:
            settings = OfflineSettings(
                **shared, temperature=temperature, seed=seed, per_device_train_batch_size=batch_size
            )
        except InputError as error:
            raise InputError(f"methods: {name}: {error}") from None
        options = build_options(method, spec, settings.credit_options)
        weighting[name] = method(options, settings)
    return weighting, others


def centred_advantages(rewards: list[float]) -> list[float]:
    """GRPO's centred group reward ``A_i = r_i - mean_j r_j`` (no scaling)."""
    mean = sum(rewards) / len(rewards)
    return [reward - mean for reward in rewards]


def group_seed(seed: int, group: str) -> int:
    """The seed of a group's noise: ``seed`` and the group's name (its item id) hashed (SHA-256, 63 bits), so that
    each group draws its own noise (OAR-G's, grail_shuffled's permutations), the same whatever else is weighed."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{group}".encode()).digest()[:8], "big") >> 1


def method_result(
    method: CreditMethod,
    model: Any,
    tokenizer: Any,
    batch: dict[str, torch.Tensor],
    rewards: torch.Tensor | None = None,
    group: str = "",
) -> CreditResult:
    """The advantages and weights (detached; ``weights`` None for a method without: additive) of ``method`` on
    ``batch`` (prompt/completion ids and masks, advantages), computed by the method as in training with a fresh
    ``OfflineHost`` whose noise is seeded by ``group_seed(seed, group)``. A group method gets the batch as one group
    (its ``rewards``; the policy's statistics when it asks for them); a per-row method its boxed spans."""
    from accelerate import Accelerator

    args = method.args
    noise = dataclasses.replace(args, seed=group_seed(args.seed, group))
    host = OfflineHost(noise, Accelerator(cpu=next(model.parameters()).device.type == "cpu"), tokenizer)
    if method.groups:
        if rewards is None:
            raise ValueError(f"credit method {method.name!r} works on groups: pass the group's rewards")
        statistics = None
        if method.token_statistics:
            input_ids, attention_mask = full_sequence(batch)
            with torch.no_grad():
                logps, entropies, _ = host.loss_forward(
                    model, input_ids, attention_mask, batch["completion_ids"].size(1)
                )
            statistics = TokenStatistics(logps.float(), entropies.float())
        rows = rewards.numel()
        inputs = GroupInputs(
            batch["completion_ids"],
            batch["completion_mask"],
            rewards,
            batch["advantages"],
            torch.zeros(rows, dtype=torch.long),
            rows,
            statistics,
        )
        result = method.group_advantages(inputs)
    else:
        spans = None
        if method.needs_spans:
            ids, mask = batch["completion_ids"], batch["completion_mask"]
            spans = find_boxed_spans(tokenizer, ids, mask, which=args.answer_span, alignment=args.answer_alignment)
        with torch.enable_grad():
            result = method.advantages(CreditInputs(batch, spans, model, host, share_loss_forward=False))
    return CreditResult(result.advantages.detach(), None if result.weights is None else result.weights.detach(), {})


def relative_advantages(token_advantages: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """(B, T) ``Â_{i,t} / A_i`` of rows with ``A_i ≠ 0`` (1 on the others): how much of its rollout's advantage a
    token gets; a multiplicative method's weight ``w_{i,t}``, an additive method's (KTAE's) ``1 + b_{i,t} / A_i``."""
    sequence = advantages.to(token_advantages.dtype).unsqueeze(1)
    ratio = token_advantages.detach() / torch.where(sequence == 0, 1.0, sequence)
    return torch.where(sequence == 0, torch.ones_like(ratio), ratio)
