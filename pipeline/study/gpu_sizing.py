"""How many GPUs an evaluation job on the vllm backend asks for, and in which engine layout.

``evaluation.gpu_sizing.layout`` chooses:

- ``fixed`` (default): every job runs ``evaluation.vllm``'s tensor_parallel_size x data_parallel_size, as written
  (configs/paper.yaml's upstream layout is TP2 x DP2 on 4 GPUs).
- ``sized``: from the model's size and the sequences (items x samples) the job generates. A model whose bf16
  weights plus the KV-cache reserve fit the usable memory of one GPU gets tensor_parallel_size 1; one that does not
  gets the smallest power-of-two tensor-parallel size that holds them (vLLM splits attention heads evenly, so
  powers of two divide every head count here). Then as many data-parallel engines as the sequences fill, one per
  ``sequences_per_engine``, at most ``max_gpus`` GPUs in all and at least one engine.

The formulas (``sized_layout``), with P parameters, M = gpu_memory_gb, u = the engine's gpu_memory_utilization
(vLLM's default 0.9 when the spec leaves it null), R = kv_cache_gb, S sequences:

    weights W = 2 P / 1e9 GB (bf16)
    TP = the smallest power of two t with t u M >= W + R (an engine's usable memory holds the weights and the reserve)
    DP = max(1, min(ceil(S / sequences_per_engine), floor(max_gpus / TP)))

What a layout changes in the samples (docs/fidelity.md): on vLLM a sample is a function of its batch's seed and of
the data-parallel engine that drew it (pipeline.evaluation.sampling), so another DP draws other samples from the
same distribution; another TP reduces in another floating-point order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pipeline.core.declared import Range, refuse_out_of_range, setting

EngineLayoutChoice = Literal["fixed", "sized"]  # config key `evaluation.gpu_sizing.layout`
BF16_BYTES = 2
GB = 1e9
# vLLM's gpu_memory_utilization when the spec's is null (pipeline.evaluation.vllm_backend passes it on a GPU).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9


@dataclass(frozen=True)
class GpuSizing:
    """The GPUs of each evaluation job on the vllm backend (pipeline.study.gpu_sizing; docs/cluster.md,
    docs/fidelity.md).

    ``evaluation.gpu_sizing``, declared here once (``pipeline.core.declared``). ``gpu_memory_gb``: a model sized for
    80 GB also fits an H200's 141 GB, while one sized for 141 GB would not start on an 80 GB GPU. ``kv_cache_gb``:
    16 GB is about 110,000 tokens of an 8 B model's cache (Qwen3-8B's 144 KiB a token). ``sequences_per_engine``:
    fewer per engine leave its batch part empty, so another engine adds only a start-up.
    """

    layout: EngineLayoutChoice = setting(
        "fixed",
        "fixed: evaluation.vllm's tensor_parallel_size x data_parallel_size for every job (upstream's: 2 x 2); "
        "sized: tensor_parallel_size 1 when the model's bf16 weights plus kv_cache_gb fit one GPU (else the smallest "
        "power of two that holds them) and one data-parallel engine per sequences_per_engine sequences (items x "
        "samples) the job generates, up to max_gpus GPUs; evaluation.vllm's two sizes and resources.evaluate.gpus "
        "are then left unset",
    )
    gpu_memory_gb: float = setting(
        80.0,
        "memory of one GPU in GB (80: A100/H100 80 GB, which a model sized for it fits on an H200's 141 GB too)",
        Range(exclusive_minimum=0),
    )
    kv_cache_gb: float = setting(
        16.0,
        "the least KV cache an engine keeps beside its weights, in GB (16: about 110,000 tokens of an 8 B model)",
        Range(minimum=0),
    )
    sequences_per_engine: int = setting(
        256,
        "sequences that keep one engine busy (vLLM's max_num_seqs, 256: the sequences an engine decodes at once)",
        Range(minimum=1),
    )
    max_gpus: int = setting(4, "the most GPUs one evaluation job asks for", Range(minimum=1))

    def __post_init__(self) -> None:
        refuse_out_of_range(self, "evaluation.gpu_sizing")


@dataclass(frozen=True)
class EngineLayout:
    """vLLM engines of one evaluation job: ``data_parallel_size`` engines of ``tensor_parallel_size`` GPUs; why."""

    tensor_parallel_size: int
    data_parallel_size: int
    reason: str

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.data_parallel_size


def layout_label(tensor: int, engines: int) -> str:
    """The tensor-parallel size and the data-parallel engines, as "TP2 x DP2"."""
    return f"TP{tensor} x DP{engines}"


def weights_gb(parameters: int) -> float:
    """bf16 weights in GB: 2 bytes a parameter, W = 2 P / 1e9."""
    return parameters * BF16_BYTES / GB


def smallest_tensor_parallel(weights: float, kv_cache: float, usable_per_gpu: float) -> int:
    """The smallest power of two t with t x usable_per_gpu >= weights + kv_cache (GB)."""
    size = 1
    while size * usable_per_gpu < weights + kv_cache:
        size *= 2
    return size


def data_parallel_engines(sequences: int | None, per_engine: int, most: int) -> int:
    """max(1, min(ceil(sequences / per_engine), most)); unknown sequences (None): ``most``."""
    wanted = most if sequences is None else math.ceil(sequences / per_engine)
    return max(1, min(wanted, most))


def sized_layout(parameters: int, sequences: int | None, sizing: GpuSizing, utilization: float) -> EngineLayout:
    """The sized layout of a job generating ``sequences`` with a model of ``parameters`` (module docstring), and
    why, e.g. "8.0 GB bf16 + 16 GB KV cache fit one 80 GB GPU at 0.95 utilization: TP1 x DP4 for 3,726 sequences".

    ValueError when the model needs more GPUs an engine than ``max_gpus`` (``Study`` refuses such a config first,
    naming the key).
    """
    weights = weights_gb(parameters)
    tensor = smallest_tensor_parallel(weights, sizing.kv_cache_gb, utilization * sizing.gpu_memory_gb)
    if tensor > sizing.max_gpus:
        raise ValueError(
            f"{weights:.1f} GB bf16 + {sizing.kv_cache_gb:g} GB KV cache need tensor_parallel_size {tensor} "
            f"on {sizing.gpu_memory_gb:g} GB GPUs, above max_gpus {sizing.max_gpus}"
        )
    engines = data_parallel_engines(sequences, sizing.sequences_per_engine, sizing.max_gpus // tensor)
    fits = (
        f"fit one {sizing.gpu_memory_gb:g} GB GPU"
        if tensor == 1
        else f"need {tensor} {sizing.gpu_memory_gb:g} GB GPUs an engine"
    )
    work = "an unknown number of sequences" if sequences is None else f"{sequences:,} sequences"
    return EngineLayout(
        tensor,
        engines,
        f"{weights:.1f} GB bf16 + {sizing.kv_cache_gb:g} GB KV cache {fits} at {utilization:g} utilization: "
        f"{layout_label(tensor, engines)} for {work}",
    )


def sizing_summary(sizing: GpuSizing) -> str:
    """The layout choice and, when sized, its assumptions in a few words (the preflight's heading)."""
    if sizing.layout == "fixed":
        return "layout fixed"
    return (
        f"layout sized: {sizing.gpu_memory_gb:g} GB GPUs, one engine per {sizing.sequences_per_engine} sequences, "
        f"at most {sizing.max_gpus} GPUs a job"
    )


def fixed_layout(vllm: Mapping[str, Any]) -> EngineLayout:
    """``evaluation.vllm``'s tensor_parallel_size x data_parallel_size as written (layout ``fixed``)."""
    tensor, engines = vllm["tensor_parallel_size"], vllm["data_parallel_size"]
    return EngineLayout(tensor, engines, f"layout fixed: {layout_label(tensor, engines)} as evaluation.vllm sets it")


def engine_utilization(vllm: Mapping[str, Any]) -> float:
    """The fraction of a GPU's memory an engine may use: the spec's, else vLLM's default."""
    return vllm.get("gpu_memory_utilization") or DEFAULT_GPU_MEMORY_UTILIZATION
