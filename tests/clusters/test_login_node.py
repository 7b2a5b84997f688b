"""A light login node (issue 53): planning, the preflight, `pin_revisions`, `power` and Snakemake's controller run
on the login-node install (`pip install -e '.[slurm]'`, docs/cluster.md), which has no torch. Every Python process
they start (the preflight's dry run is Snakemake's own command line, `snakemake -n`, on the paper study through the
Slurm profile) records at its exit which heavy packages it imported (login_probe/sitecustomize.py); none may
import torch, transformers, TRL, accelerate, DeepSpeed or vLLM."""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from pathlib import Path

import pytest

from pipeline.clusters import software
from pipeline.study import cost

from .conftest import REPO, run_command, study

PAPER = REPO / "configs" / "paper.yaml"
PROBE = Path(__file__).resolve().parent / "login_probe"


def test_planning_and_the_preflight_import_no_torch(tmp_path: Path) -> None:
    """Broken by `import torch` at the top of pipeline/runtime/disk_space.py (the cost estimate's checkpoint size)
    or of pipeline/credit/method.py (the config validation loads the credit methods): torch in every process."""
    records = tmp_path / "imports"
    records.mkdir()
    env = {**os.environ, "PYTHONPATH": str(PROBE), "LOGIN_PROBE_DIR": str(records)}
    commands = [
        # no Slurm is needed: without a scheduler the preflight still plans, estimates and checks the study
        ["-m", "pipeline.preflight", "--profile", "profiles/slurm", "--configfile", str(PAPER), "--no-compute-job"],
        ["-m", "pipeline.pin_revisions", "--configfile", str(PAPER)],
        ["-m", "pipeline.power", "--configfile", str(PAPER), "--replications", "100", "--no-cost"],
    ]
    for command in commands:
        result = run_command([sys.executable, *command], cwd=REPO, timeout=300, env=env)
        assert "Traceback" not in result.stdout, result.stdout[-3000:]
    processes = [json.loads(path.read_text()) for path in records.glob("*.json")]
    dry_runs = [p for p in processes if p["argv"][0].endswith("pipeline/study/dry_run.py") and "-n" in p["argv"]]
    assert len(dry_runs) == 1, processes  # the preflight's `snakemake -n`: Snakemake's own command line
    assert len(processes) >= len(commands) + 1
    assert [p for p in processes if p["imported"]] == []


def test_the_software_check_names_the_image_where_torch_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the login-node install the jobs' software is the image's: the check says so instead of a traceback."""
    version = importlib.metadata.version

    def without_torch(name: str) -> str:
        if name == "torch":
            raise importlib.metadata.PackageNotFoundError(name)
        return version(name)

    monkeypatch.setattr(importlib.metadata, "version", without_torch)
    paper = study(PAPER)
    job = cost.PlannedJob(rule="train", wildcards={}, gpus=4)
    check = software.local_software_check(paper, [job])
    assert check.status == "fail"
    assert "torch is not installed" in check.detail
    assert "--sdm apptainer" in check.fix
