"""Disk quotas on the results directory's filesystem, read with the site's own tools where they exist.

A cluster's shared filesystems limit each user, group or project (Lustre's ``lfs quota``; the Linux quota tools'
``quota`` for NFS and local filesystems), and a quota runs out long before the disk does: free space alone says
nothing of it. The tool is chosen by the filesystem's type (``/proc/self/mounts``): ``lfs`` on Lustre, ``quota``
elsewhere. Both print a row of the filesystem, then the space used, its soft limit and its hard limit in KiB (``*``
after a figure over its limit; a long filesystem name may stand on a line of its own), then grace and files.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

QUOTA_TIMEOUT_S = 20
KIB = 1024


@dataclass(frozen=True)
class Quota:
    """One owner's quota on a filesystem: space used and the lower of its nonzero limits, in bytes."""

    owner: str
    used: int
    limit: int


def parse_quota(text: str) -> tuple[int, int] | None:
    """(used, limit) in bytes from ``lfs quota -q`` or ``quota -w`` output (module docstring); None when it has
    no row (``Disk quotas for user x (uid 1): none``) or no limit (0 is none)."""
    rows = [line for line in text.splitlines() if line.strip() and not re.match(r"\s*(Disk quotas|Filesystem)", line)]
    fields = " ".join(rows).split()[1:4]
    if len(fields) < 3 or not all(field.rstrip("*").isdigit() for field in fields):
        return None
    used, soft, hard = (int(field.rstrip("*")) for field in fields)
    limits = [limit for limit in (soft, hard) if limit > 0]
    return (used * KIB, min(limits) * KIB) if limits else None


def mount_of(path: Path) -> tuple[Path, str]:
    """The mount point that holds ``path`` (which exists) and its filesystem type."""
    mount = path.resolve()
    while not os.path.ismount(mount):
        mount = mount.parent
    types = {}
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        types[fields[1].replace("\\040", " ")] = fields[2]
    return mount, types.get(str(mount), "unknown")


def quota_commands(path: Path, which: Callable[[str], str | None] = shutil.which) -> list[tuple[str, list[str]]]:
    """(owner, command) for the user's and the primary group's quota on the filesystem of ``path`` (and, on
    Lustre, the directory's project's), with the tool its type calls for; empty when that tool is not on PATH."""
    mount, fstype = mount_of(path)
    user, group = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
    if fstype == "lustre" and which("lfs"):
        commands = [(f"user {user}", ["lfs", "quota", "-q", "-u", user, str(mount)])]
        commands.append((f"group {group}", ["lfs", "quota", "-q", "-g", group, str(mount)]))
        # `lfs project -d DIR` prints "PROJID FLAG DIR"; 0 is no project
        listed = subprocess.run(["lfs", "project", "-d", str(path)], capture_output=True, text=True, timeout=20)
        project = listed.stdout.split()[:1] if listed.returncode == 0 else []
        if project and project[0] != "0":
            commands.append((f"project {project[0]}", ["lfs", "quota", "-q", "-p", project[0], str(mount)]))
        return commands
    if fstype != "lustre" and which("quota"):
        return [
            (f"user {user}", ["quota", "-w", f"--filesystem={mount}", "-u", user]),
            (f"group {group}", ["quota", "-w", f"--filesystem={mount}", "-g", group]),
        ]
    return []


def read_quotas(commands: list[tuple[str, list[str]]]) -> tuple[list[Quota], list[str]]:
    """The quotas the commands report (an owner without a limit is left out) and what could not be read. ``quota``
    exits 1 for an owner over a limit, so the output is read whatever the status."""
    quotas, unread = [], []
    for owner, command in commands:
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=QUOTA_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as error:
            unread.append(f"{owner}: {error}")
            continue
        if (found := parse_quota(result.stdout)) is not None:
            quotas.append(Quota(owner, *found))
        elif result.returncode != 0 and result.stderr.strip():
            unread.append(f"{owner}: {result.stderr.strip().splitlines()[-1]}")
    return quotas, unread
