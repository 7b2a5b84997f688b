"""A real evaluation process killed with SIGKILL mid-way, then rerun: only the missing samples are generated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline import evaluate as ev
from pipeline.io import read_jsonl
from tests.evaluate.conftest import FAST_SPEC, benchmark_rows, write_jsonl
from tests.evaluate.test_evaluate import CountingFactory

REPO = Path(__file__).resolve().parents[2]
# Enough work (400 samples, about 10 s here) that the kill always lands mid-run, even on a much faster machine.
ITEMS = 200


def test_sigkill_mid_evaluation_then_rerun_completes_without_duplicates(tiny_model_dir, tmp_path):
    bench = write_jsonl(tmp_path / "bench.jsonl", benchmark_rows(ITEMS))
    spec = {**FAST_SPEC, "batch_size": 2}
    out = tmp_path / "eval" / "bench.jsonl"
    partial = ev.partial_path(out)
    command = [
        sys.executable, "-m", "pipeline.evaluate", "--model", str(tiny_model_dir), "--benchmark", str(bench),
        "--spec", json.dumps(spec), "--seed", "3", "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if partial.exists() and len(partial.read_text().splitlines()) >= 1 + 4:  # header + two batches
            break
        time.sleep(0.05)
    assert process.poll() is None, "the evaluation ended before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not out.exists()

    survived = {(r["id"], r["sample"]) for r in read_jsonl(partial, tolerate_torn_tail=True)[1:]}
    assert 4 <= len(survived) < 2 * ITEMS
    counter = CountingFactory()
    # Batching is not part of the fingerprint: the rerun may use bigger batches and still resume.
    rerun_spec = ev.parse_eval_spec({**spec, "batch_size": 32})
    rows = ev.evaluate(str(tiny_model_dir), bench, rerun_spec, 3, out, backend_factory=counter)
    assert counter.requests == 2 * ITEMS - len(survived)
    keys = [(row["id"], row["sample"]) for row in rows]
    assert keys == [(item["id"], s) for item in benchmark_rows(ITEMS) for s in range(2)]
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows
    assert not partial.exists()
