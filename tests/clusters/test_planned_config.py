"""Jobs run the settings that were planned (pipeline/runtime/cluster.py "Planned config").

A cluster job starts Snakemake again with the config files by path (Snakemake 9.27, snakemake/spawn_jobs.py:
``--configfiles ... --mode remote``). The first test runs such a job command as the Slurm jobstep does, after the
config was edited: without the controller's record it runs with the edited settings (the mechanism); with it, it
exits 2 naming the file. The Slurm test does it end to end: the controller submits, the config is edited while the
job waits to start, and the job refuses.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.runtime.cluster import PLANNED_CONFIG_VARIABLE, config_file_digests
from tests.shared_studies import CI_CONFIG, REPO

from .test_slurm import Cluster, scontrol_job, slurm

__all__ = ["slurm"]  # test_slurm.py's cluster fixture, re-exported so that pytest finds it in this module

BENCHMARK = "arith_add"
PROFILE = REPO / "profiles" / "slurm"
SUBMITTED = re.compile(r"has been submitted with SLURM jobid (\d+) \(log: (\S*/slurm_logs/\S*)\)")


def study_config(tmp_path: Path) -> Path:
    """ci.yaml in the study directory (the file a user would edit)."""
    config = tmp_path / "study.yaml"
    shutil.copy(CI_CONFIG, config)
    return config


def edit_benchmark_count(config: Path, count: int) -> None:
    settings = yaml.safe_load(config.read_text())
    settings["benchmarks"][BENCHMARK]["generated"]["count"] = count
    config.write_text(yaml.safe_dump(settings))


def job_command(workdir: Path, config: Path) -> list[str]:
    """The job part of what Snakemake 9.27 spawns for one prepare_benchmarks job (spawn_jobs.py)."""
    return [
        sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
        "--target-jobs", f"prepare_benchmarks:benchmark={BENCHMARK}", "--allowed-rules", "prepare_benchmarks",
        "--cores", "1", "--force", "--nolock", "--configfiles", str(config), "--mode", "remote",
    ]  # fmt: skip


def test_a_job_reads_the_edited_config_unless_the_controller_recorded_it(tmp_path: Path) -> None:
    config = study_config(tmp_path)
    planned = config_file_digests([str(config)])  # what the controller puts in the environment
    edit_benchmark_count(config, 5)  # planned with 12 items

    unguarded = subprocess.run(job_command(tmp_path, config), capture_output=True, text=True, timeout=600)
    assert unguarded.returncode == 0, unguarded.stderr[-3000:]
    assert len((tmp_path / "eval_data" / f"{BENCHMARK}.jsonl").read_text().splitlines()) == 5  # the edited setting

    guarded = subprocess.run(
        job_command(tmp_path, config),
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, PLANNED_CONFIG_VARIABLE: planned},
    )
    assert guarded.returncode == 2, guarded.stderr[-3000:]
    assert f"config file changed since the study was planned: {config}" in guarded.stderr


def test_the_controller_records_its_config_files(tmp_path: Path) -> None:
    """The planning Snakemake (default mode) records the digest of every config file it read, and a job of an
    unedited config runs."""
    config = study_config(tmp_path)
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os, runpy, sys\n"
        "from snakemake.cli import main\n"
        f"sys.argv = ['snakemake', '--snakefile', {str(REPO / 'Snakefile')!r}, '--directory', {str(tmp_path)!r},"
        f" '--configfile', {str(config)!r}, '-n', '--quiet']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print(os.environ[{PLANNED_CONFIG_VARIABLE!r}])\n"
    )
    result = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    recorded = json.loads(result.stdout.strip().splitlines()[-1])
    assert recorded == json.loads(config_file_digests([str(config)]))


@pytest.mark.slurm
def test_a_slurm_job_of_an_edited_config_refuses(slurm: Cluster, tmp_path: Path) -> None:
    """End to end on the local Slurm: the controller plans and submits one prepare_benchmarks job, held in the
    queue (`sbatch --hold`) while the config is edited; once released, the job refuses with exit 2 naming the file
    and writes nothing."""
    config = study_config(tmp_path)
    settings = yaml.safe_load(config.read_text())
    settings["benchmarks"] = {BENCHMARK: settings["benchmarks"][BENCHMARK]}
    settings["resources"] = {"prepare_benchmarks": {"cpus": 1, "slurm_extra": "--hold"}}
    config.write_text(yaml.safe_dump(settings))
    controller_command = [
        sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--configfile", str(config),
        "--profile", str(PROFILE), "--slurm-no-account", *slurm.status_options(), "--retries", "0",
        "--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "2",
        "--until", "prepare_benchmarks",
    ]  # fmt: skip
    controller_log = tmp_path / "controller.log"
    with controller_log.open("w") as log:
        controller = subprocess.Popen(controller_command, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not (submitted := SUBMITTED.search(controller_log.read_text())):
            assert controller.poll() is None and time.monotonic() < deadline, controller_log.read_text()[-3000:]
            time.sleep(0.2)
        job_id, job_log = submitted.groups()
        edit_benchmark_count(config, 5)  # while the job waits in the queue
        subprocess.run(["scontrol", "release", job_id], check=True, timeout=30)
        controller.wait(timeout=300)
    finally:
        controller.kill()
    assert controller.returncode != 0, controller_log.read_text()[-3000:]
    assert scontrol_job(job_id).get("ExitCode") == "2:0", scontrol_job(job_id)
    log_text = (tmp_path / job_log).read_text()
    assert f"config file changed since the study was planned: {config}" in log_text, log_text[-3000:]
    assert not (tmp_path / "eval_data" / f"{BENCHMARK}.jsonl").exists()
