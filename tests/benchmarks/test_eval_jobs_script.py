"""benchmarks/eval_jobs.py: both layouts run the evaluate stage on the packaged SmolLM2 checkpoint, the per-checkpoint
job starts one backend where the per-benchmark jobs start one each, and the two layouts' samples are compared row for
row (wall time is reported, never asserted)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_one_job_per_checkpoint_starts_one_backend_and_gives_the_per_benchmark_samples(tmp_path):
    out = tmp_path / "eval_jobs.json"
    command = [sys.executable, str(REPO / "benchmarks" / "eval_jobs.py"), "--backend", "hf"]
    command += ["--gsm8k-items", "2", "--symbolic", "1", "--count", "2", "--n-samples", "2"]
    command += ["--max-new-tokens", "6", "--batch-size", "4", "--work", str(tmp_path / "work"), "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    subprocess.run(command, check=True, cwd=tmp_path, capture_output=True, text=True, env=env)

    result = json.loads(out.read_text())
    assert result["benchmarks"] == {"gsm8k": 2, "gsm_symbolic_0": 2}
    layouts = result["layouts"]
    assert {name: (row["jobs"], row["engine_startups"]) for name, row in layouts.items()} == {
        "per_benchmark": (2, 2),
        "per_checkpoint": (1, 1),
    }
    assert result["same_samples"] is True
    assert all(math.isfinite(row["wall_s"]) and row["wall_s"] > 0 for row in layouts.values())
    ratio = layouts["per_checkpoint"]["wall_s"] / layouts["per_benchmark"]["wall_s"]
    assert abs(result["wall_ratio_per_checkpoint_over_per_benchmark"] - ratio) < 2e-3
