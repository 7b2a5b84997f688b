"""The NaN guard (pipeline.training.nan_guard) on in-process runs of ``pipeline.train`` on the untrained tiny model: a NaN
loss at step 3, or non-finite weights before a save, stop the run with ``NONFINITE_EXIT_CODE`` and a log naming the
step, the rank and the last finite checkpoint; no checkpoint or final model with non-finite weights is published.
The same on two processes through the launcher (DDP over gloo): a NaN loss on rank 1 only reaches rank 0 through the
all-reduced gradient; both ranks stop, each naming itself, and the launcher passes 70 on.
(Checked by breaking it: without the gradient-norm check the NaN run trains on and publishes NaN checkpoints;
without the weights check before a save the poisoned run writes checkpoint-2; with the gradient norm left unchecked
rank 1's message lacks it; with the launcher not passing the ranks' agreed status on, the run ends with accelerate's
status 1, not 70.)"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from train_support import launch_two, run_train, stage_argv, train_command

from pipeline.core.exit_codes import NONFINITE_EXIT_CODE
from pipeline.core.io import run_cli
from pipeline.train import main
from pipeline.training.nan_guard import step_problem
from pipeline.training.resume import ExportAndPreemptionCallback
from pipeline.training.trainer import GrailGRPOTrainer
from tests.hold_stage import nan_loss_env


def nan_loss_during_step(step: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every micro-step of optimizer step ``step`` (1-based) returns a NaN loss."""
    compute_loss = GrailGRPOTrainer._compute_loss

    def poisoned(self: GrailGRPOTrainer, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        loss = compute_loss(self, model, inputs)
        return loss * float("nan") if self.state.global_step == step - 1 else loss

    monkeypatch.setattr(GrailGRPOTrainer, "_compute_loss", poisoned)


def nan_weights_after_step(step: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """One weight becomes NaN at the end of optimizer step ``step``, before its checkpoint is saved."""
    on_step_end = ExportAndPreemptionCallback.on_step_end

    def poisoned(self: ExportAndPreemptionCallback, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        on_step_end(self, args, state, control, **kwargs)
        if state.global_step == step:
            with torch.no_grad():
                next(kwargs["model"].parameters()).view(-1)[0] = float("nan")

    monkeypatch.setattr(ExportAndPreemptionCallback, "on_step_end", poisoned)


def published_weights(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("**/model.safetensors"))


@pytest.mark.parametrize(
    ("inject", "step", "expected"),
    [
        (nan_loss_during_step, 3, ["step 3, rank 0: loss nan and gradient norm nan", "checkpoint-2"]),
        (nan_weights_after_step, 2, ["step 2, rank 0: non-finite weights (", "checkpoint-2 not written", "none"]),
    ],
    ids=["nan-loss-at-step-3", "nan-weights-before-a-save"],
)
def test_non_finite_training_stops_and_publishes_nothing_non_finite(
    untrained_model, train_jsonl, tmp_path, monkeypatch, caplog, inject, step, expected
):
    inject(step, monkeypatch)
    run_dir = tmp_path / "run"
    argv = stage_argv(untrained_model, train_jsonl, run_dir)
    with caplog.at_level(logging.ERROR, logger="pipeline.train"), pytest.raises(SystemExit) as stop:
        run_cli(main, argv)
    assert stop.value.code == NONFINITE_EXIT_CODE
    message = next(record.getMessage() for record in caplog.records if "non-finite" in record.getMessage())
    assert all(part in message for part in expected), message
    assert not (run_dir / "final").exists() and not (run_dir / "checkpoints" / ".staging").exists()
    checkpoints = sorted(path.name for path in (run_dir / "checkpoints").glob("checkpoint-*"))
    assert checkpoints == (["checkpoint-2"] if step == 3 else [])
    for weights in published_weights(run_dir):
        assert all(torch.isfinite(tensor).all() for tensor in load_file(weights).values()), weights


@pytest.mark.slow
def test_a_nan_on_one_of_two_processes_stops_both_and_the_launcher_passes_70_on(untrained_model, train_jsonl, tmp_path):
    run_dir = tmp_path / "run"
    result = run_train(launch_two(train_command(untrained_model, train_jsonl, run_dir)), nan_loss_env(rank=1, step=3))
    assert result.returncode == NONFINITE_EXIT_CODE, result.stderr[-3000:]
    assert "step 3, rank 1: loss nan and gradient norm nan" in result.stderr
    assert "step 3, rank 0: gradient norm nan" in result.stderr  # its own loss was finite
    assert not (run_dir / "final").exists()
    assert sorted(path.name for path in (run_dir / "checkpoints").glob("checkpoint-*")) == ["checkpoint-2"]
    for weights in published_weights(run_dir):
        assert all(torch.isfinite(tensor).all() for tensor in load_file(weights).values()), weights


def test_step_problem_names_what_is_not_finite():
    assert step_problem(torch.tensor(0.5), 1.0) is None
    assert step_problem(torch.tensor(float("inf")), None) == "loss inf"
    assert step_problem(torch.tensor(1.0), float("nan")) == "gradient norm nan"
