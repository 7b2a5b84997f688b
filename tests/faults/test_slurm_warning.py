"""Slurm's time-limit warning through the Slurm profile, on the real local cluster.

configs/paper.yaml gives training `slurm_extra: --signal=USR1@600`: ten minutes before the time limit Slurm sends
SIGUSR1 to every process of the job's steps, which under `--profile profiles/slurm` are the Snakemake that the
jobstep executor starts with `srun`, the rule's shell, the launcher and the training stage. Only the training stage
may act on it (checkpoint, exit 75); every layer above must survive it, or the step dies with status 138 while the
checkpoint is still being written (on a cluster that tracks processes by cgroup, the stage is killed with it).

`scancel --signal=USR1 JOB` sends exactly that signal (all steps, not the batch shell) while the training job holds
after checkpoint-2 (tests/hold_stage). Snakemake must then see the stage's exit 75, retry the job (the profile's
`retries`), and the retry must resume from the step-3 checkpoint that the warning produced.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from fault_support import REPO, RUN, checkpoint_steps, small_study, stage_env, wait_until, write_study
from test_slurm_requeue import slurm_answers

from tests.hold_stage import hold_training_env

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.skipif(not slurm_answers(), reason="no Slurm cluster answers `sinfo` (start it: .ci/run)"),
]

PROFILE = REPO / "profiles" / "slurm"
TRAIN_LOG = "results/logs/train/tiny/grpo/seed0.log"
SUBMITTED_TRAIN_JOB = re.compile(r"has been submitted with SLURM jobid (\d+) \(log: (\S*/slurm_logs/rule_train/\S*)\)")


def accounting() -> bool:
    probe = subprocess.run(["sacct", "-n", "-X", "-j", "1"], capture_output=True, text=True, timeout=15)
    return probe.returncode == 0


def test_warning_to_every_step_checkpoints_and_the_retry_resumes(tmp_path: Path) -> None:
    config = small_study()
    config["resources"] = {"default": {"cpus": 1, "mem_mb": 1000, "runtime": 10}}
    study = tmp_path / "study"
    write_study(study, config)
    output = study / "snakemake.out"
    command = [
        sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(study),
        "--configfile", str(study / "config.yaml"), "--profile", str(PROFILE), "--slurm-no-account",
        "--slurm-status-command", "sacct" if accounting() else "squeue",
        "--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "2",
        f"{RUN}/metrics.jsonl",
    ]  # fmt: skip
    with open(output, "w", encoding="utf-8") as log:
        snakemake = subprocess.Popen(
            command, cwd=study, env=stage_env(**hold_training_env(2)), stdout=log, stderr=subprocess.STDOUT
        )
        try:
            wait_until(lambda: 2 in checkpoint_steps(study / RUN), "checkpoint-2", snakemake, timeout=400)
            job_id, first_log = SUBMITTED_TRAIN_JOB.findall(output.read_text(encoding="utf-8"))[0]
            subprocess.run(["scancel", "--signal=USR1", job_id], check=True, timeout=30)
            assert snakemake.wait(timeout=600) == 0, output.read_text(encoding="utf-8")[-5000:]
        finally:
            if snakemake.poll() is None:
                snakemake.kill()
            subprocess.run(["scancel", "--name", "grail*", "--user", "root"], check=False, timeout=30)

    text = output.read_text(encoding="utf-8")
    train_jobs = SUBMITTED_TRAIN_JOB.findall(text)
    assert len(train_jobs) == 2, text[-5000:]  # the warned job, then its retry
    warned = Path(first_log).read_text(encoding="utf-8") if Path(first_log).is_absolute() else ""
    warned = warned or (study / first_log).read_text(encoding="utf-8")
    # The jobstep's Snakemake survived the warning and reported the stage's own exit status.
    assert "User defined signal 1" not in warned, warned[-3000:]
    assert "exit status 75" in warned, warned[-3000:]
    assert 3 in checkpoint_steps(study / RUN)
    assert f"resuming from {RUN}/checkpoints/checkpoint-3 (step 3)" in (study / TRAIN_LOG).read_text(encoding="utf-8")
    assert (study / RUN / "final" / "model.safetensors").is_file()
