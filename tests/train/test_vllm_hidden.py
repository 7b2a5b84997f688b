"""``pipeline.train`` hides an installed vLLM from a run that does not generate with it, and Weights & Biases from a
run that does not report to it (TRL would import both at start-up); a run that turns ``use_vllm`` on, in either
spec, sees vLLM, and one whose ``--tracking`` names wandb sees wandb."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.train import hide_vllm_unless_used, hide_wandb_unless_reported

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def modules() -> Iterator[dict]:
    """sys.modules without vLLM and wandb, restored after the test: what the test hid is unhidden (a hidden vLLM
    left in a worker would fail its later vLLM tests)."""
    names = ("vllm", "wandb")
    kept = {name: sys.modules.pop(name) for name in names if name in sys.modules}
    yield sys.modules
    for name in names:
        sys.modules.pop(name, None)
    sys.modules.update(kept)


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


@pytest.mark.parametrize(
    ("tracking", "hidden"),
    [
        ("{}", True),
        ('{"report_to": "none"}', True),
        ('{"report_to": "tensorboard"}', True),
        ('{"report_to": "wandb"}', False),
        ('{"report_to": ["tensorboard", "wandb"]}', False),
    ],
)
def test_wandb_hidden_only_when_tracking_does_not_report_to_it(modules: dict, tracking: str, hidden: bool) -> None:
    argv = ["--training-spec", "{}", "--tracking", tracking, "--seed", "0"]
    assert hide_wandb_unless_reported(argv) is hidden
    assert ("wandb" in modules and modules["wandb"] is None) is hidden


def test_the_default_tracking_hides_wandb_and_an_unreadable_one_leaves_it(modules: dict) -> None:
    assert hide_wandb_unless_reported(["--seed", "0"])
    modules.pop("wandb")
    assert not hide_wandb_unless_reported(["--tracking", "{not json"])
    assert not hide_wandb_unless_reported(["--tracking", '{"report_to": "comet"}'])
    assert "wandb" not in modules


def test_the_stage_started_without_vllm_never_imports_it() -> None:
    """As a job runs it (``python -m pipeline.train``; ``--help`` exits after the module's imports): TRL and the
    trainer are imported, vLLM and wandb (the default tracking reports to neither) are not."""
    command = [sys.executable, "-X", "importtime", "-m", "pipeline.train"]
    command += ["--training-spec", '{"max_steps": 1}', "--method-spec", '{"credit": "grail"}', "--help"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time")
    }
    assert {"trl", "pipeline.training.trainer"} <= imported
    assert not {name for name in imported if name.split(".")[0] in {"vllm", "wandb"}}
