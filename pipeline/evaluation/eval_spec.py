"""What an evaluation is asked and what it returns: the evaluation spec (sampling, grading, the vLLM settings), a
benchmark item, a unit (item x sample index), a backend's request and generation, and the backend protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pipeline.core.declared import Range, refuse_out_of_range, setting
from pipeline.core.io import InputError
from pipeline.core.specs import dataclass_from_mapping
from pipeline.tasks.boxed import ExtractionMode
from pipeline.tasks.generation import derive_seed
from pipeline.tasks.grading import GradingMode
from pipeline.tasks.prompts import PromptTemplate

SAMPLE_KEYS = ("id", "sample", "completion", "extracted", "correct", "num_tokens", "backend")


BackendName = Literal["auto", "hf", "vllm"]


@dataclass(frozen=True)
class VllmSettings:
    """Engine settings of the vllm backend: data_parallel_size engines of tensor_parallel_size GPUs.

    ``evaluation.vllm``, declared here once (``pipeline.core.declared``). ``gpu_memory_utilization`` None on vLLM's
    CPU platform: a fixed KV cache of ``pipeline.models.vllm_cpu.CPU_KV_CACHE_GIB`` GiB (``kv_cache_memory_bytes``;
    vLLM's ``VLLM_CPU_KVCACHE_SPACE`` overrides it), because the fraction's cache depends on the machine's state: 0.3
    reserved 6.4 GiB for the tiny model and the OOM killer ended the run on a 24 GiB machine, and 0.1 left
    SmolLM2-135M 0.11 GiB (0.1 x 13.6 GiB of node memory under a memory balloon, less 1.24 GiB resident), too little
    for one 8,192-token sequence, so the engine refused to start.
    """

    tensor_parallel_size: int = setting(
        1,
        "GPUs per engine; the evaluate job asks for tensor x data parallel GPUs (layout sized: chosen per job, "
        "evaluation.gpu_sizing)",
        Range(minimum=1),
    )
    data_parallel_size: int = setting(1, "engines (layout sized: chosen per job)", Range(minimum=1))
    gpu_memory_utilization: float | None = setting(
        None,
        "GPU: fraction of its memory; vLLM's CPU platform: fraction of the NUMA node's memory for weights and KV "
        "cache (null: 0.9 on a GPU; on the CPU a fixed 1 GiB KV cache instead, VLLM_CPU_KVCACHE_SPACE to change it)",
        Range(exclusive_minimum=0, maximum=1),
    )
    max_model_len: int | None = setting(
        None, "prompt + completion tokens per sequence (null: the model's own limit)", Range(minimum=1)
    )
    enable_prefix_caching: bool = setting(True, "vLLM's prefix caching (the prompts' shared prefix computed once)")

    def __post_init__(self) -> None:
        refuse_out_of_range(self, "evaluation.vllm")


@dataclass(frozen=True)
class EvalSpec:
    """EVAL_SPEC: backend, sampling, batching, prompt and grading settings (defaults: upstream, spec 6.2)."""

    backend: BackendName = "auto"
    n_samples: int = 3
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    max_new_tokens: int = 8192
    batch_size: int = 64
    prompt_template: PromptTemplate = "clean"
    enable_thinking: bool = False
    grading_timeout_seconds: int = 5
    max_answer_chars: int = 1000
    grading: GradingMode = "clean"
    extraction: ExtractionMode = "clean"
    vllm: VllmSettings = field(default_factory=VllmSettings)


@dataclass(frozen=True)
class Item:
    """One benchmark item."""

    id: str
    problem: str
    answer: str


@dataclass(frozen=True)
class Unit:
    """One (item, sample) pair to generate; ``seed`` is its derived seed."""

    item_index: int
    item_id: str
    sample: int
    seed: int

    @property
    def key(self) -> tuple[str, int]:
        """The unit's identity in output rows: (id, sample)."""
        return self.item_id, self.sample


@dataclass(frozen=True)
class Request:
    """What a backend generates from: the prompt's token ids and a seed."""

    prompt_ids: list[int]
    seed: int


@dataclass(frozen=True)
class Generation:
    """A backend's answer to one request: the completion text and its number of generated tokens (eos included)."""

    text: str
    num_tokens: int


class Backend(Protocol):
    def generate(self, requests: Sequence[Request]) -> list[Generation]: ...


def parse_eval_spec(mapping: Any) -> EvalSpec:
    """EVAL_SPEC from a mapping; unknown keys, wrong types and out-of-range values raise InputError by name."""
    spec = dataclass_from_mapping(EvalSpec, mapping, "evaluation spec")
    checks = {
        "n_samples": spec.n_samples >= 1,
        "batch_size": spec.batch_size >= 1,
        "max_new_tokens": spec.max_new_tokens >= 1,
        "temperature": spec.temperature >= 0,
        "top_p": 0 < spec.top_p <= 1,
        "grading_timeout_seconds": spec.grading_timeout_seconds >= 1,
        "max_answer_chars": spec.max_answer_chars >= 1,
    }  # the vllm settings check their declared ranges when built (VllmSettings)
    for key, valid in checks.items():
        if not valid:
            raise InputError(f"evaluation spec.{key}: invalid value {getattr(spec, key)!r}")
    return spec


def batch_seed(requests: Sequence[Request]) -> int:
    """The seed a batch is sampled with: ``derive_seed`` of its requests' seeds (module docstring, "Seeds")."""
    return derive_seed(*(r.seed for r in requests))
