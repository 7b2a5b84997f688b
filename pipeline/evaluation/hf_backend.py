"""The transformers backend of the evaluation stage: left-padded batches through ``model.generate``, each row
sampled with its own unit's randomness (``UnitGumbelSampler``; the seeding contract: ``pipeline.evaluation.sampling``).

Why not ``generate(do_sample=True)``: it draws every row's next token from one generator (``torch.multinomial`` on
the whole batch), so a row's sample depends on which rows share its batch and in what order. Here the sampling is a
logits processor and ``generate`` runs greedy: at every step each row adds Gumbel noise drawn from a generator
seeded with its unit's seed to its warped logits, and the argmax is a sample of the warped distribution
(the Gumbel-max trick).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.evaluation.eval_spec import EvalSpec, Generation, Request
from pipeline.models.loading import load_model, working_dtype


def gumbel_noise(uniform: Any) -> Any:
    """Standard Gumbel noise from uniforms on (0, 1): ``g = -log(-log(u))``; ``argmax(l + g)`` is then distributed
    as ``softmax(l)`` (the Gumbel-max trick). ``u`` is clamped away from 0 and 1, where ``g`` is infinite."""
    import torch

    tiny = torch.finfo(uniform.dtype).tiny
    return -torch.log(-torch.log(uniform.clamp(tiny, 1 - torch.finfo(uniform.dtype).eps)))


class UnitGumbelSampler:
    """A ``generate`` logits processor that samples row ``i`` with its own generator, seeded with ``seeds[i]``:
    scores -> temperature -> top-k -> top-p (transformers' own warpers, in ``generate``'s order) -> + Gumbel noise
    of row ``i``'s generator. Under greedy decoding, row ``i``'s tokens are then a function of its prompt, the model
    and its seed alone, whatever the batch holds: one ``(vocab,)`` draw a step per row, in row order."""

    def __init__(self, seeds: Sequence[int], temperature: float, top_k: int, top_p: float, device: str) -> None:
        import torch
        from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        self.generators = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]
        self.warpers: list[Any] = [TemperatureLogitsWarper(temperature)]
        if top_k > 0:
            self.warpers.append(TopKLogitsWarper(top_k))
        if top_p < 1:
            self.warpers.append(TopPLogitsWarper(top_p))

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        for warper in self.warpers:
            scores = warper(input_ids, scores)
        if scores.shape[0] != len(self.generators):
            raise ValueError(f"UnitGumbelSampler: {scores.shape[0]} rows of scores for {len(self.generators)} seeds")
        uniforms = torch.stack(
            [
                torch.rand(scores.shape[1], generator=generator, device=scores.device, dtype=torch.float32)
                for generator in self.generators
            ]
        )
        # float64 scores stay float64: rounding them to float32 would give back the last-bit differences float64
        # removes (pipeline.models.tiny_model.TinyModelSpec.dtype); half-precision scores are widened as before.
        return scores.to(torch.promote_types(scores.dtype, torch.float32)) + gumbel_noise(uniforms)


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
        self.model = load_model(model, dtype=working_dtype(model, self.device)).to(self.device).eval()
        self.tokenizer = tokenizer
        self.spec = spec
        configured = self.model.generation_config.eos_token_id
        configured = configured if isinstance(configured, list) else [configured]
        self.eos_ids = {token for token in [*configured, tokenizer.eos_token_id] if token is not None}

    def sampling_kwargs(self, seeds: Sequence[int]) -> dict[str, Any]:
        """``generate`` options: greedy decoding, at temperature > 0 through ``UnitGumbelSampler`` (a sample per
        row from its own seed; top_k <= 0 disables top-k), plain greedy at 0. The model's own generation defaults
        (temperature, top_p, top_k) are cleared: the spec's settings alone decide the sampling."""
        from transformers import LogitsProcessorList

        spec = self.spec
        greedy = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        if spec.temperature == 0:
            return greedy
        sampler = UnitGumbelSampler(seeds, spec.temperature, spec.top_k, spec.top_p, self.device)
        return {**greedy, "logits_processor": LogitsProcessorList([sampler])}

    def generate(self, requests: Sequence[Request]) -> list[Generation]:
        torch = self.torch
        ids, mask = left_pad([r.prompt_ids for r in requests], self.tokenizer.pad_token_id)
        with torch.inference_mode():
            output = self.model.generate(
                input_ids=torch.tensor(ids, device=self.device),
                attention_mask=torch.tensor(mask, device=self.device),
                max_new_tokens=self.spec.max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=sorted(self.eos_ids),
                **self.sampling_kwargs([r.seed for r in requests]),
            )
        generations = []
        for row in output[:, len(ids[0]) :].tolist():
            tokens, count = cut_at_eos(row, self.eos_ids)
            generations.append(Generation(self.tokenizer.decode(tokens, skip_special_tokens=True), count))
        return generations
