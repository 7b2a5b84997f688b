"""The compute-node test job of the preflight judges the GPU stack and the hub cache where the jobs run: nvidia-smi's
driver version and compute capability against the floor of the image's CUDA 13.0 (pipeline.runtime.gpu_floor), and
whether the hub cache the preflight checked is readable there. A fake `nvidia-smi` on PATH prints nvidia-smi's own
CSV (`--query-gpu=driver_version,compute_cap,name --format=csv,noheader`); the test job is a real job of the local
Slurm (its environment, PATH included, is the submitter's: sbatch's default)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from pipeline.clusters import compute_job
from pipeline.runtime import gpu_floor
from pipeline.study import cost

from .test_site_slurm import site_scheduler

H100_NODE = "580.95.05, 9.0, NVIDIA H100 80GB HBM3\n" * 4
V100_NODE = "535.104.05, 7.0, Tesla V100-SXM2-32GB\n535.104.05, 7.0, Tesla V100-SXM2-32GB\n"
NO_DRIVER = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"


def test_the_floor_passes_a_current_node_and_names_what_an_old_one_lacks() -> None:
    """Broken by comparing the versions as text ("535" > "1000") or dropping the compute-capability test: the V100
    node passes."""
    assert gpu_floor.gpu_stack_problems(gpu_floor.parse_gpu_query(H100_NODE)) == []
    assert gpu_floor.describe(gpu_floor.parse_gpu_query(H100_NODE)) == (
        "4x NVIDIA H100 80GB HBM3 (compute capability 9.0), driver 580.95.05"
    )
    assert gpu_floor.gpu_stack_problems(gpu_floor.parse_gpu_query(V100_NODE)) == [
        "driver 535.104.05 is older than 580.65.06",
        "Tesla V100-SXM2-32GB has compute capability 7.0",
    ]
    assert gpu_floor.gpu_stack_problems([gpu_floor.NodeGpu("1000.1", "12.0", "next")]) == []
    with pytest.raises(ValueError, match=r"not a GPU row: .NVIDIA-SMI has failed"):
        gpu_floor.parse_gpu_query(NO_DRIVER)


def test_the_node_check_fails_naming_the_floor() -> None:
    check = compute_job.gpu_stack_check("7", V100_NODE)
    assert check.status == "fail" and "driver >= 580.65.06 and compute capability >= 7.5" in check.detail
    assert "CUDA 12" in check.fix
    assert compute_job.gpu_stack_check("7", NO_DRIVER).status == "fail"
    assert compute_job.gpu_stack_check("7", "nvidia-smi is not on PATH\n").status == "fail"
    assert compute_job.gpu_stack_check("7", H100_NODE).status == "pass"


@pytest.mark.slurm
def test_the_test_job_reports_the_node_gpus_and_the_hub_cache(tmp_path: Path, monkeypatch) -> None:
    """One real test job on the site-shaped scheduler, asking for a GPU as training does, with a fake nvidia-smi of
    an old node on PATH and a readable hub cache. Broken by not running the GPU query in the job: the GPU check
    reads no file; by testing the hub path on this side only: an unreadable one passes."""
    if reason := site_scheduler():
        pytest.skip(reason)
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(
        f"#!/bin/sh\n[ \"$*\" = '{gpu_floor.GPU_QUERY.split(' ', 1)[1]}' ] || exit 6\nprintf '{V100_NODE}'\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    hub, unreadable = tmp_path / "hub", tmp_path / "missing-hub"
    hub.mkdir()
    train = cost.PlannedJob("train", gpus=4, gpu_model="a100", resources={"slurm_partition": "gpu"})
    # the site's SITE SETTINGS as the profile holds them: the test job asks for its node with all of them
    site = {
        "default-resources": {"slurm_account": "grail-lab", "slurm_partition": "cpu"},
        "slurm-qos": "grail-gpu",
        "slurm-reservation": "grail-resv",
    }
    flags = compute_job.compute_job_site_flags(site, train)
    assert flags == ["-p", "gpu", "-A", "grail-lab", "--qos", "grail-gpu", "--reservation", "grail-resv"]
    checks = compute_job.compute_job_checks(tmp_path / "results", site, train, hub, compute_job.COMPUTE_JOB_SECONDS)
    assert [(check.name, check.status) for check in checks] == [
        (compute_job.COMPUTE_JOB, "pass"),
        (compute_job.COMPUTE_GPU, "fail"),
        (compute_job.COMPUTE_HUB, "pass"),
    ], checks
    assert "2x Tesla V100-SXM2-32GB (compute capability 7.0), driver 535.104.05" in checks[1].detail
    assert not (tmp_path / "results" / ".preflight").exists()  # the token and the reports are cleaned up
    checks = compute_job.compute_job_checks(
        tmp_path / "results", site, None, unreadable, compute_job.COMPUTE_JOB_SECONDS
    )
    assert [(check.name, check.status) for check in checks] == [
        (compute_job.COMPUTE_JOB, "pass"),
        (compute_job.COMPUTE_GPU, "skipped"),
        (compute_job.COMPUTE_HUB, "fail"),
    ], checks


def test_the_test_job_names_a_refused_site_flag_and_a_job_still_queued(tmp_path: Path) -> None:
    """A reservation the scheduler does not know: sbatch refuses, and the check names the flags it was given. A job
    that cannot start within the wait (held here) is skipped with Slurm's reason, not failed. Broken by leaving the
    reservation out of the test job's flags: it passed."""
    if reason := site_scheduler():
        pytest.skip(reason)
    wrong = {"default-resources": {"slurm_account": "grail-lab"}, "slurm-reservation": "no-such-reservation"}
    refused = compute_job.compute_job_checks(tmp_path / "results", wrong, None, None, compute_job.COMPUTE_JOB_SECONDS)[
        0
    ]
    assert refused.status == "fail" and "--reservation no-such-reservation" in refused.detail, refused
    held = subprocess.run(
        ["sbatch", "--parsable", "--hold", "-A", "grail-lab", "-o", "/dev/null", "--wrap", "true"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    try:
        queued = compute_job.await_token(held, tmp_path / "token", "token", wait=2)
    finally:
        subprocess.run(["scancel", held], check=False)
    assert queued.status == "skipped" and "still queued after 2 s (Slurm's reason: JobHeldUser)" in queued.detail
