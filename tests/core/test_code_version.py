"""The one helper that says which checkout and machine made an output (report, calibration, recorded numbers)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from pipeline.core.provenance import CodeVersion, code_version, hardware


def git(directory: Path, *arguments: str) -> str:
    return subprocess.run(["git", "-C", str(directory), *arguments], capture_output=True, text=True, check=True).stdout


def test_a_checkouts_commit_and_its_uncommitted_changes(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    (tmp_path / "tracked.txt").write_text("one", encoding="utf-8")
    git(tmp_path, "add", "tracked.txt")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = git(tmp_path, "rev-parse", "HEAD").strip()
    (tmp_path / "untracked.txt").write_text("not part of the code", encoding="utf-8")
    assert code_version(tmp_path) == CodeVersion(head, dirty=False)
    (tmp_path / "tracked.txt").write_text("two", encoding="utf-8")
    version = code_version(tmp_path)
    assert version == CodeVersion(head, dirty=True)
    assert version.label() == f"{head}+dirty" and version.label(short=True) == f"{head[:7]}+dirty"


def test_outside_a_checkout_the_commit_is_unknown(tmp_path: Path) -> None:
    version = code_version(tmp_path)
    assert version == CodeVersion(None, None) and version.label() == "unknown"


def test_hardware_names_the_cpu_and_counts_what_torch_sees() -> None:
    import torch

    record = hardware()
    assert record["cpu"] and record["cpus"] >= 1 and record["torch"] == torch.__version__
    assert len(record["gpus"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
