"""What an evaluation is asked and what it returns: the evaluation spec (sampling, grading, the vLLM settings), a
benchmark item, a unit (item x sample index), a backend's request and generation, and the backend protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pipeline.core.declared import Range, refuse_out_of_range, setting
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
    """EVAL_SPEC: backend, sampling, batching, prompt and grading settings (defaults: upstream, spec 6.2).

    The evaluate stage's keys of the ``evaluation`` section, declared here once (``pipeline.core.declared``;
    ``python -m tools.schema`` writes them into the schema); the section's other keys plan jobs."""

    backend: BackendName = setting(
        "auto",
        "auto: vllm when vLLM is installed and finds a device it runs on, else hf (Hugging Face generation); vllm "
        "where it cannot run is an error",
    )
    n_samples: int = setting(3, "samples per item: acc@n and pass@n", Range(minimum=1))
    temperature: float = setting(0.6, "sampling temperature (0 is greedy)", Range(minimum=0))
    top_p: float = setting(
        0.95,
        "nucleus sampling: the smallest set of tokens whose probability reaches top_p",
        Range(exclusive_minimum=0, maximum=1),
    )
    top_k: int = setting(20, "sampling from the top_k most likely tokens (-1: no limit)", Range(minimum=-1))
    max_new_tokens: int = setting(8192, "the longest completion", Range(minimum=1))
    batch_size: int = setting(
        64,
        "prompts per generation batch (hf: samples do not depend on it, each (item, sample) has its own seed; vllm: "
        "the engine is reseeded per batch, so samples depend on it)",
        Range(minimum=1),
    )
    prompt_template: PromptTemplate = setting("clean", "the prompt's wording", shared="prompt_template")
    enable_thinking: bool = setting(False, "passed to the chat template (Qwen3: false pre-fills an empty think block)")
    grading_timeout_seconds: int = setting(5, "math-verify's timeout per graded answer", Range(minimum=1))
    max_answer_chars: int = setting(
        1000, "an extracted answer longer than this scores 0 (clean extraction only)", Range(minimum=1)
    )
    grading: GradingMode = setting("clean", "the evaluation's grader", shared="grading")
    extraction: ExtractionMode = setting(
        "clean",
        "clean: unclosed boxes skipped, answers over max_answer_chars score 0; upstream: the scan stops at the first "
        "unclosed box, no length limit (spec 6.2)",
    )
    vllm: VllmSettings = field(default_factory=VllmSettings, metadata={"section": True})

    def __post_init__(self) -> None:
        refuse_out_of_range(self, "evaluation")


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
    """EVAL_SPEC from a mapping; unknown keys, wrong types and out-of-range values (the declared ranges, checked
    when the spec is built) raise InputError by name."""
    return dataclass_from_mapping(EvalSpec, mapping, "evaluation spec")


def batch_seed(requests: Sequence[Request]) -> int:
    """The seed a batch is sampled with: ``derive_seed`` of its requests' seeds (module docstring, "Seeds")."""
    return derive_seed(*(r.seed for r in requests))
