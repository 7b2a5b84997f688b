"""`--profile profiles/slurm` against a real single-node Slurm (started by .ci/run with
scripts/slurm-single-node.sh; one fake GPU). Jobs go through the real sbatch, slurmctld and slurmd; the test
reads the scheduler's own records (scontrol, and sacct when slurmdbd runs) to check what each job asked for.
Each Slurm job costs 12-15 s of status polling, so the DAGs here are small.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import REPO, TINY_WORKFLOW, run_command

PROFILE = REPO / "profiles" / "slurm"
pytestmark = pytest.mark.slurm


@dataclass(frozen=True)
class Cluster:
    accounting: bool

    def status_options(self) -> list[str]:
        """sacct needs slurmdbd; without it the plugin must poll squeue (MinJobAge keeps finished jobs listed)."""
        return ["--slurm-status-command", "sacct" if self.accounting else "squeue"]


@pytest.fixture(scope="module")
def slurm() -> Cluster:
    if shutil.which("sinfo") is None:
        pytest.skip("Slurm is not installed; .ci/run starts it with scripts/slurm-single-node.sh")
    try:
        states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        pytest.skip("sinfo did not answer within 15 s: slurmctld is not responding")
    if states.returncode != 0 or not {"idle", "mixed", "allocated"} & set(states.stdout.split()):
        pytest.skip(f"no Slurm node is up (start it with scripts/slurm-single-node.sh): {states.stderr.strip()}")
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=15).stdout
    return Cluster(accounting="accounting_storage/slurmdbd" in config)


def scontrol_job(job_id: str) -> dict[str, str]:
    """`scontrol show job -o` as key -> value (finished jobs stay listed for MinJobAge seconds)."""
    line = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=15).stdout
    return dict(re.findall(r"(\w[\w:/]*)=(\S*)", line))


def sacct_job(job_id: str) -> dict[str, str]:
    fields = ["ReqTRES", "Timelimit", "State", "ExitCode"]
    output = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", ",".join(fields)], capture_output=True, text=True, timeout=15
    ).stdout
    return dict(zip(fields, output.strip().split("|"), strict=True))


def tres(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split(",") if "=" in item)


def test_tiny_dag_goes_through_sbatch_with_the_requested_resources(tmp_path: Path, slurm: Cluster) -> None:
    (tmp_path / "config.yaml").write_text("{}\n")
    command = ["snakemake", "--profile", str(PROFILE), "--snakefile", str(TINY_WORKFLOW), "--configfile", "config.yaml"]
    command += [*slurm.status_options(), "--slurm-init-seconds-before-status-checks", "1"]
    command += ["--seconds-between-status-checks", "2"]
    result = run_command(command, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout[-5000:]

    gpu_record = json.loads((tmp_path / "out" / "gpu_step.json").read_text())
    (cpu_record,) = gpu_record["inputs"]
    assert cpu_record["slurm_job_id"] and gpu_record["slurm_job_id"]
    assert cpu_record["slurm_job_id"] != gpu_record["slurm_job_id"]  # two sbatch jobs
    assert gpu_record["cuda_visible_devices"] == "0"  # slurmd bound the (fake) GPU to the job
    assert cpu_record["cuda_visible_devices"] is None

    wanted = {  # tests/clusters/workflow/Snakefile
        "cpu_step": {"cpus": "2", "mem": "600M", "time": "00:03:00", "gpu": None},
        "gpu_step": {"cpus": "1", "mem": "500M", "time": "00:02:00", "gpu": "1"},
    }
    for rule, record in (("cpu_step", cpu_record), ("gpu_step", gpu_record)):
        job = scontrol_job(record["slurm_job_id"])
        expected = wanted[rule]
        assert job["Comment"] == f"rule_{rule}"
        assert job["JobState"] == "COMPLETED"
        assert job["Requeue"] == "1"  # profile: slurm-requeue
        assert job["TimeLimit"] == expected["time"]
        allocated = tres(job["TRES"])
        assert (allocated["cpu"], allocated["mem"]) == (expected["cpus"], expected["mem"])
        assert allocated.get("gres/gpu") == expected["gpu"]
        if slurm.accounting:
            accounted = sacct_job(record["slurm_job_id"])
            requested = tres(accounted["ReqTRES"])
            assert (requested["cpu"], requested["mem"], requested.get("gres/gpu")) == (
                expected["cpus"],
                expected["mem"],
                expected["gpu"],
            )
            assert (accounted["Timelimit"], accounted["State"], accounted["ExitCode"]) == (
                expected["time"],
                "COMPLETED",
                "0:0",
            )
