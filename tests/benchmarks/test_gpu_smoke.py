"""scripts/gpu_smoke.sh runs its CPU fallback here, so that the script cannot rot before a GPU is at hand: every
stage passes through the real stage CLIs (prepare, evaluate, training through pipeline.launch) and the table has
one row per stage with its time, result, the GRAIL/GRPO step ratio and the peak memory (no speed is asserted)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_cpu_fallback_runs_every_stage_and_prints_one_table(tmp_path: Path) -> None:
    report = tmp_path / "smoke.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_smoke.sh"), "--cpu", "--json", str(report), "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert result.stdout.startswith("| stage | seconds | result | GRAIL/GRPO step | peak RSS MB |")
    rows = {row["stage"]: row for row in json.loads(report.read_text())["rows"]}
    assert list(rows) == [
        "prepare model (tiny)",
        "evaluate (hf)",
        "train grpo (1 process)",
        "train grail (1 process)",
        "credit_overhead",
    ]
    for stage in list(rows)[:-1]:
        assert rows[stage]["result"] == "pass", rows[stage]
        assert rows[stage]["seconds"] > 0 and rows[stage]["peak_memory_mb"] > 0
        assert f"| {stage} |" in result.stdout
    assert rows["train grail (1 process)"]["grail_grpo_step_ratio"] > 0  # from both runs' step_time metrics
    assert rows["credit_overhead"]["result"] == "skipped (no GPU)"
    for credit in ("grpo", "grail"):
        assert (tmp_path / "runs" / credit / "final").is_dir()
