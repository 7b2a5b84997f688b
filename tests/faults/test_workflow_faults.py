"""Faults injected into the real workflow: `snakemake` runs a shrunken CI study in a scratch directory, the test
kills the training job after a checkpoint (SIGTERM, then SIGKILL on the rerun) and the evaluation job mid-way
(SIGTERM to the stage, then SIGKILL to Snakemake and its job together, like a lost node), and reruns Snakemake
the way a user would: `snakemake --rerun-incomplete` (after `snakemake --unlock` when Snakemake itself died).

Training must resume from the newest checkpoint's step (never step 0) and end with exactly the weights of an
uninterrupted run; the evaluation must end with every (item, sample) exactly once, keeping the rows written
before each kill. The training runs compared train on the pseudo-random reward of ``tests.hold_stage``, so that
every step after a resume point has a gradient (asserted): with the outcome reward the tiny model scores 0
everywhere and its weights would never move."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fault_support import (
    BENCHMARK,
    BENCHMARK_ITEMS,
    EXPORT_STEP,
    MAX_STEPS,
    N_SAMPLES,
    RUN,
    SAMPLES,
    checkpoint_steps,
    jsonl,
    kill_session,
    run_snakemake,
    signal_stage,
    snakemake_output,
    stage_env,
    start_snakemake,
    unlock,
    wait_until,
)
from safetensors.torch import load_file

from pipeline.core.io import canonical_json
from pipeline.study.load import load_study
from tests.hold_stage import hold_evaluation_env, hold_training_env, pseudo_random_reward_env

pytestmark = pytest.mark.slow

TRAIN_LOG = "results/logs/train/tiny/grpo/seed0.log"
REWARD = pseudo_random_reward_env()
EVAL_LOG = "results/logs/evaluate/tiny/grpo/seed0/final.log"


def same_weights(first: Path, second: Path) -> bool:
    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def uninterrupted_run(workdir: Path, out: Path) -> Path:
    """The same training job run once without faults, straight from the stage CLI (the reference weights)."""
    study = load_study([workdir / "config.yaml"])
    command = [
        sys.executable, "-m", "pipeline.train",
        "--model", "results/models/tiny/start",
        "--training-spec", canonical_json(study.training_spec("tiny")),
        "--method-spec", canonical_json(study.methods["grpo"].spec),
        "--data", "results/data/train.jsonl", "--seed", "0", "--out", str(out),
    ]  # fmt: skip
    result = subprocess.run(command, cwd=workdir, env=stage_env(**REWARD), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def resumed_line(step: int) -> str:
    return f"resuming from {RUN}/checkpoints/checkpoint-{step} (step {step})"


def test_training_killed_twice_resumes_from_its_checkpoints(study: Path) -> None:
    run_dir, log = study / RUN, study / TRAIN_LOG
    target = f"{RUN}/metrics.jsonl"

    # 1. SIGTERM once checkpoint-2 is published (the stage holds there): it saves step 3 and exits 75.
    snakemake = start_snakemake(study, target, hooks={**REWARD, **hold_training_env(2)})
    wait_until(lambda: (run_dir / "checkpoints" / "checkpoint-2").is_dir(), "checkpoint-2", snakemake)
    signal_stage(snakemake, "pipeline.train", signal.SIGTERM)
    assert snakemake.wait(timeout=300) != 0
    first_log = log.read_text(encoding="utf-8")
    assert "received SIGTERM: saving a checkpoint at step 3 and stopping" in first_log
    assert "stopped at step 3 on request; rerun to resume" in first_log
    first = max(checkpoint_steps(run_dir))
    assert first == 3 and not (run_dir / "final").exists()

    # 2. Rerun; SIGKILL once it published checkpoint-4 (held there): no chance to save anything.
    snakemake = start_snakemake(study, target, hooks={**REWARD, **hold_training_env(4)})
    wait_until(lambda: max(checkpoint_steps(run_dir)) > first, f"a checkpoint after step {first}", snakemake)
    signal_stage(snakemake, "pipeline.train", signal.SIGKILL)
    assert snakemake.wait(timeout=300) != 0
    assert resumed_line(first) in log.read_text(encoding="utf-8")
    second = max(checkpoint_steps(run_dir))
    assert second == 4 and not (run_dir / "final").exists()

    # 3. Rerun to the end.
    assert run_snakemake(study, target, hooks=REWARD) == 0, snakemake_output(study)[-5000:]
    assert resumed_line(second) in log.read_text(encoding="utf-8")
    state = json.loads((run_dir / "checkpoints" / f"checkpoint-{MAX_STEPS}" / "trainer_state.json").read_text())
    assert state["global_step"] == MAX_STEPS
    steps = [row["step"] for row in jsonl(run_dir / "metrics.jsonl") if "train_runtime" not in row]
    assert steps == sorted(set(steps)) and steps[-1] == MAX_STEPS  # no step logged twice, none after the end
    assert steps[0] > 1 or steps == list(range(1, MAX_STEPS + 1))  # a restart at 0 would log step 1 again
    rows = [row for row in jsonl(run_dir / "metrics.jsonl") if "train_runtime" not in row]
    after_resume = [row for row in rows if row["step"] > first]
    assert after_resume and all(row["grad_norm"] > 0 and row["frac_reward_zero_std"] == 0 for row in after_resume)
    assert "rewards/pseudo_random_reward/mean" in rows[-1]
    # Snakemake deleted the failed job's exports; the rerun exported step 4 again from its checkpoint.
    export = run_dir / "exports" / f"step-{EXPORT_STEP}"
    assert same_weights(export, run_dir / "checkpoints" / f"checkpoint-{EXPORT_STEP}")

    reference = uninterrupted_run(study, study / "reference")
    assert same_weights(run_dir / "final", reference / "final")


def test_evaluation_killed_midway_ends_with_every_sample_once(study: Path) -> None:
    out = study / SAMPLES
    partial = out.with_name(out.name + ".partial")
    expected = {(row["id"], s) for row in jsonl(study / BENCHMARK) for s in range(N_SAMPLES)}
    assert len(expected) == BENCHMARK_ITEMS * N_SAMPLES

    def rows_done() -> list[dict]:
        return [row for row in jsonl(partial) if "id" in row] if partial.exists() else []  # not the header, batch ends

    # 1. SIGTERM the evaluation stage after 6 durable appends, where it holds (trains the run first if needed).
    snakemake = start_snakemake(study, SAMPLES, hooks=hold_evaluation_env(6))
    wait_until(lambda: len(rows_done()) >= 6, "6 evaluated samples", snakemake, timeout=600)
    signal_stage(snakemake, "pipeline.evaluate", signal.SIGTERM)
    assert snakemake.wait(timeout=300) != 0
    kept_first = rows_done()
    assert not out.exists() and len(kept_first) == 6

    # 2. Rerun; SIGKILL Snakemake together with its job once 6 more samples were appended (held there).
    snakemake = start_snakemake(study, SAMPLES, hooks=hold_evaluation_env(6))
    wait_until(lambda: len(rows_done()) >= len(kept_first) + 6, "6 more samples", snakemake)
    kill_session(snakemake)
    kept_second = rows_done()
    assert kept_first == kept_second[: len(kept_first)]  # the first attempt's rows survived, unchanged
    assert not out.exists() and len(kept_second) == 12
    assert f"resuming from {SAMPLES}.partial: {len(kept_first)} of {len(expected)} samples done" in (
        study / EVAL_LOG
    ).read_text(encoding="utf-8")

    # 3. Snakemake died holding its lock: unlock, rerun to the end.
    unlock(study)
    assert run_snakemake(study, SAMPLES) == 0, snakemake_output(study)[-5000:]
    log = (study / EVAL_LOG).read_text(encoding="utf-8")
    assert f"resuming from {SAMPLES}.partial: {len(kept_second)} of {len(expected)} samples done" in log
    assert f"{len(expected) - len(kept_second)} samples to generate" in log
    rows = jsonl(out)
    keys = [(row["id"], row["sample"]) for row in rows]
    assert len(keys) == len(set(keys)) == len(expected) and set(keys) == expected
    assert all(row in rows for row in kept_second)  # kept rows were not generated again
    assert not partial.exists()
