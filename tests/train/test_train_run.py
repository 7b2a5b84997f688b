"""End-to-end runs of ``python -m pipeline.train`` on the warmed-up tiny model: a complete run, runs killed by
SIGTERM and SIGKILL and resumed, and a run whose newest checkpoint is corrupt. A resumed run must end with exactly
the weights of the uninterrupted run (same seed), which it only does if it continues at the checkpoint's step with
the optimizer, scheduler, RNG, data position and TRL's generation buffer restored.

The runs that are compared train on the pseudo-random reward of ``tests.hold_stage``: with the outcome reward the
tiny model's groups soon all score 0, the steps after a resume point then have no gradient and the weights cannot
tell a wrong resume from a right one. Each resume test asserts that every step after its resume point had one.
(Checked by breaking the resume on purpose: each of RNG, generation buffer, data position, scheduler and optimizer
state left unrestored fails a test here.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file
from train_support import REPO_ROOT, TRAINING_SPEC, run_train, subprocess_env, train_command, training_rows
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.trainer.utils import RepeatSampler

from pipeline.core.exit_codes import PREEMPTED_EXIT_CODE
from pipeline.core.layout import working_metrics_path
from tests.hold_stage import hold_training_env, pseudo_random_reward_env

pytestmark = pytest.mark.slow
EXPORT = ("--export-steps", "2")
REWARD = pseudo_random_reward_env()


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def step_lines(run_dir: Path) -> list[int]:
    """Steps of the per-step log lines (the end-of-run summary excluded)."""
    return [row["step"] for row in metrics(run_dir) if "train_runtime" not in row]


def assert_gradient_after(run_dir: Path, step: int) -> None:
    """Every step after ``step`` had mixed rewards in its generation round and a non-zero gradient."""
    rows = [row for row in metrics(run_dir) if row["step"] > step and "train_runtime" not in row]
    assert rows and all(row["grad_norm"] > 0 for row in rows), [(row["step"], row["grad_norm"]) for row in rows]
    assert all(row.get("frac_reward_zero_std", 0.0) == 0.0 for row in rows)


def global_step(checkpoint: Path) -> int:
    return json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]


def newest_checkpoint_step(run_dir: Path) -> int:
    return max(int(path.name.split("-")[1]) for path in (run_dir / "checkpoints").glob("checkpoint-*"))


def assert_same_weights(first: Path, second: Path) -> None:
    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[name], b[name]) for name in a)


def interrupt_after_checkpoint(
    command: list[str], run_dir: Path, signum: int, step: int = 2, *, whole_tree: bool = False
) -> subprocess.CompletedProcess:
    """Start a run that holds once checkpoint-``step`` is published, send it ``signum`` once it says it holds
    there (the checkpoint directory alone appears before the export and the callbacks), wait for its end.
    ``whole_tree``: the signal goes to the command's process and every process below it, as Slurm ends a job step
    (torch's elastic agent starts each worker in a session of its own: a process-group kill would miss them)."""
    process = subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=subprocess_env(REWARD, hold_training_env(step)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    output: dict[str, list[str]] = {"stdout": [], "stderr": []}
    readers = [
        threading.Thread(target=lambda name=name, stream=stream: output[name].extend(stream), daemon=True)
        for name, stream in (("stdout", process.stdout), ("stderr", process.stderr))
    ]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + 300
    while not any(f"holding after checkpoint-{step}" in line for line in list(output["stderr"])):
        assert process.poll() is None, "".join(output["stderr"])[-3000:]
        assert time.monotonic() < deadline, f"no hold after checkpoint-{step} within 300 s"
        time.sleep(0.1)
    assert (run_dir / "checkpoints" / f"checkpoint-{step}").is_dir()
    if whole_tree:
        root = psutil.Process(process.pid)
        for member in [*root.children(recursive=True), root]:
            member.send_signal(signum)
    else:
        process.send_signal(signum)
    process.wait(timeout=300)
    for reader in readers:
        reader.join(timeout=60)
    return subprocess.CompletedProcess(
        command, process.returncode, "".join(output["stdout"]), "".join(output["stderr"])
    )


@pytest.fixture(scope="module")
def reference_run(model_dir, train_jsonl, tmp_path_factory) -> Path:
    """An uninterrupted 4-step run (checkpoints at 2 and 4, export of step 2)."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    result = run_train(train_command(model_dir, train_jsonl, run_dir, *EXPORT), REWARD)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def test_complete_run_layout(reference_run):
    final = reference_run / "final"
    model = AutoModelForCausalLM.from_pretrained(final)
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert model.config.model_type == "qwen3" and tokenizer.chat_template
    assert global_step(reference_run / "checkpoints" / "checkpoint-4") == 4
    assert not list(reference_run.glob(".*")) and not list((reference_run / "checkpoints").glob(".*"))


def test_metrics_have_one_line_per_step_with_rewards(reference_run):
    rows = metrics(reference_run)
    assert (reference_run / "metrics.jsonl").read_text() == working_metrics_path(reference_run).read_text()
    assert step_lines(reference_run) == [1, 2, 3, 4]
    assert sum("train_runtime" in row for row in rows) == 1
    rewards = [row["rewards/pseudo_random_reward/mean"] for row in rows if "reward" in row]
    assert len(rewards) == 2  # one generation round per two steps (num_iterations 2)
    assert all(0.0 <= reward <= 1.0 for reward in rewards)
    assert_gradient_after(reference_run, 0)


def test_the_healthy_run_logs_its_weight_norm_and_trips_no_health_check(reference_run):
    rows = [row for row in metrics(reference_run) if "train_runtime" not in row]
    assert all(1.0 < row["weight_growth"] < 1.1 and row["weight_norm"] > 0 for row in rows), rows
    health = json.loads((reference_run / "provenance.json").read_text())["health"]
    assert health["verdict"] == "healthy" and health["trips"] == [] and health["rows"] == 4, health


def test_training_changed_the_weights(reference_run, model_dir):
    before, after = load_file(model_dir / "model.safetensors"), load_file(reference_run / "final/model.safetensors")
    assert any(not torch.equal(before[name], after[name]) for name in before)


def test_export_is_the_step_2_model(reference_run):
    export = reference_run / "exports" / "step-2"
    assert_same_weights(export, reference_run / "checkpoints" / "checkpoint-2")
    assert (
        os.stat(export / "model.safetensors").st_ino
        == os.stat(reference_run / "checkpoints" / "checkpoint-2" / "model.safetensors").st_ino
    )
    assert not (export / "optimizer.pt").exists() and (export / "tokenizer.json").is_file()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_killed_run_resumes_from_its_checkpoint(model_dir, train_jsonl, tmp_path, reference_run, signum):
    run_dir = tmp_path / "run"
    command = train_command(model_dir, train_jsonl, run_dir, *EXPORT)
    interrupted = interrupt_after_checkpoint(command, run_dir, signum)
    assert "test hook: holding after checkpoint-2 until a signal" in interrupted.stderr
    if signum == signal.SIGTERM:  # the run finishes step 3, checkpoints it (inside a generation round) and stops
        assert interrupted.returncode == PREEMPTED_EXIT_CODE, interrupted.stderr[-3000:]
        assert "received SIGTERM: saving a checkpoint at step 3 and stopping" in interrupted.stderr
    else:
        assert interrupted.returncode == -signal.SIGKILL
    assert not (run_dir / "final").exists()
    assert not (run_dir / "metrics.jsonl").exists()  # published only when the run completes
    resumed_at = newest_checkpoint_step(run_dir)
    assert resumed_at == (3 if signum == signal.SIGTERM else 2)
    lines_before = working_metrics_path(run_dir).read_text().splitlines()
    # Snakemake deletes the declared outputs of a failed job before it reruns it.
    (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    shutil.rmtree(run_dir / "exports", ignore_errors=True)

    rerun = run_train(command, REWARD)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    checkpoint = run_dir / "checkpoints" / f"checkpoint-{resumed_at}"
    assert f"resuming from {checkpoint} (step {resumed_at})" in rerun.stderr
    assert step_lines(run_dir) == [1, 2, 3, 4]
    # The lines up to the checkpoint are the first attempt's, byte for byte: those steps were not trained again.
    kept = [line for line in lines_before if json.loads(line)["step"] <= resumed_at and "train_runtime" not in line]
    assert (run_dir / "metrics.jsonl").read_text().splitlines()[: len(kept)] == kept
    assert global_step(run_dir / "checkpoints" / "checkpoint-4") == 4
    assert_gradient_after(run_dir, resumed_at)
    assert_same_weights(run_dir / "final", reference_run / "final")
    assert_same_weights(run_dir / "exports" / "step-2", reference_run / "exports" / "step-2")


def assert_resumes_at_epoch_1_like_the_reference(command: list[str], run_dir: Path, reference: Path) -> None:
    """Rerun ``command`` after a kill at checkpoint-2 (the end of epoch 0 of 2-step epochs): it resumes there, ends
    epoch 2 at step 4, trains after the resume point and ends with the uninterrupted ``reference`` run's weights."""
    rerun = run_train(command, REWARD)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resuming from {run_dir / 'checkpoints' / 'checkpoint-2'} (step 2)" in rerun.stderr
    assert json.loads((run_dir / "checkpoints" / "checkpoint-4" / "trainer_state.json").read_text())["epoch"] == 2
    assert_gradient_after(run_dir, 2)
    assert_same_weights(run_dir / "final", reference / "final")


def test_run_resumed_at_an_epoch_boundary_continues_with_the_next_epochs_order(model_dir, tmp_path):
    """4 rows, all 4 prompts in each generation round (x 4 generations, num_iterations 2): one epoch is 2 steps,
    so the run killed after checkpoint-2 resumes at the start of epoch 1, whose order a resumed process must draw
    as the uninterrupted one did (not replay epoch 0's)."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in training_rows(4, seed=5)), encoding="utf-8")
    spec = {**TRAINING_SPEC, "per_device_train_batch_size": 16}
    orders = RepeatSampler(range(4), mini_repeat_count=4, batch_size=4, repeat_count=2, shuffle=True, seed=3)
    assert list(orders) != list(orders)  # epochs 0 and 1 differ at the stage's seed 3
    reference = tmp_path / "reference"
    finished = run_train(train_command(model_dir, data, reference, training_spec=spec), REWARD)
    assert finished.returncode == 0, finished.stderr[-3000:]
    run_dir = tmp_path / "run"
    command = train_command(model_dir, data, run_dir, training_spec=spec)
    assert interrupt_after_checkpoint(command, run_dir, signal.SIGKILL).returncode == -signal.SIGKILL
    assert_resumes_at_epoch_1_like_the_reference(command, run_dir, reference)


def test_usr1_reaches_the_stage_through_the_launcher(model_dir, train_jsonl, tmp_path):
    """The Snakefile starts training through ``pipeline.launch``, which hands over with SIGUSR1 ignored (for the
    launcher layers in between): the stage must still catch Slurm's warning, checkpoint and exit 75."""
    run_dir = tmp_path / "run"
    train = train_command(model_dir, train_jsonl, run_dir)
    command = [*train[:2], "pipeline.launch", "--gpus", "0", "--nodes", "1", "--", *train[2:]]
    interrupted = interrupt_after_checkpoint(command, run_dir, signal.SIGUSR1)
    assert "mode single-process" in interrupted.stderr
    assert interrupted.returncode == PREEMPTED_EXIT_CODE, interrupted.stderr[-3000:]
    assert "received SIGUSR1: saving a checkpoint at step 3 and stopping" in interrupted.stderr
    assert newest_checkpoint_step(run_dir) == 3


def test_corrupt_newest_checkpoint_is_skipped(model_dir, train_jsonl, tmp_path, reference_run):
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run / "checkpoints", run_dir / "checkpoints")
    shutil.copytree(reference_run / "exports", run_dir / "exports")
    lines = (reference_run / "metrics.jsonl").read_text().splitlines()
    working_metrics_path(run_dir).write_text("\n".join(lines[:3]) + "\n")
    (run_dir / "checkpoints" / "checkpoint-4" / "trainer_state.json").write_text('{"global_step": 4, "log_')
    (run_dir / "checkpoints" / ".staging" / "checkpoint-6").mkdir(parents=True)  # a save killed half-way

    rerun = run_train(train_command(model_dir, train_jsonl, run_dir, *EXPORT), REWARD)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    corrupt = run_dir / "checkpoints" / "checkpoint-4"
    assert f"skipping checkpoint {corrupt}: trainer_state.json unreadable" in rerun.stderr
    assert f"resuming from {run_dir / 'checkpoints' / 'checkpoint-2'} (step 2)" in rerun.stderr
    assert global_step(corrupt) == 4
    assert step_lines(run_dir) == [1, 2, 3, 4]
    assert_gradient_after(run_dir, 2)
    assert_same_weights(run_dir / "final", reference_run / "final")
    assert not (run_dir / "checkpoints" / ".staging").exists()


def test_outputs_deleted_after_checkpoint_rotation_are_published_again(model_dir, train_jsonl, tmp_path, reference_run):
    """save_total_limit 1 rotates checkpoint-2 away; Snakemake then deletes the outputs of the job (as it does when
    a job fails after training): the rerun trains no further step and publishes them again, step 2's export from
    its working copy and the final model from checkpoint-4."""
    run_dir = tmp_path / "run"
    spec = {**TRAINING_SPEC, "save_total_limit": 1}
    command = train_command(model_dir, train_jsonl, run_dir, *EXPORT, training_spec=spec)
    first = run_train(command, REWARD)
    assert first.returncode == 0, first.stderr[-3000:]
    assert not (run_dir / "checkpoints" / "checkpoint-2").exists()
    shutil.rmtree(run_dir / "exports")
    shutil.rmtree(run_dir / "final")
    (run_dir / "metrics.jsonl").unlink()

    rerun = run_train(command, REWARD)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    checkpoint = run_dir / "checkpoints" / "checkpoint-4"
    assert f"training finished at {checkpoint} (step 4): publishing its outputs" in rerun.stderr
    assert sorted(path.name for path in (run_dir / "checkpoints").glob("checkpoint-*")) == ["checkpoint-4"]
    assert_same_weights(run_dir / "exports" / "step-2", reference_run / "exports" / "step-2")
    assert_same_weights(run_dir / "final", reference_run / "final")
    assert (run_dir / "final" / "tokenizer.json").is_file()
    assert step_lines(run_dir) == [1, 2, 3, 4]
    assert sum("train_runtime" in row for row in metrics(run_dir)) == 1  # the first attempt's summary, kept


def test_grail_run_checkpoints_its_generation_buffer(model_dir, train_jsonl, tmp_path):
    run_dir = tmp_path / "run"
    spec = {**TRAINING_SPEC, "max_steps": 1, "save_steps": 1}
    result = run_train(
        train_command(model_dir, train_jsonl, run_dir, training_spec=spec, method_spec={"credit": "grail"})
    )
    assert result.returncode == 0, result.stderr[-3000:]
    buffer = torch.load(run_dir / "checkpoints/checkpoint-1/generation_buffer_rank0.pt", weights_only=True)
    assert len(buffer) == 1 and "completion_ids" in buffer[0]
    assert (run_dir / "final" / "model.safetensors").is_file()
    assert "rewards/trl_outcome_reward/mean" in metrics(run_dir)[0]  # the stage's own reward (no test hook)
    assert any(key.startswith("grail/") for row in metrics(run_dir) for key in row)


def test_killed_oar_g_run_resumes_its_noise_stream(model_dir, train_jsonl, tmp_path):
    """OAR-G perturbs the embeddings with noise from the run's credit generator: a resumed run must continue that
    generator's stream where the checkpoint left it (a reseeded one would draw step 1's noise again at step 2)."""
    method = {"credit": "oar_g", "oar_g_noise_std": 1.0}  # large enough that the draws change the weights
    spec = {**TRAINING_SPEC, "save_steps": 1}
    reference = tmp_path / "reference"
    finished = run_train(
        train_command(model_dir, train_jsonl, reference, training_spec=spec, method_spec=method), REWARD
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert metrics(reference)[1]["oar_g/saliency_rows_frac"] > 0  # step 2 drew noise
    run_dir = tmp_path / "run"
    command = train_command(model_dir, train_jsonl, run_dir, training_spec=spec, method_spec=method)
    assert interrupt_after_checkpoint(command, run_dir, signal.SIGKILL, step=1).returncode == -signal.SIGKILL
    rerun = run_train(command, REWARD)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resuming from {run_dir / 'checkpoints' / 'checkpoint-1'} (step 1)" in rerun.stderr
    assert_gradient_after(run_dir, 1)
    assert_same_weights(run_dir / "final", reference / "final")
    assert (reference / "checkpoints" / "checkpoint-1" / "credit_generator_rank0.pt").is_file()
    assert not (reference / "final" / "credit_generator_rank0.pt").exists()  # training state, not model
