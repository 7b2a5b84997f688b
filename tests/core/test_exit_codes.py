"""pipeline.core.exit_codes: the final statuses and the gate that keeps a retry from running a job whose earlier attempt
in the same Snakemake invocation ended with one. Real stage processes with their output redirected to a log, as a
rule runs them (the Snakemake and Slurm runs are in tests/faults/test_slurm_warning.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pipeline.core.exit_codes import (
    COLLAPSE_EXIT_CODE,
    FINAL_EXIT_CODES,
    FINAL_EXIT_REASONS,
    INPUT_ERROR_EXIT_CODE,
    INVOCATION_VARIABLE,
    NONFINITE_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    SAVE_FAILED_EXIT_CODE,
    STALL_EXIT_CODE,
    earlier_final_exit,
    marker_path,
    record_final_exit,
)

REPO = Path(__file__).resolve().parents[2]


def test_the_final_statuses() -> None:
    assert {INPUT_ERROR_EXIT_CODE, NONFINITE_EXIT_CODE, SAVE_FAILED_EXIT_CODE, COLLAPSE_EXIT_CODE} == FINAL_EXIT_CODES
    assert PREEMPTED_EXIT_CODE not in FINAL_EXIT_CODES  # a checkpoint was saved: the rerun resumes
    assert STALL_EXIT_CODE not in FINAL_EXIT_CODES  # a stall is transient
    assert set(FINAL_EXIT_REASONS) == FINAL_EXIT_CODES
    statuses = [INPUT_ERROR_EXIT_CODE, NONFINITE_EXIT_CODE, SAVE_FAILED_EXIT_CODE, PREEMPTED_EXIT_CODE]
    assert len({*statuses, STALL_EXIT_CODE, COLLAPSE_EXIT_CODE}) == 6  # each names one cause


def test_a_marker_holds_for_its_invocation_only(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("error: train.jsonl:2: not valid JSON\n")
    first = {INVOCATION_VARIABLE: "first"}
    assert record_final_exit(1, first, log) is None  # an ordinary failure: retried as before
    assert record_final_exit(PREEMPTED_EXIT_CODE, first, log) is None
    assert record_final_exit(INPUT_ERROR_EXIT_CODE, {}, log) is None  # outside a Snakemake invocation
    assert record_final_exit(INPUT_ERROR_EXIT_CODE, {**first, "RANK": "1"}, log) is None  # rank 0 writes it
    assert record_final_exit(NONFINITE_EXIT_CODE, first, log) == marker_path(log)
    assert earlier_final_exit(first, log) == (NONFINITE_EXIT_CODE, marker_path(log))
    assert earlier_final_exit({INVOCATION_VARIABLE: "second"}, log) is None  # the study was started again
    assert not marker_path(log).exists()


def stage(log: Path, invocation: str, rows: Path) -> int:
    """``python -m pipeline.prepare_benchmarks`` on ``rows`` with its output redirected to ``log`` (a rule's
    shell truncates the log the same way); its exit status."""
    spec = json.dumps({"kind": "qwen_jsonl", "path": str(rows)})
    command = (
        f"{sys.executable} -m pipeline.prepare_benchmarks --name b --spec '{spec}' --out {log.parent}/b.jsonl"
        f" --audit {log.parent}/audit.json > {log} 2>&1"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), INVOCATION_VARIABLE: invocation}
    return subprocess.run(command, shell=True, env=env, timeout=120).returncode


def test_a_retry_repeats_a_final_status_and_a_new_invocation_runs(tmp_path: Path) -> None:
    """Broken on purpose: without the gate in run_cli the retry ran the stage again (on the fixed file: exit 0);
    without the invocation check the run after the fix repeated the old status (2)."""
    log, rows = tmp_path / "b.log", tmp_path / "rows.jsonl"
    rows.write_text('{"problem": "1+1", "answer": "2"}\n{not json\n')
    assert stage(log, "first", rows) == INPUT_ERROR_EXIT_CODE
    first = log.read_text()
    assert "rows.jsonl:2: not valid JSON" in first
    rows.write_text('{"problem": "1+1", "answer": "2"}\n')  # fixed, but this invocation does not look again
    assert stage(log, "first", rows) == INPUT_ERROR_EXIT_CODE
    retry = log.read_text()
    assert retry.startswith("pipeline.prepare_benchmarks: not run again: an earlier attempt of this job in this ")
    assert retry.endswith(first)  # the first attempt's log, once
    assert not (tmp_path / "b.jsonl").exists()
    assert stage(log, "second", rows) == 0  # the study started again after the fix
    assert (tmp_path / "b.jsonl").is_file() and not marker_path(log).exists()
