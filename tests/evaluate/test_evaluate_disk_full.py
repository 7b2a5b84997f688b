"""A full disk during evaluation, on a real 8 KiB tmpfs (the issue's case: an ``OSError: [Errno 28]`` traceback and
exit 1, which Snakemake retried): the stage exits with ``SAVE_FAILED_EXIT_CODE`` (73, final) and a line naming the
partial file, the space needed and the space free; the partial file keeps whole batches only (the failed append is
cut back); once there is space, the rerun completes with every unit exactly once and equals an uninterrupted run.

The tmpfs holds the first batches' rows (about 150 bytes each, 16 a batch), then the disk is full mid-batch: the
filesystem itself refuses the write, no free-space check is faked."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from pipeline.core.exit_codes import SAVE_FAILED_EXIT_CODE
from pipeline.core.io import read_jsonl
from pipeline.evaluation import eval_spec, sampling
from tests.conftest import resize_tmpfs
from tests.evaluate.conftest import FAST_SPEC, benchmark_rows, write_jsonl

REPO = Path(__file__).resolve().parents[2]
ITEMS = 40
SPEC = {**FAST_SPEC, "max_new_tokens": 40, "batch_size": 16}  # 80 units: 5 batches


def test_a_full_disk_in_evaluation_exits_73_naming_the_space_and_keeps_whole_batches(
    mount_tmpfs, tiny_model_dir, tmp_path
):
    bench = write_jsonl(tmp_path / "bench.jsonl", benchmark_rows(ITEMS))
    disk = mount_tmpfs("8k")
    out = disk / "bench.jsonl"
    partial = sampling.partial_path(out)
    command = [
        sys.executable, "-m", "pipeline.evaluate", "--model", str(tiny_model_dir), "--benchmark", str(bench),
        "--spec", json.dumps(SPEC), "--seed", "3", "--out", str(out),
    ]  # fmt: skip

    full = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert full.returncode == SAVE_FAILED_EXIT_CODE, full.stderr[-3000:]
    assert "Traceback" not in full.stderr
    message = re.search(
        rf"error: {re.escape(str(partial))}: not enough disk space for the rest of the evaluation \((\d+) more "
        r"samples, then the 80-sample output; estimated from this batch\): [\d.]+ GiB \((\d+) bytes\) needed, "
        r"[\d.]+ GiB \((\d+) bytes\) free \(OSError: \[Errno 28\] No space left on device\)",
        full.stderr,
    )
    assert message, full.stderr[-3000:]
    pending, needed, free = (int(group) for group in message.groups())
    assert not out.exists()

    # Whole lines and whole batches only: the failed batch's part-written rows were cut back.
    text = partial.read_text(encoding="utf-8")
    assert text.endswith("\n")
    lines = [json.loads(line) for line in text.splitlines()]
    rows, unfinished = sampling.whole_batches(lines[1:])
    assert unfinished == 0 and lines[-1] == {sampling.BATCH_END: SPEC["batch_size"]}
    assert 0 < len(rows) < 2 * ITEMS and len(rows) % SPEC["batch_size"] == 0
    assert pending == 2 * ITEMS - len(rows)
    assert needed > free

    resize_tmpfs(disk, "1m")  # the user frees space
    rerun = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resuming from {partial}: {len(rows)} of {2 * ITEMS} samples done" in rerun.stderr
    done = read_jsonl(out)
    keys = [(row["id"], row["sample"]) for row in done]
    assert keys == [(item["id"], sample) for item in benchmark_rows(ITEMS) for sample in range(2)]
    assert not partial.exists()
    # The estimate covered what the rest took: the remaining rows and the whole output.
    assert needed >= out.stat().st_size
    uninterrupted = sampling.evaluate(str(tiny_model_dir), bench, eval_spec.parse_eval_spec(SPEC), 3, tmp_path / "a")
    assert done == uninterrupted
