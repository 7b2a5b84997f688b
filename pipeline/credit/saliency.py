"""GRAIL saliency scores (spec 1.2-1.4): gradient x activation of the answer loss at a chosen leaf.

    L_ans   = - sum_i sum_{t in answer_i} log softmax(z_{i,t} / temperature)[c_{i,t}]
    s_{i,t} = || dL_ans/dh_{i,p(t)} * h_{i,p(t)} ||_2          (norm over the hidden dimension, float32)

with z_{i,t} the logits predicting completion token t (input position P+t-1), h the leaf activation and
p(t) = P+t-1 ("previous", upstream's one-position shift) or P+t ("same").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal, get_args

from pipeline.core.deferred import DeferredModule
from pipeline.core.io import InputError
from pipeline.credit.spans import answer_mask_from_spans

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
    from torch import nn
else:  # torch at first use: planning loads the credit methods without it (pipeline.core.deferred)
    torch = DeferredModule("torch")
    F = DeferredModule("torch.nn.functional")
    nn = DeferredModule("torch.nn")

Leaf = Literal["embeddings", "first", "middle", "last"]
Position = Literal["previous", "same"]
LEAVES: tuple[str, ...] = get_args(Leaf)
POSITIONS: tuple[str, ...] = get_args(Position)


def at_least_float32(dtype: torch.dtype) -> torch.dtype:
    """At least float32 (bf16/fp16 are widened; float64 stays float64: a float64 model's credit is computed in float64,
    where CPU kernel paths agree to the last bits that matter, pipeline.models.tiny_model.TinyModelSpec.dtype)."""
    return torch.promote_types(dtype, torch.float32)


def detached_head(model) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The LM head's weight and bias, detached (no gradient may reach the parameters)."""
    head = model.get_output_embeddings()
    bias = getattr(head, "bias", None)
    return head.weight.detach(), None if bias is None else bias.detach()


def completion_hidden(hidden: torch.Tensor, T: int) -> torch.Tensor:
    """Positions P-1 .. P+T-2 of a (B, P+T, d) tensor: the outputs that predict completion tokens 0 .. T-1."""
    return hidden[:, -(T + 1) : -1]


