"""Studies and artifacts that several tests read, built once per test run whichever pytest-xdist worker asks first.

The controller (or a run without xdist) makes one directory for the run (``GRAIL_TEST_RUN_DIR``, inherited by the
workers, removed when the run ends: tests/conftest.py); ``shared_artifact`` builds a named artifact there under a file
lock while any other worker that needs it waits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

REPO = Path(__file__).resolve().parents[1]
RUN_DIR_VARIABLE = "GRAIL_TEST_RUN_DIR"
CI_CONFIG = REPO / "tests" / "pipeline" / "configs" / "ci.yaml"
PLUGIN_CONFIG = CI_CONFIG.with_name("ci_plugin.yaml")  # adds docs/examples/halfway.py as `examples.halfway`
CI_CONFIG_FILES = ("--configfile", str(CI_CONFIG), str(PLUGIN_CONFIG))
EXAMPLES_DIR = REPO / "docs"
# pipeline.core.kernels.KERNEL_PIN_VARIABLE, written out: importing the package would pin this process (tests/conftest.py
# keeps the test processes native; tests/core/test_kernels.py holds the two names together)
KERNEL_PIN_VARIABLE = "GRAIL_KERNEL_PIN"
# A stage a test runs by hand runs on the kernel path a study's jobs run on (`kernel_pin`, default on), so that its
# numbers can be compared with a study's.
# The thread count is part of the path: the study's jobs run on `cpus` threads (1 in the CI study; Snakemake exports
# OMP_NUM_THREADS and MKL_NUM_THREADS), and reductions split across threads sum in another order.
STUDY_KERNELS = {KERNEL_PIN_VARIABLE: "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def shared_artifact(name: str, build: Callable[[Path], None]) -> Path:
    """``RUN_DIR/name``, built once per test run by ``build(directory)`` whichever xdist worker asks first; the
    other waits on the lock. A failed build is recorded, and every later request fails with its error at once
    instead of building it again."""
    root = Path(os.environ[RUN_DIR_VARIABLE])
    directory, finished, failed = root / name, root / f"{name}.finished", root / f"{name}.failed"
    with FileLock(str(root / f"{name}.lock")):
        if failed.exists():
            pytest.fail(f"shared {name} failed to build earlier in this run:\n{failed.read_text()}")
        if not finished.exists():
            directory.mkdir()
            try:
                build(directory)
            except BaseException as error:
                failed.write_text(str(error)[-8000:])
                raise
            finished.touch()
    return directory


def with_examples(*paths: Path) -> dict[str, str]:
    """The environment of a study's job: ``paths`` and docs/ (where ``examples.halfway`` lives) on PYTHONPATH, the
    study's kernel path."""
    entries = [*map(str, paths), str(EXAMPLES_DIR), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(entry for entry in entries if entry), **STUDY_KERNELS}


def run_ci_study(directory: Path) -> None:
    """Every rule of the CI study (ci.yaml with ci_plugin.yaml's out-of-tree method) in ``directory``."""
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(directory)]
    started = time.monotonic()
    result = subprocess.run(
        [*command, "--cores", "2", *CI_CONFIG_FILES], capture_output=True, text=True, timeout=3600, env=with_examples()
    )
    print(f"CI study: {time.monotonic() - started:.0f} s wall")
    assert result.returncode == 0, result.stderr[-5000:]
