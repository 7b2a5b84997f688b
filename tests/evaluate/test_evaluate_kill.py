"""A real evaluation process killed with SIGKILL mid-way, then rerun: only the missing samples are generated, and
the resumed run equals an uninterrupted one row for row, also when the kill cut a batch short.

The stage holds once it has durably appended the given number of rows (``tests.hold_stage``; inside a batch, with
that batch's end line not written) and is killed there, so the kill lands mid-run however fast the machine is."""

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
HELD_MID_BATCH = 10  # batch_size 4: two whole batches, then 2 of the third batch's 4 rows


def evaluate_command(model: Path, bench: Path, spec: dict, out: Path) -> list[str]:
    return [
        sys.executable, "-m", "pipeline.evaluate", "--model", str(model), "--benchmark", str(bench),
        "--spec", json.dumps(spec), "--seed", "3", "--out", str(out),
    ]  # fmt: skip


def kill_after_rows(command: list[str], rows: int, stderr_path: Path) -> None:
    """Run the stage held after ``rows`` appended rows, and SIGKILL it there."""
    with open(stderr_path, "w", encoding="utf-8") as stderr:
        process = subprocess.Popen(
            command,
            cwd=REPO,
            env={**os.environ, **hold_evaluation_env(rows)},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
        )
    deadline = time.monotonic() + 120
    while f"test hook: holding after {rows} appended rows" not in stderr_path.read_text(encoding="utf-8"):
        assert process.poll() is None, stderr_path.read_text(encoding="utf-8")[-3000:]
        assert time.monotonic() < deadline, f"no hold after {rows} rows within 120 s"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)


def sample_rows(partial: Path) -> list[dict]:
    """The sample rows of a partial file (not its header, not the batches' end lines)."""
    return [row for row in read_jsonl(partial, tolerate_torn_tail=True) if "id" in row]


def test_sigkill_mid_evaluation_then_rerun_completes_without_duplicates(tiny_model_dir, tmp_path):
    bench = write_jsonl(tmp_path / "bench.jsonl", benchmark_rows(ITEMS))
    spec = {**FAST_SPEC, "batch_size": 2}
    out = tmp_path / "eval" / "bench.jsonl"
    partial = sampling.partial_path(out)
    kill_after_rows(evaluate_command(tiny_model_dir, bench, spec, out), HELD_AFTER, tmp_path / "evaluate.stderr")
    assert not out.exists()

    survived = {(r["id"], r["sample"]) for r in sample_rows(partial)}
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


def test_killed_mid_batch_and_resumed_equals_an_uninterrupted_run(tiny_model_dir, tmp_path):
    """The issue's case: a kill that cuts a batch short. The resumed stage drops the rows of the cut batch and
    generates it again whole (its units, seed and padding), so every row equals the uninterrupted run's."""
    bench = write_jsonl(tmp_path / "bench.jsonl", benchmark_rows(ITEMS))
    spec = FAST_SPEC  # batch_size 4, 40 units: 10 batches
    uninterrupted = sampling.evaluate(str(tiny_model_dir), bench, eval_spec.parse_eval_spec(spec), 3, tmp_path / "a")
    out = tmp_path / "eval" / "bench.jsonl"
    command = evaluate_command(tiny_model_dir, bench, spec, out)
    kill_after_rows(command, HELD_MID_BATCH, tmp_path / "killed.stderr")
    assert len(sample_rows(sampling.partial_path(out))) == HELD_MID_BATCH  # two batches, then 2 rows of the third

    resumed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = read_jsonl(out)
    fields = ("id", "sample", "completion", "extracted", "correct", "num_tokens")
    assert [[row[f] for f in fields] for row in rows] == [[row[f] for f in fields] for row in uninterrupted]
    assert rows == uninterrupted
    assert "8 of 40 samples done (2 rows of an unfinished batch dropped)" in resumed.stderr
    # sampled, not degenerate: the rows of the cut batch differ from each other
    assert len({row["completion"] for row in rows[8:12]}) > 1
