"""GRPO with token-level credit in one small subclass of TRL's ``GRPOTrainer`` (docs/spec.md sections 1-3).

The only change to TRL's objective is the advantage: per token instead of per sequence, Â_{i,t}, from the
configured credit method (``pipeline.credit.method``: one file per method under pipeline/credit/methods/, e.g.
Â = A_i · w_{i,t}), which TRL 1.16's ``_compute_loss`` accepts as a (B, T) ``advantages`` tensor. A method that is
not per-token leaves TRL's loss as it is, bit for bit.

When the advantages are computed (``grail_recompute``, shared by every method):
- ``"every_step"`` (upstream, spec 1.1): on the current policy at every micro-step, inside ``_compute_loss``.
- ``"per_generation"``: once per generation round, at the end of ``_generate_and_score_completions``; the (B, T)
  weights (or, for a method that is not multiplicative, advantages) travel with the round as an extra key through
  TRL's shuffle and split.
A group method (``groups = True``) is always called there, once per round, on every process's rows gathered, so
that each prompt's group is whole (``_group_advantages``; pipeline.credit.method.GroupInputs).

A method whose pass can share the loss's forward makes that forward itself (``loss_forward``) and
memoises it (``memoise_loss_forward``; ``CreditInputs.token_statistics`` does both); ``_get_per_token_logps_and_entropies``
then returns it once. What is
logged: docs/output.md "Logged metrics".
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
from torch import nn
from transformers import set_seed
from trl import GRPOTrainer

from pipeline.core.io import InputError
from pipeline.credit import find_boxed_spans
from pipeline.credit.method import (
    CreditInputs,
    CreditResult,
    GroupInputs,
    TokenStatistics,
    logps_and_entropies_from_logits,
    scaled,
)
from pipeline.models.vllm_cpu import (
    default_cpu_kv_cache,
    eager_cpu_engines,
    globals_vllm_can_scan,
    keep_cpu_weights_in_place,
)
from pipeline.training.grpo_config import GrailGRPOConfig
from pipeline.training.trainer_metrics import log_advantage_metrics, log_credit_stats

__all__ = ["GrailGRPOConfig", "GrailGRPOTrainer"]

WEIGHTS_KEY = "credit_weights"  # (B, T) weights computed per generation round (multiplicative methods)
ADVANTAGES_KEY = "credit_advantages"  # (B, T) advantages computed per generation round (the other methods)
SPANS_KEY = "answer_spans"  # (B, 3) boxed spans, found once per generation round
# the policy's forwards inside each loss computation: the loss's own and any its credit method adds there (1 when
# the method shares the loss's forward or makes none; per-generation credit work falls outside it)
LOSS_FORWARDS = "credit/loss_forwards"


def colocate_sampling_seed(seed: int, process_index: int, tensor_parallel_size: int) -> int:
    """Seed of a colocate engine's sampling on rank ``process_index`` under ``vllm_rollout_seed: run``:

        seed + process_index // tensor_parallel_size

    The engine samples from its (the trainer's) process's global generators, and building it seeds them with what
    TRL passes as vLLM's seed, ``process_index // tensor_parallel_size`` (the ranks of one tensor-parallel group must
    draw the same tokens): without the run's ``seed`` in it, every seed of a study draws the same random numbers.
    """
    return seed + process_index // tensor_parallel_size


class GrailGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with per-token advantages from a credit method (see module docstring)."""

    args: GrailGRPOConfig

    def __init__(self, model: Any, reward_funcs: Any, args: GrailGRPOConfig, **kwargs: Any) -> None:
        if not isinstance(args, GrailGRPOConfig):
            raise InputError(f"GrailGRPOTrainer needs a GrailGRPOConfig, got {type(args).__name__}")
        colocated = args.use_vllm and args.vllm_mode == "colocate"
        if colocated:
            # TRL builds the engine in this process and syncs weights into it: pipeline/models/vllm_cpu.py
            keep_cpu_weights_in_place()
            eager_cpu_engines()
            default_cpu_kv_cache()
        with globals_vllm_can_scan() if colocated else nullcontext():
            super().__init__(model, reward_funcs, args, **kwargs)
        if colocated and args.vllm_rollout_seed == "run":
            process_index = self.accelerator.process_index
            set_seed(colocate_sampling_seed(args.seed, process_index, args.vllm_tensor_parallel_size))
        self.credit = args.credit_method()
        self._rewards_per_func: torch.Tensor | None = None  # set by each _calculate_rewards
        self._memoised_forward: tuple | None = None
        self._credit_generator: torch.Generator | None = None
        # counts the policy's forwards, so that the metric LOSS_FORWARDS shows a credit method that adds one
        self._policy_forwards = 0
        self.accelerator.unwrap_model(self.model).register_forward_pre_hook(self._count_policy_forward)

    # ---- TRL override points -------------------------------------------------------------------------------

    def _calculate_rewards(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        rewards_per_func = super()._calculate_rewards(*args, **kwargs)
        self._rewards_per_func = rewards_per_func  # (N, reward functions), all processes' rows: a group method's
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        batch = super()._generate_and_score_completions(inputs)
        if not self.credit.per_token:
            return batch
        if self.credit.groups:
            batch[ADVANTAGES_KEY] = self._group_advantages(batch)
            return batch
        batch[SPANS_KEY] = self._answer_spans(batch)
        if self.credit.per_generation and self.model.training:
            result = self._credit_result(self.model, batch, share_loss_forward=False)
            if result.weights is not None:
                batch[WEIGHTS_KEY] = result.weights
            else:
                batch[ADVANTAGES_KEY] = result.advantages
        return batch

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> tuple:
        if self._memoised_forward is not None:
            memoised, self._memoised_forward = self._memoised_forward, None
            return memoised
        return self._logps_and_entropies(*args, **kwargs)

    def _logps_and_entropies(
        self,
        model: nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **model_inputs: Any,
    ) -> tuple:
        """TRL's per-token log-probs (entropies, aux loss), in float64 for a float64 model without autocast: TRL's
        fused LM head sums and back-propagates in float32, whose last bits differ between CPU kernel paths (MKL's
        branches); the tiny studies' float64 models (TinyModelSpec.dtype) keep their precision through the loss."""
        autocast = self.args.bf16 or self.args.fp16
        if autocast or self.accelerator.unwrap_model(model).dtype != torch.float64:
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
                **model_inputs,
            )  # fmt: skip
        step = batch_size or input_ids.size(0)
        parts = [
            logps_and_entropies_from_logits(
                model, input_ids[rows], attention_mask[rows], logits_to_keep, self.temperature
            )
            for rows in (slice(start, start + step) for start in range(0, input_ids.size(0), step))
        ]
        logps, entropies = (torch.cat(columns) for columns in zip(*parts, strict=True))
        return logps, entropies if compute_entropy else None, None

    def _compute_loss(self, model: nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        before = self._policy_forwards
        try:
            return self._credit_loss(model, inputs)
        finally:
            self._metric_lists[LOSS_FORWARDS].append(float(self._policy_forwards - before))

    # ---- the credit method ------------------------------------------------------------------------------------

    def _count_policy_forward(self, *_: Any) -> None:
        self._policy_forwards += 1

    def _credit_loss(self, model: nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        """TRL's loss on the credit method's advantages (its weights applied when it computed them earlier)."""
        if not self.credit.per_token:
            return super()._compute_loss(model, inputs)
        advantages = inputs["advantages"]
        if WEIGHTS_KEY in inputs:
            weighted = scaled(advantages, inputs[WEIGHTS_KEY])
        elif ADVANTAGES_KEY in inputs:
            weighted = inputs[ADVANTAGES_KEY]
        else:
            share = self.credit.shares_loss_forward and torch.is_grad_enabled()
            weighted = self._credit_result(model, inputs, share_loss_forward=share).advantages
        log_advantage_metrics(
            self.accelerator, self._metric_lists, self.credit.name, advantages, weighted, inputs["completion_mask"]
        )
        try:
            return super()._compute_loss(model, {**inputs, "advantages": weighted})
        finally:
            self._memoised_forward = None

    def _answer_spans(self, batch: dict[str, Any]) -> torch.Tensor:
        if SPANS_KEY in batch:
            return batch[SPANS_KEY]
        ids, mask = batch["completion_ids"], batch["completion_mask"]
        args = self.args
        return find_boxed_spans(
            self.processing_class, ids, mask, which=args.answer_span, alignment=args.answer_alignment
        )

    def _credit_result(self, model: nn.Module, batch: dict[str, Any], *, share_loss_forward: bool) -> CreditResult:
        """The method's advantages for ``batch``, its statistics logged. ``share_loss_forward``: the method may
        make the forward TRL's loss needs and memoise it."""
        spans = self._answer_spans(batch) if self.credit.needs_spans else None
        result = self.credit.advantages(CreditInputs(batch, spans, model, self, share_loss_forward))
        log_credit_stats(self.accelerator, self._metric_lists, self.credit.name, result.stats)
        return result

    def _group_advantages(self, batch: dict[str, Any]) -> torch.Tensor:
        """This process's rows of a group method's (N, T) advantages over the whole generation batch: every
        process's rows gathered in TRL's order (its advantages are computed over the same gathered rows), the
        method called on them, this process's slice kept at its own completion length."""
        accelerator, local_rows = self.accelerator, batch["completion_ids"].size(0)
        pad = self.processing_class.pad_token_id
        ids = accelerator.gather(accelerator.pad_across_processes(batch["completion_ids"], dim=1, pad_index=pad))
        mask = accelerator.gather(accelerator.pad_across_processes(batch["completion_mask"], dim=1, pad_index=0))
        rewards_per_func = self._rewards_per_func
        rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan  # unscored, as TRL marks them
        group_size = self.num_generations if self.model.training else self.num_generations_eval
        statistics = None
        if self.credit.token_statistics:
            # one no-grad forward per micro-batch of rows, not of the whole generation batch: its activations
            # are a micro-step's, as the loss's are
            sequence_keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
            chunk = self.args.per_device_train_batch_size
            parts = [
                CreditInputs(
                    {key: batch[key][start : start + chunk] for key in sequence_keys},
                    None,
                    self.model,
                    self,
                    share_loss_forward=False,
                ).token_statistics()
                for start in range(0, local_rows, chunk)
            ]
            statistics = TokenStatistics(
                *(
                    accelerator.gather(accelerator.pad_across_processes(torch.cat(values), dim=1))
                    for values in ([p.logps for p in parts], [p.entropies for p in parts])
                )
            )
        inputs = GroupInputs(
            completion_ids=ids,
            completion_mask=mask,
            rewards=rewards.to(ids.device),
            advantages=accelerator.gather(batch["advantages"]),
            group_ids=torch.arange(ids.size(0), device=ids.device) // group_size,
            group_size=group_size,
            statistics=statistics,
        )
        result = self.credit.group_advantages(inputs)
        log_credit_stats(accelerator, self._metric_lists, self.credit.name, result.stats)
        rows = slice(accelerator.process_index * local_rows, (accelerator.process_index + 1) * local_rows)
        return result.advantages[rows, : batch["completion_ids"].size(1)]

    def _credit_weights(self, model: nn.Module, batch: dict[str, Any], *, share_loss_forward: bool) -> torch.Tensor:
        """(B, T) weights of a multiplicative method (rows with a zero advantage keep the completion mask)."""
        return self._credit_result(model, batch, share_loss_forward=share_loss_forward).weights

    # ---- what a credit method may use (pipeline.credit.method.CreditHost) ---------------------------------------

    def loss_forward(self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, T: int) -> tuple:
        return self._logps_and_entropies(
            model, input_ids, attention_mask, T, compute_entropy=True, compute_aux_loss=self.aux_loss_enabled
        )

    def memoise_loss_forward(self, outputs: tuple) -> None:
        self._memoised_forward = outputs

    def credit_generator(self) -> torch.Generator:
        if self._credit_generator is None:
            self._credit_generator = torch.Generator(device=self.accelerator.device)
            self._credit_generator.manual_seed(self.args.seed + self.accelerator.process_index)
        return self._credit_generator

    @property
    def _metric_lists(self) -> dict[str, list[float]]:
        """TRL's metric lists of the current mode (TRL averages each over its logging window)."""
        return self._metrics["train" if self.model.training else "eval"]
