"""A checkpoint that does not fit (pipeline.runtime.disk_space) on in-process runs of ``pipeline.train`` on the untrained tiny
model: the free-space check before a save, and a write that runs out of space (OSError ENOSPC injected into the
Trainer's optimizer save), stop the run with ``SAVE_FAILED_EXIT_CODE`` and an error naming the path and the space;
no staging directory is left, and the rerun resumes from the last complete checkpoint.
The same on a real 9 MiB tmpfs, the issue's reproduction: the tiny model's checkpoint takes 6.2 MB, so the first
fits and the second does not; once refused by the check, once by the filesystem itself (the check told the disk was
large enough), where ``torch.save`` failed with "iostream error" / "unexpected pos" before this guard existed.
(Checked by breaking it: without the free-space check the first run completes; without the clean-up after a failed
write ``checkpoints/.staging`` is left behind, and on the tmpfs the rerun then has no room for checkpoint-4.)"""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest
from train_support import stage_argv
from transformers import Trainer

from pipeline.core.exit_codes import SAVE_FAILED_EXIT_CODE
from pipeline.core.io import run_cli
from pipeline.train import main
from pipeline.training import resume
from tests.conftest import resize_tmpfs


def failed_run(argv: list[str], caplog: pytest.LogCaptureFixture) -> str:
    """Run the stage, expect ``SAVE_FAILED_EXIT_CODE``; its error line."""
    with caplog.at_level(logging.ERROR, logger="pipeline.train"), pytest.raises(SystemExit) as stop:
        run_cli(main, argv)
    assert stop.value.code == SAVE_FAILED_EXIT_CODE
    return next(record.getMessage() for record in caplog.records if "checkpoint not saved" in record.getMessage())


def assert_clean_stop_then_resume(run_dir: Path, argv: list[str], caplog: pytest.LogCaptureFixture) -> None:
    """After a failed save of checkpoint-4: no staging directory, no final model, checkpoint-2 the newest valid one;
    then (the fault injection undone) a rerun resumes from step 2 and publishes the final model."""
    assert not (run_dir / "checkpoints" / ".staging").exists() and not (run_dir / "final").exists()
    assert resume.newest_valid_checkpoint(run_dir / "checkpoints")[0] == 2
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipeline.train"):
        run_cli(main, argv)
    assert "(step 2)" in next(
        record.getMessage() for record in caplog.records if "resuming from" in record.getMessage()
    )
    assert (run_dir / "final" / "model.safetensors").is_file()


def test_a_checkpoint_that_does_not_fit_is_refused_naming_path_and_space(
    untrained_model, train_jsonl, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(resume, "free_bytes", lambda path: 1000)
    run_dir = tmp_path / "run"
    message = failed_run(stage_argv(untrained_model, train_jsonl, run_dir), caplog)
    assert f"{run_dir / 'checkpoints' / 'checkpoint-2'}: not enough disk space for the checkpoint: " in message
    assert "bytes) needed, 0.000 GiB (1000 bytes) free" in message
    assert sorted(path.name for path in (run_dir / "checkpoints").iterdir() if path.is_dir()) == []


def test_a_save_that_runs_out_of_space_leaves_no_staging_and_the_rerun_resumes(
    untrained_model, train_jsonl, tmp_path, monkeypatch, caplog
):
    save_optimizer = Trainer._save_optimizer_and_scheduler

    def out_of_space_at_step_4(self: Trainer, output_dir: str) -> None:
        if self.state.global_step == 4:
            (Path(output_dir) / "optimizer.pt").write_bytes(b"torn")
            raise OSError(errno.ENOSPC, "No space left on device")
        save_optimizer(self, output_dir)

    monkeypatch.setattr(Trainer, "_save_optimizer_and_scheduler", out_of_space_at_step_4)
    run_dir = tmp_path / "run"
    argv = stage_argv(untrained_model, train_jsonl, run_dir)
    message = failed_run(argv, caplog)
    staging = run_dir / "checkpoints" / ".staging"
    assert f"{staging / 'checkpoint-4'}: saving the checkpoint failed (OSError: [Errno 28] No space left" in message
    assert f"free at {run_dir / 'checkpoints'}" in message
    monkeypatch.undo()
    assert_clean_stop_then_resume(run_dir, argv, caplog)


@pytest.fixture
def small_filesystem(mount_tmpfs) -> Path:
    """A 9 MiB tmpfs mounted for the test (root only, as in CI): room for one checkpoint of the tiny model."""
    return mount_tmpfs("9m")


@pytest.mark.parametrize("refused_by", ["the free-space check", "the filesystem"])
def test_a_small_real_filesystem_stops_the_run_cleanly_and_the_rerun_resumes(
    refused_by, small_filesystem, untrained_model, train_jsonl, monkeypatch, caplog
):
    if refused_by == "the filesystem":
        monkeypatch.setattr(resume, "directory_bytes", lambda directory: 0)  # the check thinks the save fits
    run_dir = small_filesystem / "run"
    argv = stage_argv(untrained_model, train_jsonl, run_dir)
    message = failed_run(argv, caplog)
    if refused_by == "the filesystem":
        assert "saving the checkpoint failed" in message and f"free at {run_dir / 'checkpoints'}" in message
    else:
        assert f"{run_dir / 'checkpoints' / 'checkpoint-4'}: not enough disk space for the checkpoint" in message
    resize_tmpfs(small_filesystem, "64m")  # the user frees space
    monkeypatch.undo()
    assert_clean_stop_then_resume(run_dir, argv, caplog)
