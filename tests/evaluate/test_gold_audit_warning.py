"""A gold that only upstream's grader accepts is named by the audit, by the evaluate stage's log and by the
report's first screen; with today's grader no benchmark file here has one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import pipeline.evaluate as ev
import pipeline.tasks.gold_audit
from pipeline.core.io import atomic_write_json
from pipeline.prepare_benchmarks import prepare_benchmark
from pipeline.tasks.rewards import gold_self_check
from tests.core.test_report import report_command, write_inputs
from tests.evaluate.conftest import FAST_SPEC, write_jsonl

REFUSED_GOLD = "x=-1,0"


def write_benchmark(path: Path) -> Path:
    rows = [
        {"id": "q1", "problem": "What is 5+7?", "answer": "12"},
        {"id": "q2", "problem": "Solve x^2+x=0.", "answer": REFUSED_GOLD},
        {"id": "q3", "problem": "What is 3+4?", "answer": "7"},
    ]
    return write_jsonl(path, rows)


@pytest.fixture
def audit_of_a_grader_bug(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The audit prepare_benchmarks writes when the clean grader refuses ``x=-1,0`` (as it did before the fix of
    equations whose right side is a set) while upstream's math-verify accepts it."""

    def clean_grader_with_the_old_bug(gold: str, grading: str = "clean", **kwargs) -> bool:
        return not (grading == "clean" and gold == REFUSED_GOLD) and gold_self_check(gold, grading, **kwargs)

    monkeypatch.setattr(pipeline.tasks.gold_audit, "gold_self_check", clean_grader_with_the_old_bug)
    spec = {"kind": "qwen_jsonl", "path": str(write_benchmark(tmp_path / "bench.jsonl"))}
    _, audit = prepare_benchmark("quadratics", spec)
    path = tmp_path / "quadratics_audit.json"  # not audit.json: write_inputs writes that one
    atomic_write_json(path, audit)
    return path


def test_the_audit_lists_each_modes_refusals_and_the_clean_only_ones(audit_of_a_grader_bug: Path) -> None:
    audit = json.loads(audit_of_a_grader_bug.read_text())
    refused = {"id": "q2", "answer": REFUSED_GOLD}
    assert audit["modes"]["clean"] == {"failures": [refused], "failure_count": 1}
    assert audit["modes"]["upstream"] == {"failures": [], "failure_count": 0}
    assert audit["clean_only"] == [refused]


def test_todays_grader_refuses_no_gold_of_that_file(tmp_path: Path) -> None:
    _, audit = prepare_benchmark("quadratics", {"kind": "qwen_jsonl", "path": str(write_benchmark(tmp_path / "b"))})
    assert audit["clean_only"] == [] and audit["modes"]["clean"]["failure_count"] == 0


def test_the_evaluate_log_warns_naming_the_benchmark_and_the_items(
    audit_of_a_grader_bug: Path, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = write_benchmark(tmp_path / "quadratics.jsonl")
    args = ["--model", str(tiny_model_dir), "--benchmark", str(bench), "--seed", "0", "--audit"]
    ev.main([*args, str(audit_of_a_grader_bug), "--spec", json.dumps(FAST_SPEC), "--out", str(tmp_path / "a.jsonl")])
    log = capsys.readouterr().err
    assert "WARNING: benchmark quadratics: the clean grader refuses 1 gold(s)" in log and log.rstrip().count("q2")
    # graded with upstream's grader, the clean grader's refusals do not concern the run
    upstream = json.dumps({**FAST_SPEC, "grading": "upstream"})
    ev.main([*args, str(audit_of_a_grader_bug), "--spec", upstream, "--out", str(tmp_path / "b.jsonl")])
    assert "WARNING" not in capsys.readouterr().err


def test_the_report_says_so_on_its_first_screen(audit_of_a_grader_bug: Path, tmp_path: Path) -> None:
    config = write_inputs(tmp_path)
    command = [
        *report_command(tmp_path, json.dumps(config), tmp_path / "tables"),
        "--audit",
        str(audit_of_a_grader_bug),
    ]
    subprocess.run(command, check=True, capture_output=True)
    report = (tmp_path / "report.md").read_text()
    first_screen = report[: report.index("## Main results")]
    assert "**Warning:** benchmark quadratics: the clean grader refuses 1 gold(s)" in first_screen
    assert "can never be graded correct: q2." in first_screen
    audit_rows = [line for line in report.splitlines() if line.startswith("| quadratics |")]
    assert audit_rows == ["| quadratics | clean | 3 | 1 | `q2` (clean only) |", "| quadratics | upstream | 3 | 0 |  |"]


def test_a_report_without_clean_only_refusals_has_no_warning(tmp_path: Path) -> None:
    config = write_inputs(tmp_path)
    subprocess.run(report_command(tmp_path, json.dumps(config), tmp_path / "tables"), check=True, capture_output=True)
    assert "Warning" not in (tmp_path / "report.md").read_text()


def test_evaluate_cli_help_names_the_audit_option() -> None:
    result = subprocess.run([sys.executable, "-m", "pipeline.evaluate", "--help"], capture_output=True, text=True)
    assert "--audit" in result.stdout
