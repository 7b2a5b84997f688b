"""Two training processes on the CPU through ``pipeline.launch --gpus 2`` (its cpu mode: ``accelerate launch``,
DDP over gloo, one thread each on this machine's two cores), with HF generation: TRL's cross-rank gathers, the
rank-0 writes, the per-rank state files of a checkpoint and the exit status of a preempted run, for real.

As in test_train_run, the compared runs train on the pseudo-random reward of ``tests.hold_stage`` so that every
step after the resume point has a gradient. The resume test found a real bug (rank 1 of a multi-CPU run could not
load its generation buffer onto its device ``cpu:1``); the launcher's forwarding, signal file and exit-status
mapping were each broken on purpose against the faster tests of tests/clusters/test_launch.py."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch
from test_train_run import (
    REWARD,
    assert_gradient_after,
    assert_resumes_at_epoch_1_like_the_reference,
    assert_same_weights,
    interrupt_after_checkpoint,
    metrics,
    newest_checkpoint_step,
    step_lines,
)
from train_support import TRAINING_SPEC, launch_two, run_train, train_command, training_rows

from pipeline.core.exit_codes import PREEMPTED_EXIT_CODE
from pipeline.core.layout import working_metrics_path

pytestmark = pytest.mark.slow
EXPORT = ("--export-steps", "2")


def assert_per_rank_state(checkpoint: Path) -> None:
    """Each rank saved its own RNG state and generation buffer (different prompts: different buffers)."""
    names = {path.name for path in checkpoint.iterdir()}
    assert {"rng_state_0.pth", "rng_state_1.pth", "generation_buffer_rank0.pt", "generation_buffer_rank1.pt"} <= names
    assert "rng_state.pth" not in names and "generation_buffer_rank2.pt" not in names
    buffers = [torch.load(checkpoint / f"generation_buffer_rank{rank}.pt", weights_only=True) for rank in (0, 1)]
    assert not torch.equal(buffers[0][0]["prompt_ids"], buffers[1][0]["prompt_ids"])


@pytest.fixture(scope="module")
def two_process_run(model_dir, train_jsonl, tmp_path_factory) -> tuple[Path, str]:
    """An uninterrupted 4-step GRPO run in two processes (checkpoints at 2 and 4, export of step 2)."""
    run_dir = tmp_path_factory.mktemp("two") / "run"
    result = run_train(launch_two(train_command(model_dir, train_jsonl, run_dir, *EXPORT)), REWARD)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir, result.stderr


def test_two_processes_train_and_rank_0_alone_writes(two_process_run) -> None:
    run_dir, stderr = two_process_run
    assert "mode cpu" in stderr and "2 CPU processes on this machine" in stderr
    assert step_lines(run_dir) == [1, 2, 3, 4]  # each step logged once, not once per process
    assert sum("train_runtime" in row for row in metrics(run_dir)) == 1
    assert (run_dir / "metrics.jsonl").read_text() == working_metrics_path(run_dir).read_text()
    assert (run_dir / "final" / "model.safetensors").is_file() and (run_dir / "exports" / "step-2").is_dir()
    assert not list(run_dir.glob(".*")) and not list((run_dir / "checkpoints").glob(".*"))
    for step in (2, 4):
        assert_per_rank_state(run_dir / "checkpoints" / f"checkpoint-{step}")
    assert_gradient_after(run_dir, 0)


def test_two_process_grail_run(model_dir, train_jsonl, tmp_path) -> None:
    run_dir = tmp_path / "run"
    spec = {**TRAINING_SPEC, "max_steps": 2, "save_steps": 2}
    train = train_command(model_dir, train_jsonl, run_dir, training_spec=spec, method_spec={"credit": "grail"})
    result = run_train(launch_two(train), REWARD)
    assert result.returncode == 0, result.stderr[-3000:]
    assert step_lines(run_dir) == [1, 2]
    assert all(any(key.startswith("grail/") for key in row) for row in metrics(run_dir) if "train_runtime" not in row)
    assert (run_dir / "final" / "model.safetensors").is_file()
    assert_per_rank_state(run_dir / "checkpoints" / "checkpoint-2")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_preempted_two_process_run_exits_75_and_resumes_to_the_same_weights(
    model_dir, train_jsonl, tmp_path, two_process_run, signum
) -> None:
    """The signal goes to the launcher only (as Snakemake's or a batch script's would): it forwards it to both
    stage processes, which checkpoint step 3 and exit 75; accelerate reports 1, the launcher 75."""
    reference, _ = two_process_run
    run_dir = tmp_path / "run"
    command = launch_two(train_command(model_dir, train_jsonl, run_dir, *EXPORT))
    interrupted = interrupt_after_checkpoint(command, run_dir, signum)
    name = signal.Signals(signum).name
    assert interrupted.returncode == PREEMPTED_EXIT_CODE, interrupted.stderr[-3000:]
    assert f"pipeline.launch: forwarding {name} to the stage processes" in interrupted.stderr
    assert f"received {name}: saving a checkpoint at step 3 and stopping" in interrupted.stderr
    assert "every stage process exited 75 (accelerate exited 1): exiting 75" in interrupted.stderr
    assert newest_checkpoint_step(run_dir) == 3
    assert_per_rank_state(run_dir / "checkpoints" / "checkpoint-3")
    assert not (run_dir / "final").exists() and not (run_dir / "metrics.jsonl").exists()

    rerun = run_train(command, REWARD)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resuming from {run_dir / 'checkpoints' / 'checkpoint-3'} (step 3)" in rerun.stderr
    assert step_lines(run_dir) == [1, 2, 3, 4]
    assert_gradient_after(run_dir, 3)
    assert_same_weights(run_dir / "final", reference / "final")
    assert_same_weights(run_dir / "exports" / "step-2", reference / "exports" / "step-2")


def test_two_process_run_killed_at_an_epoch_boundary_continues_with_the_next_epochs_order(model_dir, tmp_path) -> None:
    """4 rows, 8 completions per process x 2 processes = all 4 prompts x 4 generations per round (num_iterations 2):
    one epoch is 2 steps. The whole job is SIGKILLed after checkpoint-2 (the launcher, accelerate and both ranks, as
    Slurm ends a job step); the rerun starts epoch 1, whose order each rank's sampler must draw as the uninterrupted run did."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in training_rows(4, seed=5)), encoding="utf-8")
    spec = {**TRAINING_SPEC, "per_device_train_batch_size": 8}
    reference = tmp_path / "reference"
    finished = run_train(launch_two(train_command(model_dir, data, reference, training_spec=spec)), REWARD)
    assert finished.returncode == 0, finished.stderr[-3000:]
    run_dir = tmp_path / "run"
    command = launch_two(train_command(model_dir, data, run_dir, training_spec=spec))
    killed = interrupt_after_checkpoint(command, run_dir, signal.SIGKILL, whole_tree=True)
    assert killed.returncode == -signal.SIGKILL
    assert_resumes_at_epoch_1_like_the_reference(command, run_dir, reference)
