"""`--profile profiles/slurm` against a real single-node Slurm (started by .ci/run with
scripts/slurm-single-node.sh; one fake GPU). Jobs go through the real sbatch, slurmctld and slurmd; the test
reads the scheduler's own records (scontrol, and sacct when slurmdbd runs) to check what each job asked for.
Each Slurm job costs 12-15 s of status polling, so the DAGs here are small.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

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


RECORDING_SBATCH = """#!/bin/sh
printf '%s\\n' "$*" >> "$SBATCH_RECORD"
exec {sbatch} "$@"
"""


def test_site_slurm_extra_reaches_sbatch_beside_the_study_flags(tmp_path: Path, slurm: Cluster) -> None:
    """One job of the project's Snakefile, submitted for real: the site's `--exclusive` (profiles/slurm SITE
    SETTINGS, here `--set-resources`) is added to the study's `--signal=USR1@600`, not put in its place."""
    config = yaml.safe_load((REPO / "configs" / "default.yaml").read_text())
    config["resources"]["prepare_benchmarks"] = {"slurm_extra": "--signal=USR1@600"}  # as paper.yaml's training
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(RECORDING_SBATCH.format(sbatch=shutil.which("sbatch")))
    (bin_dir / "sbatch").chmod(0o755)
    record = tmp_path / "sbatch.txt"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SBATCH_RECORD": str(record)}
    command = ["snakemake", "--profile", str(PROFILE), "--snakefile", str(REPO / "Snakefile")]
    command += ["--configfile", "config.yaml", "--set-resources", "prepare_benchmarks:slurm_extra='--exclusive'"]
    command += [*slurm.status_options(), "--slurm-init-seconds-before-status-checks", "1"]
    command += ["--seconds-between-status-checks", "2", "--", "eval_data/arith_add_hard.jsonl"]
    result = run_command(command, cwd=tmp_path, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-5000:]
    assert (tmp_path / "eval_data" / "arith_add_hard.jsonl").exists()

    (submission,) = record.read_text().splitlines()
    flags = shlex.split(submission.split(" --wrap=", 1)[0])
    assert "--signal=USR1@600" in flags and "--exclusive" in flags, submission
    job_id = re.search(r"Submitted batch job (\d+)|SLURM jobid (\d+)", result.stdout)
    assert job_id, result.stdout[-3000:]
    job = scontrol_job(next(group for group in job_id.groups() if group))
    assert job["OverSubscribe"] == "NO"  # --exclusive reached the scheduler
    assert job["JobState"] == "COMPLETED"
