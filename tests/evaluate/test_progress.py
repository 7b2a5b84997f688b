"""Progress a person can read in a job log that is a file (Slurm's, Snakemake's ``log:``): one line per update
with items done / total, elapsed, time left and rate, no carriage-return redraws."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

from pipeline.core.progress import LineStream, progress
from tests.evaluate.conftest import FAST_SPEC, benchmark_rows, write_jsonl

REPO = Path(__file__).resolve().parents[2]
FINAL_LINE = re.compile(
    r"^evaluate bench: 100%\|#+\| (\d+)/\1 \[\d\d:\d\d<00:00, +[\d.]+(?:sample/s|s/sample), accuracy=[\d.]+\]$"
)


def test_line_stream_turns_redraws_into_lines() -> None:
    target = io.StringIO()
    stream = LineStream(target)
    for text in ("\rstep 1/3   ", "\rstep 2/3   ", "\n", "\r   "):
        stream.write(text)
    assert target.getvalue() == "step 1/3\nstep 2/3\n"


def test_bar_in_a_file_writes_one_line_per_refresh(monkeypatch) -> None:
    log = io.StringIO()  # not a terminal
    monkeypatch.setattr(sys, "stderr", log)
    with progress(desc="work", unit="item", total=4, mininterval=0) as bar:
        for _ in range(4):
            bar.update(1)
    lines = log.getvalue().splitlines()
    counts = [re.search(r"\| (\d/4) \[", line).group(1) for line in lines]
    assert counts == ["0/4", "1/4", "2/4", "3/4", "4/4", "4/4"]  # the last: closing redraws with the overall rate
    assert "\r" not in log.getvalue()


def test_evaluation_stage_progress_in_a_log_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    bench = write_jsonl(tmp_path / "bench.jsonl", benchmark_rows(6))
    log_path = tmp_path / "evaluate.log"
    with open(log_path, "w") as log:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pipeline.evaluate",
                *("--model", str(tiny_model_dir), "--benchmark", str(bench), "--spec", json.dumps(FAST_SPEC)),
                *("--seed", "1", "--out", str(tmp_path / "samples.jsonl")),
            ],
            cwd=REPO,
            stdout=log,
            stderr=log,
            check=True,
            timeout=300,
        )
    text = log_path.read_text()
    bars = [line for line in text.split("\n") if re.match(r"evaluate bench: +\d+%\|", line)]
    assert not any("\r" in line for line in bars), text
    assert bars[0].startswith("evaluate bench:   0%") and " 0/12 " in bars[0], text
    assert FINAL_LINE.match(bars[-1]) and " 12/12 " in bars[-1], text
