"""Disk and quota: the results directory's filesystem has the free space, and the user's, group's and project's
quota the room, for the study's checkpoints and samples (the cost estimate's disk total); results under $HOME are
warned of. A full disk or quota otherwise stops a study hours in, at its first large checkpoint.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.clusters.check import Check
from pipeline.runtime import quotas
from pipeline.study import cost
from pipeline.training.run_state import SET_ASIDE_DIR

# Where reruns set things aside under a results_dir: a run's stale working directories (pipeline.training.run_state)
# and the study's damaged outputs (pipeline.study.integrity)
SET_ASIDE_GLOBS = (f"runs/*/*/*/{SET_ASIDE_DIR}", SET_ASIDE_DIR)


def set_aside_total(results_dir: Path) -> int:
    """Bytes of everything reruns set aside under ``results_dir`` (``SET_ASIDE_GLOBS``)."""
    return sum(
        path.stat().st_size
        for pattern in SET_ASIDE_GLOBS
        for directory in results_dir.glob(pattern)
        for path in directory.rglob("*")
        if path.is_file() and not path.is_symlink()
    )


def existing_ancestor(path: Path) -> Path:
    """``path``, resolved, or its nearest ancestor that exists (a results directory not made yet)."""
    existing = path.resolve()
    while not existing.exists():
        existing = existing.parent
    return existing


def disk_check(results_dir: Path, needed: int) -> Check:
    """Free space against what the study writes. What reruns set aside (stale checkpoints: pipeline.training.run_state;
    damaged outputs: pipeline.study.integrity) stays until removed: its size is named, and removing it is the first
    remedy offered."""
    existing = existing_ancestor(results_dir)
    free = shutil.disk_usage(existing).free
    kept = set_aside_total(results_dir) if results_dir.is_dir() else 0
    detail = f"{free / cost.GIB:.1f} GiB free at {existing}; the study writes up to {needed / cost.GIB:.1f} GiB"
    if kept:
        detail += f"; {kept / cost.GIB:.1f} GiB are set aside by reruns ({', '.join(SET_ASIDE_GLOBS)})"
    home = Path.home().resolve()
    under_home = existing == home or home in existing.parents
    if under_home:
        # a site's home directories are small, quota-limited and often backed up: no place for TBs of checkpoints
        detail += f"; results_dir is under $HOME ({home})"
    scratch = "point results_dir at the site's scratch or project storage"
    if free < needed:
        fix = f"{scratch} (a larger filesystem) or lower save_total_limit"
        if kept:
            kept_dirs = " ".join(f"{results_dir}/{pattern}" for pattern in SET_ASIDE_GLOBS)
            fix = f"delete what reruns set aside that you do not need (rm -r {kept_dirs}), {fix}"
        return Check("disk", "fail", detail, fix)
    if under_home:
        return Check("disk", "warn", detail, f"{scratch}: home directories have small quotas and are often backed up")
    return Check("disk", "pass", detail)


def quota_check(results_dir: Path, needed: int) -> Check:
    """The user's, group's and (Lustre) project's quota on the results directory's filesystem against what the
    study writes (``pipeline.runtime.quotas``); SKIPPED, with the reason, where no tool reads them."""
    commands = quotas.quota_commands(existing_ancestor(results_dir))
    if not commands:
        reason = "no quota tool for this filesystem on PATH (`lfs` on Lustre, `quota` elsewhere): quotas not read"
        return Check(
            "quota", "skipped", reason, "ask the site's docs for your quota (e.g. `lfs quota -u $USER /scratch`)"
        )
    found, unread = quotas.read_quotas(commands)
    if not found:
        return Check("quota", "skipped", f"no quota read ({'; '.join(unread) or 'no limit set'})")
    lines = [f"{q.owner}: {q.used / cost.GIB:.1f} of {q.limit / cost.GIB:.1f} GiB used" for q in found]
    detail = f"{'; '.join(lines)}; the study writes up to {needed / cost.GIB:.1f} GiB"
    short = [q.owner for q in found if q.limit - q.used < needed]
    if short:
        fix = "ask for a larger quota, point results_dir at project storage, or lower save_total_limit"
        return Check("quota", "fail", f"{' and '.join(short)} cannot hold the study: {detail}", fix)
    return Check("quota", "pass", detail)
