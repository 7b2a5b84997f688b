"""OAR-G (spec 2): Â_{i,t} = A_i · w_{i,t}, w from the input-gradient attribution of the answer distribution.

``oar_g_variant="upstream"`` is GRAIL's OAR-G baseline (``pipeline.credit.oar_g``), ``"official"`` the OAR
paper's code (``pipeline.credit.oar_g_official``). Its own pass over the rows with an answer and a non-zero
advantage, in micro-batch chunks, with noise from the run's seeded generator; other rows keep the mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipeline.core.deferred import DeferredModule
from pipeline.credit import OAR_G_VARIANTS
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
from pipeline.credit.oar_g import oar_g_stats
from pipeline.credit.oar_g_official import OarGVariant
from pipeline.credit.saliency import at_least_float32
from pipeline.credit.spans import answer_mask_from_spans
from pipeline.credit.stats import fraction

if TYPE_CHECKING:
    import torch
else:  # torch at first use: planning loads the credit methods without it (pipeline.core.deferred)
    torch = DeferredModule("torch")


@dataclass
class OarGOptions:
    """OAR-G's options (defaults: upstream's qwen3_oar_g.yaml)."""

    oar_g_tau: float = field(
        default=0.4,
        metadata={
            "help": "OAR-G bi-level quantile threshold, in (0, 1).",
            "range": Range(exclusive_minimum=0, exclusive_maximum=1),
        },
    )
    oar_g_beta: float = field(
        default=2.0, metadata={"help": "OAR-G boosting coefficient, >= 0.", "range": Range(minimum=0)}
    )
    oar_g_eps: float = field(
        default=1e-12, metadata={"help": "OAR-G smoothing constant, > 0.", "range": Range(exclusive_minimum=0)}
    )
    oar_g_noise_std: float = field(
        default=1e-3, metadata={"help": "OAR-G embedding noise std, >= 0.", "range": Range(minimum=0)}
    )
    oar_g_variant: OarGVariant = field(
        default="upstream",
        metadata={"help": "'upstream' (GRAIL's OAR-G, the paper's baseline) or 'official' (the OAR paper's code)."},
    )

    def oar_g_weight_options(self) -> dict[str, float]:
        """Keyword arguments of ``pipeline.credit.oar_g_weights``: tau, beta, eps, noise_std."""
        return {name: getattr(self, f"oar_g_{name}") for name in ("tau", "beta", "eps", "noise_std")}


class OarG(CreditMethod):
    name = "oar_g"
    options = OarGOptions
    needs_model = True
    headline = ("weight_std", "fallback_rate", "answer_found_rate", "advantages_scale_ratio")

    def advantages(self, inputs: CreditInputs) -> CreditResult:
        batch, spans = inputs.batch, inputs.spans
        completion_mask = batch["completion_mask"]
        loss_rows = carries_loss(batch)
        has_answer = spans[:, 0] >= 0
        needs = loss_rows & has_answer
        weights = completion_mask.to(at_least_float32(inputs.unwrapped.dtype))
        weights[needs] = self._weights(inputs, needs).to(weights.dtype)
        rows = loss_rows.nonzero().squeeze(-1)
        stats = oar_g_stats(weights[rows], completion_mask[rows], ~has_answer[rows], has_answer[rows])
        return CreditResult(
            scaled(batch["advantages"], weights), weights, {"saliency_rows_frac": fraction(needs), **stats}
        )

    def _weights(self, inputs: CreditInputs, needs: torch.Tensor) -> torch.Tensor:
        """OAR-G weights of the rows that ``needs``, in micro-batch chunks."""
        rows = needs.nonzero().squeeze(-1)
        input_ids, attention_mask = full_sequence(inputs.batch)
        completion_mask = inputs.batch["completion_mask"]
        answer_mask = answer_mask_from_spans(inputs.spans, completion_mask.size(1))
        generator = inputs.host.credit_generator()
        with torch.enable_grad():
            return in_chunks(
                OAR_G_VARIANTS[self.opts.oar_g_variant],
                (inputs.unwrapped,),
                (input_ids[rows], attention_mask[rows], completion_mask[rows], answer_mask[rows]),
                self.args.per_device_train_batch_size,
                **self.opts.oar_g_weight_options(),
                generator=generator,
            )


METHOD = OarG
