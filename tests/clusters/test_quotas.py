"""The preflight's quota check (pipeline.runtime.quotas): the user's, group's and Lustre project's quota read with
the site's tools, `quota` (Linux quota tools) and `lfs quota` (Lustre), here stand-ins on PATH that print those
tools' rows; SKIPPED with the reason where no tool is there."""

from __future__ import annotations

from pathlib import Path

from pipeline.clusters import disk
from pipeline.runtime import quotas

GIB = 1 << 30
# `quota -w -u alice`: 4 GiB used (over the soft limit: `*`), soft 4,000,000 KiB, hard 5,000,000 KiB
QUOTA_USER = """Disk quotas for user alice (uid 1000):
     Filesystem  blocks   quota   limit   grace   files   quota   limit   grace
      /dev/sdb1 4194304* 4000000 5000000   6days    1024       0       0
"""
QUOTA_NONE = "Disk quotas for group lab (gid 100): none\n"
# `lfs quota -q -g lab /lustre/scratch01`: a long filesystem name stands on its own line
LFS_GROUP = """/lustre/scratch01
                1048576       0 2147483648       -    2048       0       0       -
"""


def tool(directory: Path, name: str, outputs: dict[str, str]) -> None:
    """A stand-in NAME on PATH that prints ``outputs[FLAG]`` when called with FLAG (-u, -g, -p, -d)."""
    cases = "".join(f"  *' {flag} '*) cat <<'EOF'\n{output}EOF\n  ;;\n" for flag, output in outputs.items())
    (directory / name).write_text(f'#!/bin/sh\ncase " $* " in\n{cases}esac\n')
    (directory / name).chmod(0o755)


def test_rows_of_both_tools_give_used_and_the_lower_limit() -> None:
    assert quotas.parse_quota(QUOTA_USER) == (4194304 * 1024, 4000000 * 1024)
    assert quotas.parse_quota(LFS_GROUP) == (1048576 * 1024, 2147483648 * 1024)
    assert quotas.parse_quota(QUOTA_NONE) is None
    assert quotas.parse_quota("/dev/sdb1 12 0 0 - 1 0 0 -\n") is None  # no limit set


def test_the_check_fails_an_owner_whose_quota_cannot_hold_the_study(tmp_path: Path, monkeypatch) -> None:
    """Broken by comparing the free disk only (no quota read): the 3.8 GiB study passes on a 0.0 GiB quota left."""
    tool(tmp_path, "quota", {"-u": QUOTA_USER, "-g": QUOTA_NONE})
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    check = disk.quota_check(tmp_path / "results", needed=GIB)
    assert check.status == "fail" and check.detail.startswith("user "), check
    assert "4.0 of 3.8 GiB used" in check.detail and "lower save_total_limit" in check.fix


def test_lustre_reads_user_group_and_project(tmp_path: Path, monkeypatch) -> None:
    tool(tmp_path, "lfs", {"-d": f"7 P {tmp_path}\n", "-g": LFS_GROUP, "-u": "/lustre/scratch01 0 0 0 - 0 0 0 -\n"})
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setattr(quotas, "mount_of", lambda path: (Path("/lustre/scratch01"), "lustre"))
    commands = quotas.quota_commands(tmp_path)
    assert [owner.split()[0] for owner, _ in commands] == ["user", "group", "project"]
    assert commands[1][1][:4] == ["lfs", "quota", "-q", "-g"] and commands[1][1][-1] == "/lustre/scratch01"
    check = disk.quota_check(tmp_path, needed=GIB)
    assert check.status == "pass" and "1.0 of 2048.0 GiB used" in check.detail, check


def test_without_a_tool_the_check_is_skipped_with_the_reason(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    check = disk.quota_check(tmp_path / "results", needed=GIB)
    assert check.status == "skipped" and "`quota`" in check.detail and "`lfs`" in check.detail
