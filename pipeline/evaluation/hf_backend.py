"""The transformers backend of the evaluation stage: left-padded batches through ``model.generate``, seeded with
``torch.manual_seed(batch seed)`` before each batch (the seeding contract: ``pipeline.evaluation.sampling``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.evaluation.eval_spec import EvalSpec, Generation, Request, batch_seed
from pipeline.models.loading import load_model


def left_pad(prompts: Sequence[Sequence[int]], pad_token_id: int) -> tuple[list[list[int]], list[list[int]]]:
    """Left-padded token ids and their attention masks (1 on real tokens), all of the longest prompt's length."""
    length = max(len(p) for p in prompts)
    ids = [[pad_token_id] * (length - len(p)) + list(p) for p in prompts]
    mask = [[0] * (length - len(p)) + [1] * len(p) for p in prompts]
    return ids, mask


def cut_at_eos(tokens: Sequence[int], eos_ids: set[int]) -> tuple[list[int], int]:
    """The tokens before the first eos and the generated count (through that eos; all tokens if there is none)."""
    for position, token in enumerate(tokens):
        if token in eos_ids:
            return list(tokens[:position]), position + 1
    return list(tokens), len(tokens)


class HFBackend:
    """Batched ``transformers`` sampling (left padding), on the GPU when there is one, else the CPU."""

    def __init__(self, model: str, tokenizer: Any, spec: EvalSpec) -> None:
        import torch

        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = "auto" if self.device == "cuda" else torch.float32
        self.model = load_model(model, dtype=dtype).to(self.device).eval()
        self.tokenizer = tokenizer
        self.spec = spec
        configured = self.model.generation_config.eos_token_id
        configured = configured if isinstance(configured, list) else [configured]
        self.eos_ids = {token for token in [*configured, tokenizer.eos_token_id] if token is not None}

    def sampling_kwargs(self) -> dict[str, Any]:
        """``generate`` options: sampling at temperature > 0 (top_k <= 0 disables top-k), greedy at 0."""
        spec = self.spec
        if spec.temperature == 0:
            return {"do_sample": False}
        return {"do_sample": True, "temperature": spec.temperature, "top_p": spec.top_p, "top_k": max(spec.top_k, 0)}

    def generate(self, requests: Sequence[Request]) -> list[Generation]:
        torch = self.torch
        ids, mask = left_pad([r.prompt_ids for r in requests], self.tokenizer.pad_token_id)
        torch.manual_seed(batch_seed(requests))
        with torch.inference_mode():
            output = self.model.generate(
                input_ids=torch.tensor(ids, device=self.device),
                attention_mask=torch.tensor(mask, device=self.device),
                max_new_tokens=self.spec.max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=sorted(self.eos_ids),
                **self.sampling_kwargs(),
            )
        generations = []
        for row in output[:, len(ids[0]) :].tolist():
            tokens, count = cut_at_eos(row, self.eos_ids)
            generations.append(Generation(self.tokenizer.decode(tokens, skip_special_tokens=True), count))
        return generations
