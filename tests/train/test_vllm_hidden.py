"""``pipeline.train`` hides an installed vLLM from a run that does not generate with it (TRL would import it at
start-up); a run that turns ``use_vllm`` on, in either spec, sees it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.train import hide_vllm_unless_used

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def modules(monkeypatch: pytest.MonkeyPatch) -> dict:
    """sys.modules without vLLM, restored after the test."""
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    return sys.modules


@pytest.mark.parametrize(
    ("training", "method", "hidden"),
    [
        ({"max_steps": 2}, {"credit": "grail"}, True),
        ({"use_vllm": False}, {}, True),
        ({"use_vllm": True, "vllm_mode": "colocate"}, {"credit": "grpo"}, False),
        ({"use_vllm": False}, {"use_vllm": True}, False),  # the method spec wins, as in merge_specs
        ({"use_vllm": True}, {"use_vllm": False}, True),
    ],
)
def test_hidden_only_when_no_spec_turns_vllm_on(modules: dict, training: dict, method: dict, hidden: bool) -> None:
    argv = ["--training-spec", json.dumps(training), "--method-spec", json.dumps(method), "--seed", "0"]
    assert hide_vllm_unless_used(argv) is hidden
    assert ("vllm" in modules and modules["vllm"] is None) is hidden


def test_an_unreadable_spec_leaves_vllm_visible(modules: dict, tmp_path: Path) -> None:
    assert not hide_vllm_unless_used(["--training-spec", "{not json", "--method-spec", "{}"])
    assert not hide_vllm_unless_used(["--training-spec", str(tmp_path / "missing.yaml"), "--method-spec", "{}"])
    assert not hide_vllm_unless_used(["--training-spec", "[1, 2]", "--method-spec", "{}"])
    assert "vllm" not in modules


def test_the_stage_started_without_vllm_never_imports_it() -> None:
    """As a job runs it (``python -m pipeline.train``; ``--help`` exits after the module's imports): TRL and the
    trainer are imported, vLLM is not."""
    command = [sys.executable, "-X", "importtime", "-m", "pipeline.train"]
    command += ["--training-spec", '{"max_steps": 1}', "--method-spec", '{"credit": "grail"}', "--help"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time")
    }
    assert {"trl", "pipeline.training.trainer"} <= imported
    assert not {name for name in imported if name == "vllm" or name.startswith("vllm.")}
