"""Stage `evaluate`: sample a model on one or more benchmarks, grade every sample, resumably.

    python -m pipeline.evaluate --model MODEL_DIR_OR_HUB_ID --spec EVAL_SPEC --seed S
                                --benchmark eval_data/A.jsonl --out A.jsonl [--benchmark B.jsonl --out B.jsonl ...]

``--benchmark``, ``--out`` and ``--audit`` repeat, paired in order: one job evaluates a checkpoint on every
benchmark with one engine (the Snakefile's default, ``evaluation.job_per``), each into its own samples file.

What a sample is, how it is graded, seeded and resumed is ``pipeline.evaluation.sampling``'s; the two backends
are ``pipeline.evaluation.hf_backend`` and ``pipeline.evaluation.vllm_backend``. vLLM on the CPU runs unpinned
(``pipeline.core.kernels.run_natively``): its CPU kernels abort or lose determinism on the pinned path.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.core import gpu_determinism, kernels
from pipeline.core.io import load_spec, run_cli
from pipeline.evaluation.backends import detect_backend
from pipeline.evaluation.eval_spec import parse_eval_spec
from pipeline.evaluation.sampling import BenchmarkOutput, evaluate_benchmarks
from pipeline.evaluation.vllm_backend import vllm_device_type
from pipeline.models.loading import model_hub_records, resolve_model
from pipeline.tasks.gold_audit import clean_only_warning


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model directory or a Hugging Face hub id")
    parser.add_argument("--model-revision", help="the hub revision (commit, tag or branch) of a hub id")
    parser.add_argument(
        "--benchmark", action="append", required=True, help="benchmark JSONL (id, problem, answer, source); repeats"
    )
    parser.add_argument("--spec", required=True, help="EVAL_SPEC: inline JSON or a JSON/YAML file")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument(
        "--out", action="append", required=True, help="per-sample JSONL output (written atomically), one a benchmark"
    )
    parser.add_argument(
        "--audit", action="append", help="the benchmark's gold audit (prepare_benchmarks): warn about refused golds"
    )
    parser.add_argument(
        "--rerun-key",
        help="the digest of the evaluate rule's rerun params (the Snakefile passes it, pipeline.core.rerun_key): "
        "samples are kept for a rerun of the job under this key and given back only under it; without it nothing "
        "is kept or given back",
    )
    args = parser.parse_args(argv)
    if len(args.out) != len(args.benchmark) or (args.audit and len(args.audit) != len(args.benchmark)):
        parser.error(
            f"give one --out (and, if any, one --audit) for each --benchmark: {len(args.benchmark)} --benchmark, "
            f"{len(args.out)} --out, {len(args.audit or [])} --audit"
        )
    spec = parse_eval_spec(load_spec(args.spec))
    if detect_backend(spec.backend) == "vllm" and vllm_device_type() == "cpu":
        arguments = sys.argv[1:] if argv is None else argv
        kernels.run_natively("pipeline.evaluate", arguments, "vLLM's CPU kernels are built for this machine")
    gpu_determinism.apply()  # before the model and any vLLM engine start
    if spec.grading == "clean":
        for audit in args.audit or []:
            if warning := clean_only_warning(json.loads(Path(audit).read_text())):
                print(f"evaluate: WARNING: {warning}", file=sys.stderr)  # it names the benchmark
    model = resolve_model(args.model, args.model_revision)
    hub = model_hub_records(args.model, args.model_revision)
    outputs = [BenchmarkOutput(Path(b), Path(o)) for b, o in zip(args.benchmark, args.out, strict=True)]
    evaluate_benchmarks(model, outputs, spec, args.seed, hub=hub, rerun_key=args.rerun_key)


if __name__ == "__main__":
    run_cli(main)
