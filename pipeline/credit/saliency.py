"""GRAIL saliency scores (spec 1.2-1.4): gradient x activation of the answer loss at a chosen leaf.

    L_ans   = - sum_i sum_{t in answer_i} log softmax(z_{i,t} / temperature)[c_{i,t}]
    s_{i,t} = || dL_ans/dh_{i,p(t)} * h_{i,p(t)} ||_2          (norm over the hidden dimension, float32)

with z_{i,t} the logits predicting completion token t (input position P+t-1), h the leaf activation and
p(t) = P+t-1 ("previous", upstream's one-position shift) or P+t ("same").
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

LEAVES = ("embeddings", "first", "middle", "last")
POSITIONS = ("previous", "same")


def _working_dtype(dtype: torch.dtype) -> torch.dtype:
    """At least float32 (bf16/fp16 are widened; float64 stays float64)."""
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
    logprobs = torch.log_softmax(logits.to(_working_dtype(logits.dtype)), dim=-1)
    return logprobs.gather(-1, tokens[:, None]).squeeze(-1)


def saliency_from_grad(
    grad: torch.Tensor,
    leaf_activation: torch.Tensor,
    completion_length: int,
    position: Literal["previous", "same"] = "previous",
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
    dtype = _working_dtype(grad.dtype)
    return (grad.to(dtype) * leaf_activation.to(dtype)).norm(dim=-1).float()


def saliency_scores(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    answer_mask: torch.Tensor,
    *,
    leaf: Literal["embeddings", "first", "middle", "last"] = "embeddings",
    temperature: float = 1.0,
    position: Literal["previous", "same"] = "previous",
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
