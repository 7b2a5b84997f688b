"""Fixtures shared by the fault tests that run Snakemake on the small study (fault_support.write_study)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fault_support import BENCHMARK, run_snakemake, snakemake_output, write_study


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch working directory with the small study's data, benchmark and warmed-up start model built."""
    workdir = tmp_path_factory.mktemp("study")
    write_study(workdir)
    status = run_snakemake(workdir, "results/models/tiny/start", BENCHMARK)
    assert status == 0, snakemake_output(workdir)[-5000:]
    return workdir
