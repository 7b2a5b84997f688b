"""The project's study through `--profile profiles/slurm` on the real single-node Slurm, against the local run.

The study is tests/pipeline/configs/ci.yaml (the smallest one that runs every rule and every credit method)
with one benchmark instead of two, GRPO and GRAIL of its methods and a distinct resource request per rule;
configs/default.yaml would take far longer than a CI budget on two CPU cores, and the paper's study needs GPUs.
`resources.evaluate.gpus: 1` makes the evaluation jobs ask for the cluster's one fake GPU (gres gpu:1 backed by
/dev/null): Slurm must schedule them on it, and the `hf` backend still runs them on the CPU.

To keep the Slurm job count (and the status polling each job costs) low, the evaluations run as one Snakemake
group job; `--resources gpu=1` tells Snakemake the cluster has one GPU, so the group stacks its evaluations
one after another: it asks for one evaluation's CPUs, memory and GPU and for the sum of their time limits.
Every other rule is its own sbatch job with exactly its config request.

Checked: every job went through sbatch and completed (sacct when slurmdbd answers, else scontrol while Slurm
still lists the finished jobs), with the CPUs, memory, time limit and GPUs the config asked for; then every
scores.csv value and every evaluation sample must be identical to the local run's: the suite's one finished CI
study (``finished_ci_study``: the same ci.yaml, both benchmarks, one more method), which this test reads rather than
running the stages a second time. On the CPU, with the same seeds and the same thread counts, the stages are
deterministic; so the per-rule requests differ in memory and time limits, and the only rule given two CPUs is
prepare_benchmarks, whose outputs involve no floating-point arithmetic.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import yaml

from .conftest import REPO, run_command, study
from .test_slurm import Cluster, sacct_job, scontrol_job, slurm, tres

__all__ = ["slurm"]  # test_slurm.py's cluster fixture, re-exported so that pytest finds it in this module

PROFILE = REPO / "profiles" / "slurm"
CI_CONFIG = REPO / "tests" / "pipeline" / "configs" / "ci.yaml"
KEPT_BENCHMARK = "arith_add"  # the token analysis' benchmark
KEPT_METHODS = ("grpo", "grail")
RESOURCES = {  # distinct per rule, so that a request read from the wrong rule shows; threads as in the local run
    "default": {"cpus": 1, "mem_mb": 800, "runtime": 5},
    "prepare_benchmarks": {"cpus": 2, "mem_mb": 500, "runtime": 3},
    "warmup": {"mem_mb": 1200, "runtime": 4},
    "train": {"mem_mb": 1500, "runtime": 8},
    "evaluate": {"mem_mb": 900, "runtime": 3, "gpus": 1},
}
EVALUATION_GROUP = "eval"
GROUP_JOB = f"{EVALUATION_GROUP}_evaluate_evaluate_analysed"  # Snakemake names a group job after its group and rules
SUBMITTED = re.compile(r"has been submitted with SLURM jobid (\d+) \(log: \S*/slurm_logs/(?:rule|group)_(\w+)/")

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@dataclass(frozen=True)
class Request:
    """What one sbatch job asked for, in Slurm's units."""

    cpus: int
    mem_mb: int
    minutes: int
    gpus: int

    def time_limit(self) -> str:
        """Slurm's `HH:MM:SS` time limit (under a day)."""
        return f"{self.minutes // 60:02d}:{self.minutes % 60:02d}:00"


@dataclass(frozen=True)
class StudyRuns:
    cluster_dir: Path
    slurm_jobs: dict[str, str]  # Slurm job id -> rule (or group) name
    scontrol_records: dict[str, dict[str, str]]
    accounting: bool


def write_study_config(path: Path) -> None:
    """ci.yaml with one benchmark, GRPO and GRAIL (one training job without GRAIL's token analysis, one with: what
    the scheduler sees of a third method is a third such job) and the per-rule RESOURCES."""
    config = yaml.safe_load(CI_CONFIG.read_text())
    config["benchmarks"] = {KEPT_BENCHMARK: config["benchmarks"][KEPT_BENCHMARK]}
    config["methods"] = {name: config["methods"][name] for name in KEPT_METHODS}
    assert config["token_analysis"]["benchmark"] == KEPT_BENCHMARK
    config["resources"] = RESOURCES
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def sacct_answers() -> bool:
    """slurmdbd is configured *and* reachable (with its database down, sacct fails and status polls hang)."""
    probe = subprocess.run(["sacct", "-n", "-X", "-j", "1"], capture_output=True, text=True, timeout=15)
    return probe.returncode == 0


