"""The collapse guard (pipeline.training.collapse_guard, the health check of pipeline.runtime.health) on runs of
``pipeline.train`` at ``learning_rate: 100`` on the warmed-up tiny model, the issue's reproduction: the weights'
norm grows 455x in one step and from the next the reward, entropy and gradient norm are 0.0, all finite, so the NaN
guard never fires. A 3-step linear warm-up of the learning rate (step 1 at 0) gives the run a healthy first step
and checkpoint (``save_steps: 1``).

- Default thresholds: the weights check trips at step 2, the stage exits ``COLLAPSE_EXIT_CODE`` naming the step, the
  weight norm and checkpoint-1; nothing after it is written; a plain rerun resumes from checkpoint-1 and stops the
  same way (it does not resume into the collapse).
- The weights check off (``GRAIL_RUNTIME``): the flat check trips at step 7 (steps 3-7 flat); the checkpoints of
  steps 2-6, saved before the trip was seen, are set aside with a why.json, so checkpoint-1 is the newest left.
(Checked by breaking it: without the check in the trainer's ``log`` the learning-rate-100 run exits 0 and the flat
run raises no SystemExit; without the set-aside the flat run keeps checkpoints 2-6 and names no healthy checkpoint;
with the healthy point at the trip's row it names checkpoint-6.)"""

from __future__ import annotations

import json
import logging

import pytest
from train_support import TRAINING_SPEC, run_train, stage_argv, train_command

from pipeline.core.exit_codes import COLLAPSE_EXIT_CODE
from pipeline.core.io import run_cli
from pipeline.runtime.settings import RUNTIME_VARIABLE
from pipeline.train import main
from pipeline.training.resume import newest_valid_checkpoint

COLLAPSING = {
    **TRAINING_SPEC,
    "learning_rate": 100.0,
    "lr_scheduler_type": "constant_with_warmup",
    "warmup_steps": 3,
    "save_steps": 1,
    "max_steps": 10,
}


def checkpoints(run_dir):
    return sorted(path.name for path in (run_dir / "checkpoints").glob("checkpoint-*"))


@pytest.mark.slow
def test_learning_rate_100_stops_with_the_collapse_status_and_a_rerun_stops_again(model_dir, train_jsonl, tmp_path):
    run_dir = tmp_path / "run"
    command = train_command(model_dir, train_jsonl, run_dir, training_spec=COLLAPSING)
    first = run_train(command)
    assert first.returncode == COLLAPSE_EXIT_CODE, first.stderr[-3000:]
    line = next(line for line in first.stderr.splitlines() if "collapsed training" in line)
    assert "rank 0: step 2: weight norm" in line and "x its start" in line, line
    assert line.endswith(f"Last healthy checkpoint: {run_dir / 'checkpoints' / 'checkpoint-1'}"), line
    assert not (run_dir / "final").exists() and not (run_dir / "metrics.jsonl").exists()
    assert checkpoints(run_dir) == ["checkpoint-1"]
    second = run_train(command)
    assert second.returncode == COLLAPSE_EXIT_CODE, second.stderr[-3000:]
    assert f"resuming from {run_dir / 'checkpoints' / 'checkpoint-1'} (step 1)" in second.stderr
    assert "collapsed training: rank 0: step 2: weight norm" in second.stderr
    assert checkpoints(run_dir) == ["checkpoint-1"]


def test_flat_signals_stop_the_run_and_set_the_collapsed_checkpoints_aside(
    model_dir, train_jsonl, tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv(RUNTIME_VARIABLE, json.dumps({"health": {"weight_growth": 1e30}}))
    run_dir = tmp_path / "run"
    argv = stage_argv(model_dir, train_jsonl, run_dir)
    argv[argv.index("--training-spec") + 1] = json.dumps(COLLAPSING)
    with caplog.at_level(logging.ERROR, logger="pipeline.train"), pytest.raises(SystemExit) as stop:
        run_cli(main, argv)
    assert stop.value.code == COLLAPSE_EXIT_CODE
    line = next(record.getMessage() for record in caplog.records if "collapsed training" in record.getMessage())
    assert (
        "step 7: reward, entropy and gradient norm flat for 5 logged steps (steps 3-7: reward 0, entropy 0, gradient norm 0"
        in line
    ), line
    assert f"Last healthy checkpoint: {run_dir / 'checkpoints' / 'checkpoint-1'}; made after step 1" in line, line
    assert newest_valid_checkpoint(run_dir / "checkpoints")[0] == 1
    (moved,) = (run_dir / "set_aside").iterdir()
    assert checkpoints(moved) == [f"checkpoint-{step}" for step in range(2, 7)]
    why = json.loads((moved / "why.json").read_text())
    assert why["healthy_through"] == 1 and why["health"][0]["check"] == "flat" and why["health"][0]["step"] == 7
    assert [json.loads(row)["step"] for row in (moved / "checkpoints" / "metrics.jsonl").read_text().splitlines()] == [
        *range(1, 8)
    ]
    assert not (run_dir / "final").exists()
