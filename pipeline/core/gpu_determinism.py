"""GPU determinism: the knobs that make a training run or an evaluation repeat itself bitwise on the same GPU model
and count, turned on by the study's ``gpu_determinism`` (default off, as upstream and the paper's config), and a
record of the knobs in effect for provenance.

With the study's key on, the training and evaluation stages set, before CUDA, NCCL or vLLM start (``apply``):

    torch.use_deterministic_algorithms(True)  every operator with a deterministic CUDA kernel uses it (scatter/index
                                              add, index_put, ...); one without raises torch's RuntimeError naming it
    torch.backends.cudnn.benchmark = False    cuDNN does not time candidate kernels and keep the fastest, which may
                                              differ from run to run
    CUBLAS_WORKSPACE_CONFIG=:4096:8           a fixed cuBLAS workspace, which deterministic cuBLAS needs (torch
                                              refuses a CUDA matrix product under deterministic algorithms without)
    FLASH_ATTENTION_DETERMINISTIC=1           transformers then calls flash-attn with ``deterministic=True``: its
                                              backward pass otherwise accumulates with atomics
    NCCL_ALGO=Ring                            one all-reduce algorithm, so a run's gradient sums are added in the
                                              same order every time (NCCL otherwise picks Ring or Tree by size and
                                              topology)
    VLLM_BATCH_INVARIANT=1                    vLLM 0.31's batch-invariant mode: a request's tokens do not depend on
                                              the other requests of its batch. Set only where CUDA is visible:
                                              vLLM's CPU worker would install its Triton kernels (CUDA and XPU only)
                                              for the CPU's operators. What vLLM requires of it is in
                                              docs/fidelity.md ("What a GPU run can hold")

transformers' own ``full_determinism`` (a GRPOConfig field) covers the trainer only, and sets
``CUDA_LAUNCH_BLOCKING=1``, which serialises every kernel launch and is not needed for determinism on current CUDA;
evaluation, NCCL and vLLM are outside it, hence this module.

The route is the kernel pin's (pipeline.core.kernels): the Snakefile passes the study's key to every job as
``GRAIL_GPU_DETERMINISM`` (``configure``), and the training and evaluation stages apply it; a stage run on its own
applies it when ``GRAIL_GPU_DETERMINISM=1``. Off, nothing is set and nothing changes.

On the CPU the CUDA, NCCL and vLLM knobs are inert; deterministic algorithms make torch's few CPU operators with a
nondeterministic kernel (index_put and put_ with accumulation) take a deterministic one, and fill memory that torch
allocates uninitialised with NaN. The CI study gives the same numbers, bit for bit, with it on as off
(docs/fidelity.md; tests/pipeline/test_workflow_e2e.py retrains a run and re-evaluates the baseline with it on).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

GPU_DETERMINISM_VARIABLE = "GRAIL_GPU_DETERMINISM"
ENVIRONMENT = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "FLASH_ATTENTION_DETERMINISTIC": "1", "NCCL_ALGO": "Ring"}
CUDA_ONLY = {"VLLM_BATCH_INVARIANT": "1"}
# Variables that also decide a GPU run's determinism when set from outside, recorded as they are (vLLM's
# batch-invariant mode sets CUBLAS_WORKSPACE_CONFIG and NCCL's in the processes that run its workers).
OBSERVED = (*ENVIRONMENT, *CUDA_ONLY, "CUBLASLT_WORKSPACE_SIZE", "NCCL_PROTO", "CUDA_LAUNCH_BLOCKING")


def requested(environment: Mapping[str, str] = os.environ) -> bool:
    """``GRAIL_GPU_DETERMINISM`` is 1/true/on/yes."""
    return environment.get(GPU_DETERMINISM_VARIABLE, "0").strip().lower() in {"1", "true", "on", "yes"}


def configure(enabled: bool) -> None:
    """The study's ``gpu_determinism`` for every job this process starts (they inherit its environment)."""
    os.environ[GPU_DETERMINISM_VARIABLE] = "1" if enabled else "0"


def apply() -> None:
    """Set the knobs (module docstring) in this process, and through its environment in the processes it starts,
    when requested; called by a stage before it starts CUDA, NCCL or vLLM. Imports torch."""
    if not requested():
        return
    import torch

    os.environ.update(ENVIRONMENT)
    if torch.cuda.is_available():
        os.environ.update(CUDA_ONLY)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def gpu_record() -> dict[str, Any]:
    """The knobs in effect in this process, and the GPUs it sees with the process count of its run (what a bitwise
    repeat needs the same of). Imports torch."""
    import torch

    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {
        "gpu_determinism": requested(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "variables": {name: os.environ[name] for name in OBSERVED if name in os.environ},
        "devices": [torch.cuda.get_device_name(index) for index in range(devices)],
        "processes": int(os.environ.get("WORLD_SIZE", "1")),
    }
