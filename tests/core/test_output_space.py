"""A full disk as every stage's named exit 73 (pipeline.core.disk_full, through pipeline.core.io.run_cli): a real
ENOSPC in another stage's write (prepare_data on a 4 KiB tmpfs), the errors that do not say ENOSPC (safetensors,
``torch.save``), and an ENOSPC from a write that no ``output_space`` wraps."""

from __future__ import annotations

import errno
import json
import re
from pathlib import Path

import pytest

from pipeline import prepare_data
from pipeline.core import disk_full
from pipeline.core.disk_full import OutputSpaceError, output_space
from pipeline.core.exit_codes import FINAL_EXIT_CODES, FINAL_EXIT_REASONS, SAVE_FAILED_EXIT_CODE
from pipeline.core.io import jsonl_bytes, run_cli


def test_another_stage_on_a_full_disk_exits_73_naming_path_needed_and_free(mount_tmpfs, tmp_path, capsys):
    disk = mount_tmpfs("4k")
    out = disk / "train.jsonl"
    spec = {"generated": {"count": 200, "seed": 0}}
    argv = ["--spec", json.dumps(spec), "--out", str(out), "--card", str(tmp_path / "card.json")]
    with pytest.raises(SystemExit) as stop:
        run_cli(prepare_data.main, argv)
    assert stop.value.code == SAVE_FAILED_EXIT_CODE in FINAL_EXIT_CODES
    rows, _ = prepare_data.prepare_data(spec, [])
    error = capsys.readouterr().err
    assert re.search(
        rf"error: {re.escape(str(out))}: not enough disk space for the training data: [\d.]+ GiB "
        rf"\({jsonl_bytes(rows)} bytes\) needed, [\d.]+ GiB \(\d+ bytes\) free \(OSError: \[Errno 28\]",
        error,
    ), error
    assert list(disk.iterdir()) == []  # the atomic write left no temporary behind
    assert FINAL_EXIT_REASONS[SAVE_FAILED_EXIT_CODE] == "an output did not fit on the disk"


class SerializingError(Exception):
    """Like safetensors' SafetensorError or torch.save's RuntimeError: a full disk that is no OSError."""


def test_an_error_that_is_no_enospc_is_a_full_disk_only_when_the_output_cannot_fit(monkeypatch, tmp_path):
    monkeypatch.setattr(disk_full, "free_bytes", lambda path: 1000)
    full = r"model: not enough disk space for the model: .*\(5000 bytes\) needed"
    with pytest.raises(OutputSpaceError, match=full), output_space(tmp_path / "model", 5000, "the model"):
        raise SerializingError("I/O error: No space left on device (os error 28)")
    with pytest.raises(SerializingError), output_space(tmp_path / "model", 500, "the model"):
        raise SerializingError("a serialization bug, not the disk")
    enospc = r"\(500 bytes\) needed, .*\(1000 bytes\) free"
    with pytest.raises(OutputSpaceError, match=enospc), output_space(tmp_path / "model", lambda: 500, "the model"):
        raise RuntimeError("unexpected pos") from OSError(errno.ENOSPC, "No space left on device")


def test_an_enospc_outside_output_space_still_exits_73(tmp_path, capsys):
    target = tmp_path / "report.md"

    def main(argv: list[str] | None) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(target))

    with pytest.raises(SystemExit) as stop:
        run_cli(main, [])
    assert stop.value.code == SAVE_FAILED_EXIT_CODE
    assert f"error: {target}: not enough disk space: more than the " in capsys.readouterr().err

    def unnamed(argv: list[str] | None) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")  # a write to an open file names none

    with pytest.raises(SystemExit) as stop:
        run_cli(unnamed, [])
    assert stop.value.code == SAVE_FAILED_EXIT_CODE
    assert "error: not enough disk space for an output of this stage, which the error does not name" in (
        capsys.readouterr().err
    )

    def other_error(argv: list[str] | None) -> None:
        raise OSError(errno.EACCES, "Permission denied", str(target))

    with pytest.raises(PermissionError):
        run_cli(other_error, [])


def test_free_bytes_of_a_path_not_made_yet_is_its_filesystems(tmp_path):
    assert disk_full.free_bytes(tmp_path / "not" / "yet") == disk_full.free_bytes(tmp_path)
    assert disk_full.free_bytes(Path("relative-not-made")) > 0
