"""The stall watchdog (pipeline.runtime.watchdog) on a real evaluation process: its second generation batch never returns
(``tests.hold_stage``: the hf backend's ``generate`` holds, as an engine that stops answering would). The stage must
exit with ``STALL_EXIT_CODE`` within the bound, naming the batch and dumping the stuck thread's stack, with the first
batch's rows kept in the partial file for the rerun. Both backends run the same batch loop
(``pipeline.evaluation.sampling._generate_pending``), so the hf backend stands for vLLM's too.

Checked by breaking it: without the beat at the start of a batch (``stall.begin`` removed) the message names "the
gap after evaluation batch 1"; with the thread never firing the hook's 150 s limit ends the stage with status 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pipeline.core.exit_codes import STALL_EXIT_CODE
from pipeline.core.io import read_jsonl
from pipeline.evaluation import sampling
from pipeline.runtime.settings import RUNTIME_VARIABLE
from tests.evaluate.conftest import FAST_SPEC, benchmark_rows, write_jsonl
from tests.hold_stage import stall_evaluation_env, stall_exit_bound

REPO = Path(__file__).resolve().parents[2]


def test_a_stalled_evaluation_batch_stops_the_stage_with_the_stall_code(tiny_model_dir, tmp_path):
    bench = write_jsonl(tmp_path / "bench.jsonl", benchmark_rows(4))
    out = tmp_path / "eval" / "bench.jsonl"
    watchdog = {"stall_floor_s": 5, "stall_multiple": 5, "first_step_s": 60}
    command = [
        sys.executable, "-m", "pipeline.evaluate", "--model", str(tiny_model_dir), "--benchmark", str(bench),
        "--spec", json.dumps({**FAST_SPEC, "batch_size": 2}), "--seed", "3", "--out", str(out),
    ]  # fmt: skip
    result = subprocess.run(
        command,
        cwd=REPO,
        env={**os.environ, **stall_evaluation_env(batch=2), RUNTIME_VARIABLE: json.dumps({"watchdog": watchdog})},
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    log = result.stderr
    assert result.returncode == STALL_EXIT_CODE, log[-3000:]
    assert "stall watchdog: rank 0: no progress in evaluation batch 2 of 4 of bench for " in log, log[-3000:]
    assert (stall_exit_bound(log) or 0) >= watchdog["stall_floor_s"], log[-3000:]
    assert "in hold_until" in log and "in generate_or_hold" in log and "in generate_rows" in log
    assert not out.exists()
    kept, unfinished = sampling.whole_batches(read_jsonl(sampling.partial_path(out))[1:])
    first = benchmark_rows(4)[0]["id"]
    assert [(row["id"], row["sample"]) for row in kept] == [(first, 0), (first, 1)]  # batch 1, appended whole
    assert unfinished == 0
