"""GRPO, GRAIL and OAR-G in one small subclass of TRL's ``GRPOTrainer`` (spec sections 1-3).

The only change to TRL's objective is the advantage: per token instead of per sequence,

    Â_{i,t} = A_i · w_{i,t}        (w: GRAIL weights, spec 1.5-1.7, or OAR-G weights, spec 2)

which TRL 1.16's ``_compute_loss`` accepts as a (B, T) ``advantages`` tensor. With ``credit="grpo"`` (or all-one
weights) the loss is TRL's own, bit for bit.

When the weights are computed (``grail_recompute``):
- ``"every_step"`` (upstream, spec 1.1): on the current policy at every micro-step, inside ``_compute_loss``.
- ``"per_generation"``: once per generation round, at the end of ``_generate_and_score_completions``; the (B, T)
  weights travel with the round as the extra key ``credit_weights`` through TRL's shuffle and split.

Fast GRAIL (``grail_implementation="fast"``, the default) adds no forward pass at every step: forward hooks keep
the leaf activation and the final hidden state of the forward that TRL's loss makes anyway; the answer loss
(spec 1.3) is computed from the answer positions' final hidden states times the detached LM head only (no
full-vocabulary logits for the other positions), and ``torch.autograd.grad`` of it with respect to the kept leaf
(``retain_graph=True``) gives the saliency. TRL's ``_compute_loss`` then reuses that same forward (memoised). The
forward is split so that the rows that need a saliency pass (an answer, a non-zero advantage and no symmetry
fallback) run as one chunk and the others as another, and the saliency backward only traverses the first; when no
row needs it there is no backward at all. ``"per_generation"`` runs its own forward over the rows that need it,
cut after the last answer token (later positions cannot influence the answer loss under causal attention).
``grail_implementation="reference"`` makes upstream's separate pass (``pipeline.credit.saliency_scores``) over
the whole micro-batch. All four leaves work on both paths.

Rows whose advantage is zero contribute nothing to the loss whatever their weights, so their weights are not
computed (set to the completion mask) and the ``grail/`` and ``oar_g/`` weight statistics cover the rows with a
non-zero advantage only (upstream also counts zero-advantage rows). ``grail/grad_norm_p10``/``_p90`` cover the
rows that had a saliency pass (fast path only: the reference pass does not expose its gradient).
``<credit>/saliency_rows_frac`` is the fraction of rows that needed a saliency (or OAR-G) pass. Limitations:
text-only models; the LM head is read directly (no ZeRO-3 gather).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from trl import GRPOConfig, GRPOTrainer

from pipeline.credit import (
    answer_mask_from_spans,
    answer_token_logprobs,
    find_boxed_spans,
    grail_weights_with_stats,
    oar_g_official_weights,
    oar_g_weights,
    saliency_from_grad,
    saliency_scores,
)
from pipeline.credit.grail import SYMMETRIES, symmetry_fallback, weight_stats
from pipeline.credit.saliency import leaf_index
from pipeline.grading import GRADING_MODES
from pipeline.io import InputError

CREDIT_METHODS = ("grpo", "grail", "oar_g")
GRAIL_LEAVES = ("embeddings", "first", "middle", "last")
CHOICES = {
    "credit": CREDIT_METHODS,
    "grail_symmetry": tuple(SYMMETRIES),
    "grail_leaf": GRAIL_LEAVES,
    "grail_position": ("previous", "same"),
    "answer_span": ("first", "last"),
    "answer_alignment": ("exact", "upstream"),
    "oar_g_variant": ("upstream", "official"),
    "grail_recompute": ("every_step", "per_generation"),
    "grail_implementation": ("fast", "reference"),
    "reward_grading": GRADING_MODES,
}
OAR_G_VARIANTS = {"upstream": oar_g_weights, "official": oar_g_official_weights}
WEIGHTS_KEY = "credit_weights"  # (B, T) weights computed per generation round
SPANS_KEY = "answer_spans"  # (B, 3) boxed spans, found once per generation round


@dataclass
class GrailGRPOConfig(GRPOConfig):
    """``GRPOConfig`` plus the credit-assignment options (defaults: upstream's GRAIL and OAR-G settings)."""

    credit: str = field(default="grpo", metadata={"help": "Token credit: 'grpo' (none), 'grail' or 'oar_g'."})
    grail_mean: float = field(default=1.0, metadata={"help": "GRAIL weight for z = 0 (spec 1.6)."})
    grail_std: float = field(default=0.5, metadata={"help": "GRAIL weight per unit of z (spec 1.6); > 0."})
    grail_w_min: float = field(default=0.5, metadata={"help": "Lower clamp of GRAIL weights."})
    grail_w_max: float = field(default=5.0, metadata={"help": "Upper clamp, and the boxed-content weight."})
    grail_symmetry: str = field(
        default="both", metadata={"help": "Rows GRAIL reweights: 'both' (alias 'all'), 'correct' (A > 0), 'wrong'."}
    )
    grail_leaf: str = field(default="embeddings", metadata={"help": "Activation the saliency is taken at (spec 1.2)."})
    grail_position: str = field(
        default="previous",
        metadata={"help": "'previous': token t scored at input position t-1 (upstream); 'same': at t."},
    )
    answer_span: str = field(
        default="first", metadata={"help": "Which complete \\boxed{} is the answer: 'first' (upstream) or 'last'."}
    )
    answer_alignment: str = field(
        default="exact",
        metadata={"help": "Answer tokens: 'exact' character cover, or 'upstream' re-encode-and-count (spec 1.3)."},
    )
    grail_recompute: str = field(
        default="every_step",
        metadata={"help": "'every_step' (upstream: current policy, every micro-step) or 'per_generation'."},
    )
    grail_implementation: str = field(
        default="fast", metadata={"help": "'fast' (shares the loss's forward) or 'reference' (separate pass)."}
    )
    reward_grading: str = field(
        default="clean",
        metadata={"help": "Reward grader: 'clean' (pipeline.grading's fixes) or 'upstream' (plain math-verify)."},
    )
    oar_g_tau: float = field(default=0.4, metadata={"help": "OAR-G bi-level quantile threshold, in (0, 1)."})
    oar_g_beta: float = field(default=2.0, metadata={"help": "OAR-G boosting coefficient, >= 0."})
    oar_g_eps: float = field(default=1e-12, metadata={"help": "OAR-G smoothing constant, > 0."})
    oar_g_noise_std: float = field(default=1e-3, metadata={"help": "OAR-G embedding noise std, >= 0."})
    oar_g_variant: str = field(
        default="upstream",
        metadata={
            "help": "'upstream' (GRAIL's OAR-G baseline) or 'official' (the OAR paper's code, credit.oar_g_official)."
        },
    )

    def __post_init__(self) -> None:
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise InputError(f"{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")
        positive = {"grail_std": self.grail_std, "oar_g_eps": self.oar_g_eps}
        non_negative = {"grail_w_min": self.grail_w_min, "oar_g_beta": self.oar_g_beta}
        non_negative["oar_g_noise_std"] = self.oar_g_noise_std
        for name, value in positive.items():
            if not value > 0:
                raise InputError(f"{name} must be > 0, got {value!r}")
        for name, value in non_negative.items():
            if not value >= 0:
                raise InputError(f"{name} must be >= 0, got {value!r}")
        if not self.grail_w_max >= self.grail_w_min:
            raise InputError(f"grail_w_max ({self.grail_w_max}) must be >= grail_w_min ({self.grail_w_min})")
        if not 0 < self.oar_g_tau < 1:
            raise InputError(f"oar_g_tau must be in (0, 1), got {self.oar_g_tau!r}")
        self.grail_symmetry = SYMMETRIES[self.grail_symmetry]  # "all" is the upstream README's "both"
        super().__post_init__()


def leaf_module(model: nn.Module, leaf: str) -> nn.Module:
    """Module whose output is the GRAIL leaf ``hidden_states[k]`` of spec 1.2.

    k = 0 ("embeddings"), 1 ("first"), floor(L/2) ("middle"), L-1 ("last"); ``hidden_states[0]`` is the input
    embedding and ``hidden_states[k]`` for 0 < k < L the output of decoder layer k-1.
    """
    if leaf == "embeddings":
        return model.get_input_embeddings()
    layers = model.get_decoder().layers
    index = leaf_index(leaf, len(layers))
    if index >= len(layers):
        raise InputError(f"grail_leaf={leaf!r} needs a model with at least 2 decoder layers")
    return model.get_input_embeddings() if index == 0 else layers[index - 1]


class ForwardCapture:
    """Forward hooks keeping, from the next forward pass, the leaf activation and the final hidden state."""

    def __init__(self, model: nn.Module, leaf: str) -> None:
        self.model, self.leaf_name = model, leaf
        self.leaf: torch.Tensor | None = None
        self.last_hidden: torch.Tensor | None = None

    def _keep_leaf(self, module: nn.Module, args: Any, output: Any) -> Any:
        if self.leaf is not None:  # a gradient-checkpointing recompute fires the hook again
            return None
        activation = output[0] if isinstance(output, tuple) else output
        if not activation.requires_grad:
            # Frozen embeddings (e.g. an adapter) give an activation outside the graph: make it a graph leaf.
            activation = activation.detach().requires_grad_()
            output = (activation, *output[1:]) if isinstance(output, tuple) else activation
        self.leaf = activation
        return output

    def _keep_last_hidden(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.last_hidden is None:
            self.last_hidden = output[0] if isinstance(output, tuple) else output.last_hidden_state

    @contextlib.contextmanager
    def hooks(self) -> Iterator[ForwardCapture]:
        handles = [
            leaf_module(self.model, self.leaf_name).register_forward_hook(self._keep_leaf),
            self.model.get_decoder().register_forward_hook(self._keep_last_hidden),
        ]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()


def answer_saliency(
    capture: ForwardCapture,
    model: nn.Module,
    input_ids: torch.Tensor,
    answer_mask: torch.Tensor,
    *,
    temperature: float,
    position: str,
    retain_graph: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRAIL saliency (B, T) and per-row mean gradient norm (B,) from a captured forward (spec 1.2-1.4).

        L_ans = - Σ_{i,t: answer} log softmax(W_head h^last_{i,P+t-1} / temperature)[c_{i,t}]   (W_head detached)
        s_{i,t} = ‖ ∂L_ans/∂h_{i,p} ⊙ h_{i,p} ‖₂,  g_i = mean_t ‖ ∂L_ans/∂h_{i,p} ‖₂,  p = P+t-1 or P+t (position)

    Only the answer positions are projected onto the vocabulary; no parameter gradient is accumulated.
    """
    T = answer_mask.size(1)
    answer_loss = -answer_token_logprobs(model, capture.last_hidden, input_ids, answer_mask, temperature).sum()
    (grad,) = torch.autograd.grad(answer_loss, capture.leaf, retain_graph=retain_graph)
    scores = saliency_from_grad(grad, capture.leaf.detach(), T, position)
    grad_norm = saliency_from_grad(grad, grad.new_ones(()).expand_as(grad), T, position).mean(-1)
    return scores, grad_norm


class GrailGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with per-token advantages ``A_i · w_{i,t}`` from GRAIL or OAR-G (see module docstring)."""

    args: GrailGRPOConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, GrailGRPOConfig):
            raise InputError(f"GrailGRPOTrainer needs a GrailGRPOConfig, got {type(self.args).__name__}")
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
        self._log_advantage_metrics(advantages, weighted, inputs["completion_mask"])
        try:
            return super()._compute_loss(model, {**inputs, "advantages": weighted})
        finally:
            self._memoised_forward = None

    # ---- weights --------------------------------------------------------------------------------------------

    def _answer_spans(self, batch: dict[str, Any]) -> torch.Tensor:
        if SPANS_KEY in batch:
            return batch[SPANS_KEY]
        return find_boxed_spans(
            self.processing_class,
            batch["completion_ids"],
            batch["completion_mask"],
            which=self.args.answer_span,
            alignment=self.args.answer_alignment,
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
                {
                    "fallback_rate": _fraction(~has_answer[rows]),
                    "answer_found_rate": _fraction(has_answer[rows]),
                    **weight_stats(weights[rows], completion_mask[rows].bool()),
                }
            )
            return weights
        needs = carries_loss & has_answer & ~symmetry_fallback(advantages, self.args.grail_symmetry)
        scores = self._saliency(model, batch, spans, needs, share_loss_forward)
        weights[rows], stats = grail_weights_with_stats(
            scores[rows],
            completion_mask[rows],
            advantages[rows],
            spans[rows],
            mean=self.args.grail_mean,
            std=self.args.grail_std,
            w_min=self.args.grail_w_min,
            w_max=self.args.grail_w_max,
            symmetry=self.args.grail_symmetry,
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
            return self._reference_saliency(unwrapped, input_ids, attention_mask, answer_mask_from_spans(spans, T))
        self._log_credit_stats({"saliency_rows_frac": _fraction(needs)})
        rows = needs.nonzero().squeeze(-1)
        scores = input_ids.new_zeros((input_ids.size(0), T), dtype=torch.float32)
        grad_norms = scores.new_empty(0)
        if share:
            scores[rows], grad_norms = self._saliency_sharing_loss_forward(
                model, unwrapped, input_ids, attention_mask, answer_mask_from_spans(spans, T), needs
            )
        elif rows.numel():
            scores[rows], grad_norms = self._saliency_own_forward(
                unwrapped, input_ids[rows], attention_mask[rows], spans[rows], T
            )
        self._log_grad_norm_percentiles(grad_norms)
        return scores

    def _reference_saliency(self, unwrapped, input_ids, attention_mask, answer_mask) -> torch.Tensor:
        """Upstream's separate attribution pass (spec 1.2-1.4) over every row, in micro-batch chunks."""
        chunk = self.args.per_device_train_batch_size
        parts = [
            saliency_scores(
                unwrapped,
                input_ids[start : start + chunk],
                attention_mask[start : start + chunk],
                answer_mask[start : start + chunk],
                leaf=self.args.grail_leaf,
                temperature=self.temperature,
                position=self.args.grail_position,
            )
            for start in range(0, input_ids.size(0), chunk)
        ]
        return torch.cat(parts)

    def _saliency_sharing_loss_forward(
        self, model, unwrapped, input_ids, attention_mask, answer_mask, needs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Make the loss's forward (TRL's own call) in two row chunks, the rows that ``needs`` under the capture
        hooks; return their saliency and grad norms and memoise the reassembled forward for ``_compute_loss``."""
        rows, others = needs.nonzero().squeeze(-1), (~needs).nonzero().squeeze(-1)

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
            scores, grad_norms = answer_saliency(
                capture,
                unwrapped,
                input_ids[rows],
                answer_mask[rows],
                temperature=self.temperature,
                position=self.args.grail_position,
                retain_graph=True,
            )
        if others.numel():
            outputs.append(forward(others))
        order = torch.cat([rows, others]).argsort()
        logps, entropies = (torch.cat([out[k] for out in outputs])[order] for k in (0, 1))
        aux = torch.stack([out[2] for out in outputs]).mean() if self.aux_loss_enabled else None
        self._memoised_forward = (logps, entropies, aux)
        return scores, grad_norms

    def _saliency_own_forward(
        self, unwrapped, input_ids, attention_mask, spans, T
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Saliency and grad norms of the given rows (all with an answer) from a backbone forward of their own,
        in micro-batch chunks.

        Each chunk is cut after its last answer token: under causal attention the answer loss and its gradient at
        earlier positions do not depend on later ones, whose scores are 0.
        """
        prompt_length = input_ids.size(1) - T
        scores = input_ids.new_zeros((input_ids.size(0), T), dtype=torch.float32)
        grad_norms = scores.new_zeros(input_ids.size(0))
        chunk = self.args.per_device_train_batch_size
        for start in range(0, input_ids.size(0), chunk):
            part = slice(start, start + chunk)
            end = int(spans[part, 2].max())
            ids, mask = input_ids[part, : prompt_length + end], attention_mask[part, : prompt_length + end]
            capture = ForwardCapture(unwrapped, self.args.grail_leaf)
            with torch.enable_grad(), self.accelerator.autocast():
                with capture.hooks():
                    unwrapped.get_decoder()(input_ids=ids, attention_mask=mask, use_cache=False)
                scores[part, :end], part_norms = answer_saliency(
                    capture,
                    unwrapped,
                    ids,
                    answer_mask_from_spans(spans[part], end),
                    temperature=self.temperature,
                    position=self.args.grail_position,
                    retain_graph=False,
                )
            grad_norms[part] = part_norms * end / T  # a mean over all T positions, as upstream logs it
        return scores, grad_norms

    def _oar_g_weights(self, model, batch, spans, needs) -> torch.Tensor:
        """OAR-G weights (spec 2) of the rows that ``needs``, in micro-batch chunks; noise from a seeded generator."""
        if self._oar_g_generator is None:
            self._oar_g_generator = torch.Generator(device=self.accelerator.device)
            self._oar_g_generator.manual_seed(self.args.seed + self.accelerator.process_index)
        self._log_credit_stats({"saliency_rows_frac": _fraction(needs)})
        rows = needs.nonzero().squeeze(-1)
        input_ids, attention_mask = _full_sequence(batch)
        completion_mask = batch["completion_mask"]
        answer_mask = answer_mask_from_spans(spans, completion_mask.size(1))
        unwrapped = self.accelerator.unwrap_model(model)
        parts = [completion_mask.new_empty((0, completion_mask.size(1)), dtype=torch.float32)]
        weigh = OAR_G_VARIANTS[self.args.oar_g_variant]
        for chunk in rows.split(self.args.per_device_train_batch_size):
            with torch.enable_grad():
                weights = weigh(
                    unwrapped,
                    input_ids[chunk],
                    attention_mask[chunk],
                    completion_mask[chunk],
                    answer_mask[chunk],
                    tau=self.args.oar_g_tau,
                    beta=self.args.oar_g_beta,
                    eps=self.args.oar_g_eps,
                    noise_std=self.args.oar_g_noise_std,
                    generator=self._oar_g_generator,
                )
            parts.append(weights)
        return torch.cat(parts)

    # ---- metrics (TRL averages each list over its logging window) -------------------------------------------

    @property
    def _mode(self) -> str:
        return "train" if self.model.training else "eval"

    def _log_credit_stats(self, stats: dict[str, float]) -> None:
        """Append each value's across-process nan-mean under ``<credit>/``, unless it is NaN everywhere."""
        for name, value in stats.items():
            local = torch.tensor([float(value)], device=self.accelerator.device)
            gathered = self.accelerator.gather(local)
            if not torch.isnan(gathered).all():
                self._metrics[self._mode][f"{self.args.credit}/{name}"].append(gathered.nanmean().item())

    def _log_grad_norm_percentiles(self, grad_norms: torch.Tensor) -> None:
        """grail/grad_norm_p10 and _p90 over the scored rows of all processes (spec 1.9)."""
        local = grad_norms.float().to(self.accelerator.device)
        gathered = self.accelerator.gather(self.accelerator.pad_across_processes(local, dim=0, pad_index=-1.0))
        gathered = gathered[gathered >= 0]
        if gathered.numel():
            quantiles = torch.quantile(gathered, torch.tensor([0.1, 0.9], device=gathered.device))
            self._metrics[self._mode]["grail/grad_norm_p10"].append(quantiles[0].item())
            self._metrics[self._mode]["grail/grad_norm_p90"].append(quantiles[1].item())

    def _log_advantage_metrics(self, raw: torch.Tensor, weighted: torch.Tensor, completion_mask: torch.Tensor) -> None:
        """Spec 1.9 loss-side metrics under ``<credit>/``: raw_abs_mean = mean_i |A_i|,
        weighted_abs_mean = Σ|Â·m| / max(Σm, 1), the maxima, scale_ratio = weighted / (raw + 1e-8)."""
        mask = completion_mask.float()
        weighted_abs = (weighted * mask).abs()
        local = torch.stack(
            [raw.abs().mean(), weighted_abs.sum() / mask.sum().clamp(min=1), raw.abs().max(), weighted_abs.max()]
        )
        gathered = self.accelerator.gather(local.unsqueeze(0).float())
        raw_mean, weighted_mean = gathered[:, 0].mean().item(), gathered[:, 1].mean().item()
        metrics, prefix = self._metrics[self._mode], self.args.credit
        metrics[f"{prefix}/advantages_raw_abs_mean"].append(raw_mean)
        metrics[f"{prefix}/advantages_raw_abs_max"].append(gathered[:, 2].max().item())
        metrics[f"{prefix}/advantages_weighted_abs_mean"].append(weighted_mean)
        metrics[f"{prefix}/advantages_weighted_abs_max"].append(gathered[:, 3].max().item())
        metrics[f"{prefix}/advantages_scale_ratio"].append(weighted_mean / (raw_mean + 1e-8))


def _fraction(flags: torch.Tensor) -> float:
    """Mean of a bool tensor; NaN when empty."""
    return flags.float().mean().item() if flags.numel() else float("nan")


def _full_sequence(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of prompt followed by completion, as TRL's loss builds them."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    return input_ids, torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
