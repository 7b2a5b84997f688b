"""Checkpoint validation, metrics truncation, data order across epochs and model export (no training)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch
from trl.trainer.utils import RepeatSampler

from pipeline.core.io import export_model
from pipeline.core.seal import seal_problem
from pipeline.training.resume import EpochRepeatSampler, checkpoint_problem, keep_metrics_up_to, newest_valid_checkpoint


def make_checkpoint(model_dir: Path, checkpoints: Path, step: int) -> Path:
    """A checkpoint directory as the Trainer writes it: model, tokenizer, optimizer, RNG and trainer state."""
    checkpoint = checkpoints / f"checkpoint-{step}"
    shutil.copytree(model_dir, checkpoint)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "generation_buffer_rank0.pt"):
        torch.save({}, checkpoint / name)
    return checkpoint


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda c: (c / "trainer_state.json").unlink(), "trainer_state.json missing"),
        (lambda c: (c / "trainer_state.json").write_text('{"global_st'), "trainer_state.json unreadable"),
        (lambda c: (c / "trainer_state.json").write_text('{"epoch": 1}'), "trainer_state.json has no integer"),
        (lambda c: (c / "model.safetensors").unlink(), "model weights missing"),
        (lambda c: truncate(c / "model.safetensors"), "model.safetensors unreadable"),
        (lambda c: (c / "optimizer.pt").unlink(), "optimizer state missing"),
    ],
)
def test_checkpoint_problem_detects_damage(untrained_model, tmp_path, damage, problem):
    checkpoint = make_checkpoint(untrained_model, tmp_path, 4)
    assert checkpoint_problem(checkpoint) is None
    damage(checkpoint)
    assert checkpoint_problem(checkpoint).startswith(problem)


def test_sharded_weights_need_every_shard(untrained_model, tmp_path):
    checkpoint = make_checkpoint(untrained_model, tmp_path, 2)
    (checkpoint / "model.safetensors").rename(checkpoint / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(index))
    assert checkpoint_problem(checkpoint) == "weight shards missing: model-00002-of-00002.safetensors"


def test_newest_valid_checkpoint_skips_corrupt_ones_with_a_warning(untrained_model, tmp_path, caplog):
    for step in (2, 10, 12):
        make_checkpoint(untrained_model, tmp_path, step)
    (tmp_path / "checkpoint-12" / "trainer_state.json").write_text("{")
    (tmp_path / "checkpoint-10" / "model.safetensors").unlink()
    (tmp_path / "checkpoint-99").write_text("not a directory")
    (tmp_path / ".staging" / "checkpoint-14").mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="pipeline.training.resume"):
        found = newest_valid_checkpoint(tmp_path)
    assert found == (2, tmp_path / "checkpoint-2")
    assert [record.getMessage().split(":")[0] for record in caplog.records] == [
        f"skipping checkpoint {tmp_path / 'checkpoint-12'}",
        f"skipping checkpoint {tmp_path / 'checkpoint-10'}",
    ]


def test_no_checkpoints(tmp_path):
    assert newest_valid_checkpoint(tmp_path / "absent") is None
    assert newest_valid_checkpoint(tmp_path) is None


def test_keep_metrics_up_to_drops_later_lines_summaries_and_torn_tail(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"step": 1, "loss": 0.1}, {"step": 2, "loss": 0.2}, {"step": 2, "train_runtime": 3.0}, {"step": 3}]
    path.write_text("".join(json.dumps(row) + "\n" for row in lines) + '{"step": 4, "lo')
    keep_metrics_up_to(path, 2)
    assert [json.loads(line) for line in path.read_text().splitlines()] == lines[:2]


def test_keep_metrics_of_a_finished_run_keeps_its_last_summary(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"step": 1}, {"step": 1, "train_runtime": 1.0}, {"step": 2}, {"step": 2, "train_runtime": 2.0}]
    path.write_text("".join(json.dumps(row) + "\n" for row in lines))
    keep_metrics_up_to(path, 2, training_done=True)
    assert [json.loads(line) for line in path.read_text().splitlines()] == [lines[0], *lines[2:]]


def test_keep_metrics_for_a_fresh_run_empties_the_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n')
    keep_metrics_up_to(path, None)
    assert not path.exists()


@pytest.mark.parametrize("epoch", [0, 1, 3])
def test_epoch_sampler_matches_an_uninterrupted_repeat_sampler(epoch):
    """A fresh sampler told ``set_epoch(e)`` yields what TRL's sampler yields on its (e+1)-th pass."""
    arguments = {"data_source": list(range(11)), "mini_repeat_count": 2, "batch_size": 3, "repeat_count": 2}
    uninterrupted = RepeatSampler(**arguments, seed=5)
    passes = [list(uninterrupted) for _ in range(epoch + 1)]
    resumed = EpochRepeatSampler(**arguments, seed=5)
    resumed.set_epoch(epoch)
    assert list(resumed) == passes[epoch]
    assert epoch == 0 or passes[epoch] != passes[0]


def test_export_hardlinks_model_files_and_leaves_training_state(untrained_model, tmp_path):
    checkpoint = make_checkpoint(untrained_model, tmp_path / "checkpoints", 2)
    (checkpoint / "training_args.bin").write_bytes(b"x")
    destination = tmp_path / "exports" / "step-2"
    export_model(checkpoint, destination)
    exported = sorted(path.name for path in destination.iterdir())
    assert exported == sorted([*(path.name for path in untrained_model.iterdir()), "seal.json"])
    assert seal_problem(destination) is None  # sealed anew: the checkpoint's seal covers its training state
    weights = destination / "model.safetensors"
    assert os.stat(weights).st_ino == os.stat(checkpoint / "model.safetensors").st_ino
    assert not list((tmp_path / "exports").glob(".*"))


@pytest.mark.parametrize("device", ["cpu:0", "cpu:1"])
def test_state_saved_on_cpu_loads_onto_an_indexed_cpu_device(tmp_path, device) -> None:
    """transformers loads a resumed run's optimizer state with map_location=args.device when there are several
    processes; accelerate gives rank i of a multi-CPU run cpu:i (the CI run of the two-process resume tests failed
    on it). Importing pipeline.training.resume registers that location with torch.load."""
    path = tmp_path / "optimizer.pt"
    torch.save({"exp_avg": torch.arange(3.0)}, path)
    loaded = torch.load(path, map_location=torch.device(device), weights_only=True)
    torch.testing.assert_close(loaded["exp_avg"], torch.arange(3.0))