@pytest.fixture(scope="module")
def runs(slurm: Cluster, study_directory: Path) -> StudyRuns:
    """The study on Slurm, in a directory of its own."""
    cluster_dir = study_directory
    write_study_config(cluster_dir / "study.yaml")
    evaluations = len(study(cluster_dir / "study.yaml").evaluation_jobs())
    accounting = slurm.accounting and sacct_answers()
    on_slurm = ["snakemake", "--snakefile", str(REPO / "Snakefile"), "--configfile", "study.yaml"]
    on_slurm += ["--profile", str(PROFILE), "--slurm-no-account"]
    on_slurm += ["--slurm-status-command", "sacct" if accounting else "squeue"]
    on_slurm += ["--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "2"]
    groups = [f"evaluate={EVALUATION_GROUP}", f"evaluate_analysed={EVALUATION_GROUP}"]  # both evaluate rules
    on_slurm += ["--groups", *groups, "--group-components", f"{EVALUATION_GROUP}={evaluations}"]
    on_slurm += ["--resources", "gpu=1"]  # the cluster's one (fake) GPU
    result = run_command(on_slurm, cwd=cluster_dir, timeout=900)
    slurm_jobs = {job_id: rule for job_id, rule in SUBMITTED.findall(result.stdout)}
    # read now: Slurm forgets finished jobs MinJobAge (300 s) after they end
    scontrol_records = {job_id: scontrol_job(job_id) for job_id in slurm_jobs}
    assert result.returncode == 0, result.stdout[-5000:]
    return StudyRuns(cluster_dir, slurm_jobs, scontrol_records, accounting)


def expected_requests(config_path: Path) -> dict[str, Request]:
    """Per rule (the evaluation group under its job name): the sbatch request the config implies."""
    plan = study(config_path)
    (model,) = plan.models
    requests = {}
    rules = (
        "prepare_benchmarks",
        "prepare_data",
        "warmup",
        "train",
        "aggregate",
        "significance",
        "token_viewer",
        "report",
    )
    for rule in rules:
        wanted = plan.resources(rule, model)
        requests[rule] = Request(wanted.cpus, wanted.mem_mb, wanted.runtime, wanted.gpus)
    requests["token_analysis"] = requests["aggregate"]  # both on the defaults
    evaluate = plan.resources("evaluate", model)
    # stacked one after another: one evaluation wide, all of them long
    requests[GROUP_JOB] = Request(
        evaluate.cpus, evaluate.mem_mb, evaluate.runtime * len(plan.evaluation_jobs()), evaluate.gpus
    )
    return requests


def test_every_rule_went_through_sbatch(runs: StudyRuns) -> None:
    plan = study(runs.cluster_dir / "study.yaml")
    submitted = Counter(runs.slurm_jobs.values())
    assert submitted == {
        "prepare_benchmarks": len(plan.benchmarks),
        "prepare_data": 1,
        "warmup": len(plan.models),
        "train": len(plan.runs()),
        GROUP_JOB: 1,
        "aggregate": 1,
        "token_analysis": len(plan.grail_runs()),
        "significance": 1,
        "token_viewer": 1,
        "report": 1,
    }
    evaluations = list((runs.cluster_dir / "results" / "eval").rglob("*.jsonl"))
    assert len(evaluations) == len(plan.evaluations())


def test_slurm_records_carry_the_config_requests(runs: StudyRuns) -> None:
    requests = expected_requests(runs.cluster_dir / "study.yaml")
    assert len(set(requests.values())) >= 4  # the check can tell rules apart
    for job_id, rule in runs.slurm_jobs.items():
        wanted = requests[rule]
        if runs.accounting:
            record = sacct_job(job_id)
            asked = tres(record["ReqTRES"])
            assert (record["State"], record["ExitCode"], record["Timelimit"]) == (
                "COMPLETED",
                "0:0",
                wanted.time_limit(),
            ), (rule, record)
        else:
            record = runs.scontrol_records[job_id]
            assert record, f"Slurm no longer lists job {job_id} ({rule}); run with slurmdbd (WITH_DBD=1)"
            asked = tres(record["TRES"])
            assert (record["JobState"], record["ExitCode"], record["TimeLimit"]) == (
                "COMPLETED",
                "0:0",
                wanted.time_limit(),
            ), (rule, record)
        assert (asked["cpu"], asked["mem"]) == (str(wanted.cpus), f"{wanted.mem_mb}M"), (rule, asked)
        assert asked.get("gres/gpu") == (str(wanted.gpus) if wanted.gpus else None), (rule, asked)


def test_results_match_a_local_run(runs: StudyRuns, finished_ci_study: Path) -> None:
    """Every score and sample of the Slurm run equals the local CI study's for the same run and benchmark."""
    key = ["model", "method", "seed", "benchmark", "metric"]
    on_slurm = pd.read_csv(runs.cluster_dir / "results" / "tables" / "scores.csv")
    on_slurm = on_slurm[on_slurm["benchmark"] == KEPT_BENCHMARK].sort_values(key).reset_index(drop=True)
    local = pd.read_csv(finished_ci_study / "results" / "tables" / "scores.csv")
    local = local[local["method"].isin(set(on_slurm["method"])) & (local["benchmark"] == KEPT_BENCHMARK)]
    assert len(on_slurm) > 0
    pd.testing.assert_frame_equal(on_slurm, local.sort_values(key).reset_index(drop=True)[on_slurm.columns])
    samples = sorted(
        path.relative_to(runs.cluster_dir) for path in (runs.cluster_dir / "results" / "eval").rglob("*.jsonl")
    )
    assert samples
    for path in samples:
        assert (runs.cluster_dir / path).read_text() == (finished_ci_study / path).read_text(), path
