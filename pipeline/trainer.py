"""GRPO, GRAIL and OAR-G in one small subclass of TRL's ``GRPOTrainer`` (docs/spec.md sections 1-3).

The only change to TRL's objective is the advantage: per token instead of per sequence,

    Â_{i,t} = A_i · w_{i,t}        (w: GRAIL weights, spec 1.5-1.7, or OAR-G weights, spec 2)

which TRL 1.16's ``_compute_loss`` accepts as a (B, T) ``advantages`` tensor. With ``credit="grpo"`` (or all-one
weights) the loss is TRL's own, bit for bit.

When the weights are computed (``grail_recompute``):
- ``"every_step"`` (upstream, spec 1.1): on the current policy at every micro-step, inside ``_compute_loss``.
- ``"per_generation"``: once per generation round, at the end of ``_generate_and_score_completions``; the (B, T)
  weights travel with the round as the extra key ``credit_weights`` through TRL's shuffle and split.

How the fast path shares TRL's forward, and which rows are scored: ARCHITECTURE.md "Trainer"; what is logged:
README.md "Logged metrics".
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import set_seed
from trl import GRPOTrainer

from pipeline.credit import (
    OAR_G_VARIANTS,
    answer_mask_from_spans,
    find_boxed_spans,
    grail_weights_with_stats,
    saliency_scores,
)
from pipeline.credit.grail import symmetry_fallback
from pipeline.credit.oar_g import oar_g_stats
from pipeline.credit.saliency import ForwardCapture, answer_saliency, answer_saliency_own_forward
from pipeline.credit.stats import fraction
from pipeline.grpo_config import GrailGRPOConfig
from pipeline.io import InputError
from pipeline.trainer_metrics import log_advantage_metrics, log_grad_norm_percentiles, log_nanmeans
from pipeline.vllm_cpu import default_cpu_kv_cache, keep_cpu_weights_in_place

__all__ = ["GrailGRPOConfig", "GrailGRPOTrainer"]

WEIGHTS_KEY = "credit_weights"  # (B, T) weights computed per generation round
SPANS_KEY = "answer_spans"  # (B, 3) boxed spans, found once per generation round


def colocate_sampling_seed(seed: int, process_index: int, tensor_parallel_size: int) -> int:
    """Seed of a colocate engine's sampling on rank ``process_index`` under ``vllm_rollout_seed: run``:

        seed + process_index // tensor_parallel_size

    The engine samples from its (the trainer's) process's global generators, and building it seeds them with what
    TRL passes as vLLM's seed, ``process_index // tensor_parallel_size`` (the ranks of one tensor-parallel group must
    draw the same tokens): without the run's ``seed`` in it, every seed of a study draws the same random numbers.
    """
    return seed + process_index // tensor_parallel_size


class GrailGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with per-token advantages ``A_i · w_{i,t}`` from GRAIL or OAR-G (see module docstring)."""

    args: GrailGRPOConfig

    def __init__(self, model: Any, reward_funcs: Any, args: GrailGRPOConfig, **kwargs: Any) -> None:
        if not isinstance(args, GrailGRPOConfig):
            raise InputError(f"GrailGRPOTrainer needs a GrailGRPOConfig, got {type(args).__name__}")
        if args.use_vllm and args.vllm_mode == "colocate":
            # TRL builds the engine in this process and syncs weights into it: pipeline/vllm_cpu.py
            keep_cpu_weights_in_place()
            default_cpu_kv_cache()
        super().__init__(model, reward_funcs, args, **kwargs)
        if args.use_vllm and args.vllm_mode == "colocate" and args.vllm_rollout_seed == "run":
            process_index = self.accelerator.process_index
            set_seed(colocate_sampling_seed(args.seed, process_index, args.vllm_tensor_parallel_size))
        self._memoised_forward: tuple | None = None
        self._oar_g_generator: torch.Generator | None = None

    # ---- TRL override points -------------------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        batch = super()._generate_and_score_completions(inputs)
        if self.args.credit == "grpo":
            return batch
        batch[SPANS_KEY] = self._answer_spans(batch)
        if self.args.grail_recompute == "per_generation" and self.model.training:
            batch[WEIGHTS_KEY] = self._credit_weights(self.model, batch, share_loss_forward=False)
        return batch

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> tuple:
        if self._memoised_forward is not None:
            memoised, self._memoised_forward = self._memoised_forward, None
            return memoised
        return super()._get_per_token_logps_and_entropies(*args, **kwargs)

    def _compute_loss(self, model: nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        if self.args.credit == "grpo":
            return super()._compute_loss(model, inputs)
        weights = inputs.get(WEIGHTS_KEY)
        if weights is None:
            share = self.args.grail_implementation == "fast" and torch.is_grad_enabled()
            weights = self._credit_weights(model, inputs, share_loss_forward=share)
        advantages = inputs["advantages"]
        weighted = advantages.unsqueeze(1) * weights
        log_advantage_metrics(
            self.accelerator, self._metric_lists, self.args.credit, advantages, weighted, inputs["completion_mask"]
        )
        try:
            return super()._compute_loss(model, {**inputs, "advantages": weighted})
        finally:
            self._memoised_forward = None

    # ---- weights --------------------------------------------------------------------------------------------

    def _answer_spans(self, batch: dict[str, Any]) -> torch.Tensor:
        if SPANS_KEY in batch:
            return batch[SPANS_KEY]
        ids, mask = batch["completion_ids"], batch["completion_mask"]
        args = self.args
        return find_boxed_spans(
            self.processing_class, ids, mask, which=args.answer_span, alignment=args.answer_alignment
        )

    def _credit_weights(self, model: nn.Module, batch: dict[str, Any], *, share_loss_forward: bool) -> torch.Tensor:
        """(B, T) weights for ``batch``; rows with a zero advantage keep the completion mask as weights.

        ``share_loss_forward``: run the forward TRL's loss needs here, with the saliency hooks, and memoise it.
        """
        spans = self._answer_spans(batch)
        advantages, completion_mask = batch["advantages"], batch["completion_mask"]
        has_answer = spans[:, 0] >= 0
        carries_loss = (advantages != 0) & (completion_mask.sum(-1) > 0)
        weights = completion_mask.float()
        rows = carries_loss.nonzero().squeeze(-1)
        if self.args.credit == "oar_g":
            needs = carries_loss & has_answer
            weights[needs] = self._oar_g_weights(model, batch, spans, needs)
            self._log_credit_stats(
                oar_g_stats(weights[rows], completion_mask[rows], ~has_answer[rows], has_answer[rows])
            )
            return weights
        needs = carries_loss & has_answer & ~symmetry_fallback(advantages, self.args.grail_symmetry)
        scores = self._saliency(model, batch, spans, needs, share_loss_forward)
        weights[rows], stats = grail_weights_with_stats(
            scores[rows], completion_mask[rows], advantages[rows], spans[rows], **self.args.grail_weight_options()
        )
        self._log_credit_stats(stats)
        return weights

    def _saliency(
        self, model: nn.Module, batch: dict[str, Any], spans: torch.Tensor, needs: torch.Tensor, share: bool
    ) -> torch.Tensor:
        """(B, T) GRAIL scores, zero on rows that do not need them (their weights do not use the scores)."""
        input_ids, attention_mask = _full_sequence(batch)
        T = batch["completion_ids"].size(1)
        unwrapped = self.accelerator.unwrap_model(model)
        if self.args.grail_implementation == "reference":
            self._log_credit_stats({"saliency_rows_frac": 1.0})
            # Upstream's separate attribution pass over every row, in micro-batch chunks.
            return self._in_chunks(
                saliency_scores,
                (unwrapped,),
                (input_ids, attention_mask, answer_mask_from_spans(spans, T)),
                **self.args.saliency_options(),
            )
        self._log_credit_stats({"saliency_rows_frac": fraction(needs)})
        rows = needs.nonzero().squeeze(-1)
        scores = input_ids.new_zeros((input_ids.size(0), T), dtype=torch.float32)
        grad_norms = scores.new_empty(0)
        if share:
            scores[rows], grad_norms = self._saliency_sharing_loss_forward(
                model, unwrapped, input_ids, attention_mask, answer_mask_from_spans(spans, T), needs
            )
        elif rows.numel():
            scores[rows], grad_norms = answer_saliency_own_forward(
                unwrapped,
                input_ids[rows],
                attention_mask[rows],
                spans[rows],
                T,
                **self.args.saliency_options(),
                chunk_size=self.args.per_device_train_batch_size,
                autocast=self.accelerator.autocast,
            )
        log_grad_norm_percentiles(self.accelerator, self._metric_lists, grad_norms)
        return scores

    def _saliency_sharing_loss_forward(
        self, model, unwrapped, input_ids, attention_mask, answer_mask, needs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Make the loss's forward (TRL's own call) in two row chunks, the rows that ``needs`` under the capture
        hooks; return their saliency and grad norms and memoise the reassembled forward for ``_compute_loss``.

        With several processes it is one forward of every row under the hooks, the answer loss masked to the rows
        that need saliency: DDP makes each forward a collective (module buffers are broadcast first), so a rank
        whose rows split into one chunk while another's split into two would wait forever in the other's second
        forward. Rows are independent in the forward and in the answer loss, so the scores are the same.
        """
        rows, others = needs.nonzero().squeeze(-1), (~needs).nonzero().squeeze(-1)
        if self.accelerator.num_processes > 1:
            rows, others = torch.arange(needs.numel(), device=needs.device), others[:0]
        scored = needs[rows]

        def forward(subset: torch.Tensor) -> tuple:
            return super(GrailGRPOTrainer, self)._get_per_token_logps_and_entropies(
                model,
                input_ids[subset],
                attention_mask[subset],
                answer_mask.size(1),
                compute_entropy=True,
                compute_aux_loss=self.aux_loss_enabled,
            )

        outputs = []
        scores = input_ids.new_empty((0, answer_mask.size(1)), dtype=torch.float32)
        grad_norms = scores.new_empty(0)
        if rows.numel():
            capture = ForwardCapture(unwrapped, self.args.grail_leaf)
            with capture.hooks():
                outputs.append(forward(rows))
            if scored.any():
                scores, grad_norms = answer_saliency(
                    capture,
                    unwrapped,
                    input_ids[rows],
                    answer_mask[rows] & scored[:, None],
                    temperature=self.temperature,
                    position=self.args.grail_position,
                    retain_graph=True,
                )
                scores, grad_norms = scores[scored], grad_norms[scored]
        if others.numel():
            outputs.append(forward(others))
        order = torch.cat([rows, others]).argsort()
        logps, entropies = (torch.cat([out[k] for out in outputs])[order] for k in (0, 1))
        aux = torch.stack([out[2] for out in outputs]).mean() if self.aux_loss_enabled else None
        self._memoised_forward = (logps, entropies, aux)
        return scores, grad_norms

    def _oar_g_weights(self, model, batch, spans, needs) -> torch.Tensor:
        """OAR-G weights (spec 2) of the rows that ``needs``, in micro-batch chunks; noise from a seeded generator."""
        if self._oar_g_generator is None:
            self._oar_g_generator = torch.Generator(device=self.accelerator.device)
            self._oar_g_generator.manual_seed(self.args.seed + self.accelerator.process_index)
        self._log_credit_stats({"saliency_rows_frac": fraction(needs)})
        rows = needs.nonzero().squeeze(-1)
        input_ids, attention_mask = _full_sequence(batch)
        completion_mask = batch["completion_mask"]
        answer_mask = answer_mask_from_spans(spans, completion_mask.size(1))
        unwrapped = self.accelerator.unwrap_model(model)
        with torch.enable_grad():
            return self._in_chunks(
                OAR_G_VARIANTS[self.args.oar_g_variant],
                (unwrapped,),
                (input_ids[rows], attention_mask[rows], completion_mask[rows], answer_mask[rows]),
                **self.args.oar_g_options(),
                generator=self._oar_g_generator,
            )

    def _in_chunks(self, function, leading: tuple, rows: tuple[torch.Tensor, ...], **kwargs: Any) -> torch.Tensor:
        """``function(*leading, *chunk, **kwargs)`` over micro-batch row chunks of ``rows``, concatenated (B, T)."""
        size = self.args.per_device_train_batch_size
        empty = rows[-1].new_empty((0, rows[-1].size(1)), dtype=torch.float32)
        starts = range(0, rows[0].size(0), size)
        return torch.cat([empty, *(function(*leading, *(r[s : s + size] for r in rows), **kwargs) for s in starts)])

    # ---- metrics (TRL averages each list over its logging window) -------------------------------------------

    @property
    def _metric_lists(self) -> dict[str, list[float]]:
        return self._metrics["train" if self.model.training else "eval"]

    def _log_credit_stats(self, stats: dict[str, float]) -> None:
        log_nanmeans(self.accelerator, self._metric_lists, self.args.credit, stats)


def _full_sequence(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of prompt followed by completion, as TRL's loss builds them."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    return input_ids, torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
