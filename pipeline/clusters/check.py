"""What one preflight check found: its outcome, the finding and the one-line fix, the shape every room of
``pipeline.clusters`` answers in and ``python -m pipeline.preflight`` prints and writes to its --json."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    """One preflight check: its outcome (pass, warn, fail, skipped), what was found, and the one-line fix."""

    name: str
    status: str
    detail: str
    fix: str = ""