def leaf_index(leaf: str, num_layers: int) -> int:
    """Index into ``hidden_states`` (length L+1) of a non-embedding leaf: first 1, middle floor(L/2), last L-1."""
    indices = {"first": 1, "middle": num_layers // 2, "last": num_layers - 1}
    if leaf not in indices:
        raise ValueError(f"leaf must be one of {LEAVES}, got {leaf!r}")
    return indices[leaf]


def answer_token_logprobs(
    model, last_hidden: torch.Tensor, input_ids: torch.Tensor, answer_mask: torch.Tensor, temperature: float
) -> torch.Tensor:
    """log softmax(z / temperature)[c] at the answer positions only, flattened: (number of answer tokens,).

    Only the answer positions get vocabulary logits, so no (B, T, V) tensor is built.
    """
    T = answer_mask.shape[1]
    weight, bias = detached_head(model)
    hidden = completion_hidden(last_hidden, T)[answer_mask]
    logits = F.linear(hidden, weight, bias) / temperature
    tokens = input_ids[:, -T:][answer_mask]
    logprobs = torch.log_softmax(logits.to(at_least_float32(logits.dtype)), dim=-1)
    return logprobs.gather(-1, tokens[:, None]).squeeze(-1)


def saliency_from_grad(
    grad: torch.Tensor,
    leaf_activation: torch.Tensor,
    completion_length: int,
    position: Position = "previous",
) -> torch.Tensor:
    """s_{i,t} = || grad_{i,p(t)} * h_{i,p(t)} ||_2 for t < T, as float32 (B, T).

    ``grad`` and ``leaf_activation`` are (B, P+T, d); p(t) = P+t-1 for "previous", P+t for "same".
    """
    T = completion_length
    if position == "previous":
        grad, leaf_activation = completion_hidden(grad, T), completion_hidden(leaf_activation, T)
    elif position == "same":
        grad, leaf_activation = grad[:, -T:], leaf_activation[:, -T:]
    else:
        raise ValueError(f"position must be one of {POSITIONS}, got {position!r}")
    dtype = at_least_float32(grad.dtype)
    return (grad.to(dtype) * leaf_activation.to(dtype)).norm(dim=-1).float()


def saliency_scores(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    answer_mask: torch.Tensor,
    *,
    leaf: Leaf = "embeddings",
    temperature: float = 1.0,
    position: Position = "previous",
) -> torch.Tensor:
    """Reference (upstream-style) saliency: a separate forward pass, then ``autograd.grad`` w.r.t. the leaf only.

    ``input_ids`` (B, P+T) = left-padded prompt followed by T right-padded completion positions; ``answer_mask``
    (B, T) bool. The embeddings are a detached copy that requires grad; the leaf is that copy ("embeddings") or
    hidden_states[1 | floor(L/2) | L-1] ("first" | "middle" | "last") of the decoder. The model's mode (train /
    eval, gradient checkpointing) is the caller's. Returns float32 (B, T); no parameter ``.grad`` is touched.
    """
    if leaf not in LEAVES:
        raise ValueError(f"leaf must be one of {LEAVES}, got {leaf!r}")
    if position not in POSITIONS:
        raise ValueError(f"position must be one of {POSITIONS}, got {position!r}")
    T = answer_mask.shape[1]
    if not answer_mask.any():
        return torch.zeros(answer_mask.shape, dtype=torch.float32, device=answer_mask.device)
    with torch.enable_grad():
        embeddings = model.get_input_embeddings()(input_ids).detach().requires_grad_(True)
        output = model.get_decoder()(
            inputs_embeds=embeddings, attention_mask=attention_mask, use_cache=False, output_hidden_states=True
        )
        hidden_states = output.hidden_states
        activation = embeddings if leaf == "embeddings" else hidden_states[leaf_index(leaf, len(hidden_states) - 1)]
        loss = -answer_token_logprobs(model, output.last_hidden_state, input_ids, answer_mask, temperature).sum()
        (grad,) = torch.autograd.grad(loss, activation)
    return saliency_from_grad(grad, activation.detach(), T, position)


def leaf_module(model: nn.Module, leaf: str) -> nn.Module:
    """Module whose output is the GRAIL leaf ``hidden_states[k]`` (spec 1.2).

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


def answer_saliency_own_forward(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    spans: torch.Tensor,
    completion_length: int,
    *,
    leaf: str,
    temperature: float,
    position: str,
    chunk_size: int,
    autocast: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Saliency (B, T) and grad norms (B,) of rows that all have an answer, from a backbone forward of their own,
    in chunks of ``chunk_size`` rows (``autocast``: the mixed-precision context to run them in).

    Each chunk is cut after its last answer token: under causal attention the answer loss and its gradient at
    earlier positions do not depend on later ones, whose scores are 0. The grad norm is a mean over all T
    positions, as upstream logs it.
    """
    T = completion_length
    prompt_length = input_ids.size(1) - T
    scores = input_ids.new_zeros((input_ids.size(0), T), dtype=torch.float32)
    grad_norms = scores.new_zeros(input_ids.size(0))
    for start in range(0, input_ids.size(0), chunk_size):
        part = slice(start, start + chunk_size)
        end = int(spans[part, 2].max())
        ids, mask = input_ids[part, : prompt_length + end], attention_mask[part, : prompt_length + end]
        capture = ForwardCapture(model, leaf)
        with torch.enable_grad(), autocast():
            with capture.hooks():
                model.get_decoder()(input_ids=ids, attention_mask=mask, use_cache=False)
            scores[part, :end], part_norms = answer_saliency(
                capture,
                model,
                ids,
                answer_mask_from_spans(spans[part], end),
                temperature=temperature,
                position=position,
                retain_graph=False,
            )
        grad_norms[part] = part_norms * end / T
    return scores, grad_norms
