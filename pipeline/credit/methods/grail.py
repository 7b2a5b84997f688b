"""GRAIL (spec 1): Â_{i,t} = A_i · w_{i,t}, w from the saliency of the answer tokens' log-likelihood.

``grail_implementation="fast"`` (the default) adds no forward pass at every step: it makes the loss's own
forward under ``ForwardCapture`` hooks, takes the saliency from it, and memoises it for the loss; the rows that
need a saliency pass (an answer, a non-zero advantage, no symmetry fallback) run as one chunk and the others as
another (one chunk of every row with several processes: see ``_saliency_sharing_loss_forward``). Under
``grail_recompute="per_generation"`` it runs its own forward over those rows, cut after the last answer token.
``"reference"`` makes upstream's separate pass (``saliency_scores``) over the whole micro-batch. Rows with a zero
advantage keep the completion mask as weights (they carry no loss). ARCHITECTURE.md "Trainer" has the detail.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal

from pipeline.core.deferred import DeferredModule
from pipeline.core.io import InputError
from pipeline.credit.grail import SYMMETRIES, Symmetry, grail_weights_with_stats, symmetry_fallback
from pipeline.credit.method import (
    CreditInputs,
    CreditMethod,
    CreditResult,
    Range,
    carries_loss,
    full_sequence,
    in_chunks,
    scaled,
)
from pipeline.credit.saliency import (
    ForwardCapture,
    Leaf,
    Position,
    answer_saliency,
    answer_saliency_own_forward,
    saliency_scores,
)
from pipeline.credit.spans import answer_mask_from_spans
from pipeline.credit.stats import fraction

if TYPE_CHECKING:
    import torch
else:  # torch at first use: planning loads the credit methods without it (pipeline.core.deferred)
    torch = DeferredModule("torch")

Implementation = Literal["fast", "reference"]


@dataclass
class GrailOptions:
    """GRAIL's options (defaults: upstream's settings)."""

    grail_mean: float = field(default=1.0, metadata={"help": "GRAIL weight for z = 0 (spec 1.6)."})
    grail_std: float = field(
        default=0.5,
        metadata={"help": "GRAIL weight per unit of z (spec 1.6); > 0.", "range": Range(exclusive_minimum=0)},
    )
    grail_w_min: float = field(
        default=0.5, metadata={"help": "Lower clamp of GRAIL weights.", "range": Range(minimum=0)}
    )
    grail_w_max: float = field(
        default=5.0,
        metadata={"help": "Upper clamp, and the boxed-content weight.", "range": Range(exclusive_minimum=0)},
    )
    grail_symmetry: Symmetry = field(
        default="both", metadata={"help": "Rows GRAIL reweights: 'both' (alias 'all'), 'correct' (A > 0), 'wrong'."}
    )
    grail_leaf: Leaf = field(default="embeddings", metadata={"help": "Activation the saliency is taken at (spec 1.2)."})
    grail_position: Position = field(
        default="previous",
        metadata={"help": "'previous': token t scored at input position t-1 (upstream); 'same': at t."},
    )
    grail_implementation: Implementation = field(
        default="fast", metadata={"help": "'fast' (shares the loss's forward) or 'reference' (separate pass)."}
    )

    def check_values(self) -> None:
        """The cross-key check (w_max >= w_min) and the "all" alias of "both"."""
        if not self.grail_w_max >= self.grail_w_min:
            raise InputError(f"grail_w_max ({self.grail_w_max}) must be >= grail_w_min ({self.grail_w_min})")
        self.grail_symmetry = SYMMETRIES[self.grail_symmetry]

    def grail_weight_options(self) -> dict[str, float | str]:
        """Keyword arguments of ``pipeline.credit.grail_weights``: mean, std, w_min, w_max, symmetry."""
        return {name: getattr(self, f"grail_{name}") for name in ("mean", "std", "w_min", "w_max", "symmetry")}


class Grail(CreditMethod):
    name = "grail"
    options = GrailOptions
    needs_model = True
    headline = ("weight_std", "clip_frac_max", "fallback_rate", "advantages_scale_ratio")
    required: ClassVar[dict[str, str]] = {"grail_std": "GRAIL needs a non-zero std (upstream sets 0.5)"}

    @property
    def shares_loss_forward(self) -> bool:
        return self.opts.grail_implementation == "fast"

    def saliency_options(self) -> dict[str, float | str]:
        """Keyword arguments of ``saliency_scores``: leaf, temperature (the sampling one), position."""
        opts = self.opts
        return {"leaf": opts.grail_leaf, "temperature": self.args.temperature, "position": opts.grail_position}

    def advantages(self, inputs: CreditInputs) -> CreditResult:
        weights, stats = self.weights(inputs)
        return CreditResult(scaled(inputs.batch["advantages"], weights), weights, stats)

    def weights(self, inputs: CreditInputs) -> tuple[torch.Tensor, dict]:
        """(B, T) weights, the completion mask on rows with a zero advantage, and the logged statistics."""
        batch, spans = inputs.batch, inputs.spans
        advantages, completion_mask = batch["advantages"], batch["completion_mask"]
        loss_rows = carries_loss(batch)
        needs = loss_rows & (spans[:, 0] >= 0) & ~symmetry_fallback(advantages, self.opts.grail_symmetry)
        scores, stats = self.saliency(inputs, needs)
        weights = completion_mask.float()
        rows = loss_rows.nonzero().squeeze(-1)
        weights[rows], weight_stats = grail_weights_with_stats(
            scores[rows], completion_mask[rows], advantages[rows], spans[rows], **self.opts.grail_weight_options()
        )
        return weights, {**stats, **weight_stats}

    def saliency(self, inputs: CreditInputs, needs: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """(B, T) scores, zero on rows that do not need them (their weights do not use the scores), and stats."""
        batch, spans, unwrapped = inputs.batch, inputs.spans, inputs.unwrapped
        input_ids, attention_mask = full_sequence(batch)
        T = batch["completion_ids"].size(1)
        chunk = self.args.per_device_train_batch_size
        if self.opts.grail_implementation == "reference":
            # Upstream's separate attribution pass over every row, in micro-batch chunks.
            answer_mask = answer_mask_from_spans(spans, T)
            rows = (input_ids, attention_mask, answer_mask)
            return in_chunks(saliency_scores, (unwrapped,), rows, chunk, **self.saliency_options()), {
                "saliency_rows_frac": 1.0
            }
        rows = needs.nonzero().squeeze(-1)
        scores = input_ids.new_zeros((input_ids.size(0), T), dtype=torch.float32)
        grad_norms = scores.new_empty(0)
        if inputs.share_loss_forward:
            answer_mask = answer_mask_from_spans(spans, T)
            scores[rows], grad_norms = self._saliency_sharing_loss_forward(
                inputs, input_ids, attention_mask, answer_mask, needs
            )
        elif rows.numel():
            scores[rows], grad_norms = answer_saliency_own_forward(
                unwrapped,
                input_ids[rows],
                attention_mask[rows],
                spans[rows],
                T,
                **self.saliency_options(),
                chunk_size=chunk,
                autocast=inputs.host.accelerator.autocast,
            )
        return scores, {"saliency_rows_frac": fraction(needs), "grad_norm": grad_norms}

    def _saliency_sharing_loss_forward(
        self, inputs: CreditInputs, input_ids, attention_mask, answer_mask, needs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Make the loss's forward (TRL's own call) in two row chunks, the rows that ``needs`` under the capture
        hooks; return their saliency and grad norms and memoise the reassembled forward for the loss.

        With several processes it is one forward of every row under the hooks, the answer loss masked to the rows
        that need saliency: DDP makes each forward a collective (module buffers are broadcast first), so a rank
        whose rows split into one chunk while another's split into two would wait forever in the other's second
        forward. Rows are independent in the forward and in the answer loss, so the scores are the same.
        """
        host, unwrapped = inputs.host, inputs.unwrapped
        rows, others = needs.nonzero().squeeze(-1), (~needs).nonzero().squeeze(-1)
        if host.accelerator.num_processes > 1:
            rows, others = torch.arange(needs.numel(), device=needs.device), others[:0]
        scored = needs[rows]

        def forward(subset: torch.Tensor) -> tuple:
            return host.loss_forward(inputs.model, input_ids[subset], attention_mask[subset], answer_mask.size(1))

        outputs = []
        scores = input_ids.new_empty((0, answer_mask.size(1)), dtype=torch.float32)
        grad_norms = scores.new_empty(0)
        if rows.numel():
            capture = ForwardCapture(unwrapped, self.opts.grail_leaf)
            with capture.hooks():
                outputs.append(forward(rows))
            if scored.any():
                scores, grad_norms = answer_saliency(
                    capture,
                    unwrapped,
                    input_ids[rows],
                    answer_mask[rows] & scored[:, None],
                    temperature=host.temperature,
                    position=self.opts.grail_position,
                    retain_graph=True,
                )
                scores, grad_norms = scores[scored], grad_norms[scored]
        if others.numel():
            outputs.append(forward(others))
        order = torch.cat([rows, others]).argsort()
        logps, entropies = (torch.cat([out[k] for out in outputs])[order] for k in (0, 1))
        aux = torch.stack([out[2] for out in outputs]).mean() if host.aux_loss_enabled else None
        host.memoise_loss_forward((logps, entropies, aux))
        return scores, grad_norms


METHOD = Grail
