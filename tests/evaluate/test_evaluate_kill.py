"""A real evaluation process killed with SIGKILL mid-way, then rerun: only the missing samples are generated.

The stage holds once it has durably appended ``HELD_AFTER`` rows (``tests.hold_stage``) and is killed there, so the
kill lands mid-run however fast the machine is."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline.core.io import read_jsonl
from pipeline.evaluation import eval_spec, sampling
from tests.evaluate.conftest import FAST_SPEC, benchmark_rows, write_jsonl
from tests.evaluate.test_evaluate import CountingFactory
from tests.hold_stage import hold_evaluation_env

REPO = Path(__file__).resolve().parents[2]
ITEMS = 20
HELD_AFTER = 4  # two batches of two samples


def test_sigkill_mid_evaluation_then_rerun_completes_without_duplicates(tiny_model_dir, tmp_path):
    bench = write_jsonl(tmp_path / "bench.jsonl", benchmark_rows(ITEMS))
    spec = {**FAST_SPEC, "batch_size": 2}
    out = tmp_path / "eval" / "bench.jsonl"
    partial = sampling.partial_path(out)
    command = [
        sys.executable, "-m", "pipeline.evaluate", "--model", str(tiny_model_dir), "--benchmark", str(bench),
        "--spec", json.dumps(spec), "--seed", "3", "--out", str(out),
    ]  # fmt: skip
    stderr_path = tmp_path / "evaluate.stderr"
    with open(stderr_path, "w", encoding="utf-8") as stderr:
        process = subprocess.Popen(
            command,
            cwd=REPO,
            env={**os.environ, **hold_evaluation_env(HELD_AFTER)},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
        )
    deadline = time.monotonic() + 120
    while f"test hook: holding after {HELD_AFTER} appended rows" not in stderr_path.read_text(encoding="utf-8"):
        assert process.poll() is None, stderr_path.read_text(encoding="utf-8")[-3000:]
        assert time.monotonic() < deadline, f"no hold after {HELD_AFTER} rows within 120 s"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert not out.exists()

    survived = {(r["id"], r["sample"]) for r in read_jsonl(partial, tolerate_torn_tail=True)[1:]}
    assert len(survived) == HELD_AFTER
    counter = CountingFactory()
    # Batching is not part of the fingerprint: the rerun may use bigger batches and still resume.
    rerun_spec = eval_spec.parse_eval_spec({**spec, "batch_size": 32})
    rows = sampling.evaluate(str(tiny_model_dir), bench, rerun_spec, 3, out, backend_factory=counter)
    assert counter.requests == 2 * ITEMS - HELD_AFTER
    keys = [(row["id"], row["sample"]) for row in rows]
    assert keys == [(item["id"], s) for item in benchmark_rows(ITEMS) for s in range(2)]
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows
    assert not partial.exists()
