"""``importlib.metadata.packages_distributions`` scanned once per process (pipeline/core/distributions.py)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core import distributions

REPO = Path(__file__).resolve().parents[2]


def test_the_scan_runs_once_and_every_caller_gets_its_own_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    scans: list[int] = []

    def counting_scan() -> dict[str, list[str]]:
        scans.append(1)
        return {"yaml": ["PyYAML"]}

    monkeypatch.setattr(distributions, "_ORIGINAL", counting_scan)
    distributions._scanned_once.cache_clear()
    try:
        first = distributions.packages_distributions()
        first["yaml"].append("changed by a caller")
        assert distributions.packages_distributions() == {"yaml": ["PyYAML"]}
        assert len(scans) == 1
    finally:  # the worker's later callers get the real scan, whether this test passed or not
        distributions._scanned_once.cache_clear()


def test_a_stage_process_answers_as_the_standard_library_does() -> None:
    """Importing the package swaps the function in before any stage imports transformers or TRL; the answer is
    the standard library's."""
    script = (
        "import importlib.metadata as m; expected = m.packages_distributions(); import pipeline; "
        "from pipeline.core.distributions import packages_distributions; "
        "assert m.packages_distributions is packages_distributions; "
        "assert m.packages_distributions() == expected"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert importlib.metadata.packages_distributions is distributions.packages_distributions
