"""`--profile profiles/slurm` on the paper's study: the dry run plans it, and the sbatch command lines of a
training and an evaluation job carry the config's GPU, CPU, memory and time requests.

A dry run does not involve the Slurm executor plugin, so the sbatch lines come from the plugin itself, run for
real against a stand-in `sbatch` that records its command line and refuses the job (and a stand-in `sinfo`
naming the default partition). The refusal also exercises the profile's retries: each attempt is resubmitted
with `attempt x runtime` (training with its own runtime). No Slurm cluster is needed.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from .conftest import REPO, run_command, study

PAPER = REPO / "configs" / "paper.yaml"
PROFILE = REPO / "profiles" / "slurm"

pytestmark = pytest.mark.skipif(
    not (REPO / "Snakefile").exists() or not PAPER.exists(), reason="the project's Snakefile or paper config is missing"
)

STAND_IN_SBATCH = """#!/bin/sh
printf '%s\\n' "$*" >> "$SBATCH_RECORD"
echo "sbatch: error: stand-in sbatch: recorded, not submitted" >&2
exit 1
"""
STAND_IN_SINFO = """#!/bin/sh
printf 'PARTITION\\ngpu*\\n'
"""


def job_stats(dry_run_output: str) -> dict[str, int]:
    """The `Job stats` table of a dry run: rule name -> number of jobs."""
    table = dry_run_output.split("Job stats:", 1)[1].split("\n\n", 1)[0]
    return {name: int(count) for name, count in re.findall(r"^(\w+)\s+(\d+)$", table, flags=re.MULTILINE)}


def sbatch_options(line: str) -> dict[str, str]:
    """Options of one recorded sbatch call before its --wrap'ed command (`-t 600` and `--gpus=4` alike)."""
    tokens = shlex.split(line.split(" --wrap=", 1)[0])
    options: dict[str, str] = {}
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if "=" in token:
            key, value = token.split("=", 1)
            options[key] = value
        elif index + 1 < len(tokens) and not tokens[index + 1].startswith("-"):
            options[token] = tokens[index + 1]
            index += 1
        else:
            options[token] = ""
        index += 1
    return options


def test_dry_run_plans_the_full_paper_study(tmp_path: Path) -> None:
    result = run_command(
        ["snakemake", "-n", "--profile", str(PROFILE), "--directory", str(tmp_path)], cwd=REPO, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:]
    paper = study(PAPER)
    stats = job_stats(result.stdout)
    assert stats["train"] == len(list(paper.runs()))
    rules = [rule for rule, _, _ in paper.evaluation_jobs()]
    assert stats["evaluate"] == rules.count("evaluate") and stats["evaluate_analysed"] == rules.count(
        "evaluate_analysed"
    )
    assert stats["report"] == 1


def test_sbatch_lines_of_a_training_and_an_evaluation_job_carry_the_config_requests(tmp_path: Path) -> None:
    paper = study(PAPER)
    model = next(iter(paper.models))
    method = next(name for name in paper.methods)
    seed = paper.seeds[0]
    benchmark = next(iter(paper.benchmarks))
    workdir = tmp_path / "work"
    # the upstream outputs exist, so only the two target jobs are ready to submit (the evaluation job samples every
    # benchmark: evaluation.job_per checkpoint)
    benchmark_files = [f"eval_data/{name}.jsonl" for name in paper.benchmarks]
    results = paper.results_dir
    audits = [f"{results}/audit/{name}.json" for name in paper.benchmarks]
    for upstream in (f"{results}/data/train.jsonl", f"{results}/data/data_card.json", *benchmark_files, *audits):
        (workdir / upstream).parent.mkdir(parents=True, exist_ok=True)
        (workdir / upstream).touch()
    # the prepared benchmark files hold their sources' item counts: the Snakefile sizes the evaluation job's GPUs
    # from the files in its working directory (Study.benchmark_sizes)
    for name, items in paper.benchmark_sizes.items():
        (workdir / f"eval_data/{name}.jsonl").write_text("{}\n" * items, encoding="utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, script in (("sbatch", STAND_IN_SBATCH), ("sinfo", STAND_IN_SINFO)):
        (bin_dir / name).write_text(script)
        (bin_dir / name).chmod(0o755)
    record = tmp_path / "sbatch.txt"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SBATCH_RECORD": str(record)}
    train_target = f"{results}/runs/{model}/{method}/seed{seed}/final"
    evaluate_target = f"{results}/eval/{model}/base/seed{seed}/start/{benchmark}.jsonl"
    command = ["snakemake", "--profile", str(PROFILE), "--directory", str(workdir), "--slurm-no-account"]
    command += ["--slurm-init-seconds-before-status-checks", "1"]  # the plugin waits this long before exiting
    result = run_command([*command, train_target, evaluate_target], cwd=REPO, timeout=300, env=env)
    assert result.returncode != 0  # every submission is refused on purpose
    assert "stand-in sbatch" in result.stdout

    calls = [sbatch_options(line) for line in record.read_text().splitlines()]
    retries = 2  # profiles/slurm/config.yaml
    for rule in ("train", "evaluate"):
        attempts = [call for call in calls if call["--comment"].startswith(f"rule_{rule}_wildcards_")]
        assert len(attempts) == retries + 1, f"{rule}: {attempts}"
        job = {"model": model, "method": "base", "seed": seed, "checkpoint": "start"}  # on every benchmark
        wanted = paper.resources(rule, model, job if rule == "evaluate" else None)  # evaluate: its sized GPUs
        for attempt, call in enumerate(attempts, start=1):
            assert call["--gpus"] == str(wanted.gpus)
            assert call["--cpus-per-task"] == str(wanted.cpus)
            assert call["--mem"] == str(wanted.mem_mb)
            assert call["--nodes"] == str(wanted.nodes)
            # a retry asks for attempt x the time limit, but training's: it resumes from its checkpoint, and a
            # longer limit could pass a site's wall (pipeline.runtime.cluster.attempt_runtime)
            assert call["-t"] == str(wanted.runtime * (1 if rule == "train" else attempt))
            assert "--requeue" in call  # preempted jobs go back to the queue
            assert call["-p"] == "gpu"
            if rule == "train":  # the warning that lets training checkpoint comes from its launcher, not sbatch
                assert "--signal" not in call
