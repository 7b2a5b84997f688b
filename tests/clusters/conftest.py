"""Shared helpers of the cluster tests: paths, a command runner that reports its wall time, config loading."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TINY_WORKFLOW = Path(__file__).resolve().parent / "workflow" / "Snakefile"


def run_command(
    command: list[str], *, cwd: Path, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``command``, print its wall time (pytest -s / the CI log), return stdout+stderr as ``stdout``."""
    start = time.monotonic()
    result = subprocess.run(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
    )
    print(f"[{time.monotonic() - start:6.1f} s] {' '.join(command[:4])} ... (exit {result.returncode})")
    return result


def study(config_path: Path) -> Any:
    """The project's Study for a config file, loaded as the Snakefile loads it (pipeline.study.load)."""
    from pipeline.study.load import load_study

    return load_study([config_path])
