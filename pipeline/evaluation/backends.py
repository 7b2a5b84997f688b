"""Which backend samples an evaluation: ``auto`` is vLLM where it is installed and has a device, else transformers;
the choice is logged and recorded with the samples.
"""

from __future__ import annotations

import sys
from typing import Any

from pipeline.core.io import InputError
from pipeline.evaluation.eval_spec import Backend, EvalSpec
from pipeline.evaluation.hf_backend import HFBackend
from pipeline.evaluation.vllm_backend import VllmBackend, vllm_device_type


def choose_backend(requested: str, vllm_device: str | None) -> tuple[str, str | None]:
    """The backend to use and, when ``auto`` falls back to hf, the reason to print.

    ``vllm_device``: the device type of vLLM's platform ("cuda", "cpu", ...), "" when vLLM found no platform it
    runs on (a CUDA build without a GPU), None when vllm is not installed. ``vllm`` requested where it cannot run
    is an InputError.
    """
    if requested == "hf":
        return "hf", None
    if vllm_device:
        return "vllm", None
    reason = "vllm is not installed" if vllm_device is None else "vLLM found no device it runs on"
    if requested == "vllm":
        raise InputError(f"evaluation spec.backend: vllm requested but {reason}")
    return "hf", f"backend auto: {reason}; using the hf (transformers) backend"


def detect_backend(requested: str) -> str:
    """``choose_backend`` on this machine; the fallback reason goes to stderr."""
    backend, message = choose_backend(requested, None if requested == "hf" else vllm_device_type())
    if message:
        print(message, file=sys.stderr)
    return backend


def make_backend(name: str, model: str, tokenizer: Any, spec: EvalSpec, seed: int) -> Backend:
    """The backend ``name`` ("hf" or "vllm") loaded with ``model``."""
    if name == "vllm":
        return VllmBackend(model, spec, seed)
    return HFBackend(model, tokenizer, spec)
