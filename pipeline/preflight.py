"""Preflight of a cluster run: what most often breaks a first cluster run, checked in seconds before anything is
submitted, and what the study will cost.

    python -m pipeline.preflight --profile profiles/slurm --configfile configs/paper.yaml [--json PATH]
        [--concurrent-gpus N] [--sdm apptainer] [--allow-downloads] [--no-compute-job]
    python -m pipeline.preflight --software-only --configfile configs/paper.yaml    # inside an image

Each check prints pass / fail / skipped with a one-line fix; the exit status is 1 when any check fails. The plan
is Snakemake's own (`snakemake -n --profile P --configfile C` in an empty directory: every job of the study, with
the profile's site settings applied, read from Snakemake's job records: pipeline.study.dry_run). Slurm: the scheduler answers; every partition, GRES type, GPU count, CPU
count and memory a job asks for exists on one node, and each time limit fits its partition's; a tiny job on a
compute node writes a token into the results directory that this side reads back; the software GPU rules need
(vLLM's CUDA build, DeepSpeed, flash-attn) is in the image (`--sdm apptainer`) or in this environment, and a study
asking attn_implementation flash_attention_2 finds flash_attn (else the fix: an image built with flash-attn, or
sdpa; `--software-only` runs these two alone, inside an image); every hub model and dataset revision is in the
Hugging Face cache (jobs run with HF_HUB_OFFLINE=1 on offline nodes); the
disk holds the study's checkpoints and samples; each training job's engine (``training_engine``) and precision,
refusing a DeepSpeed precision the training spec conflicts with. Kubernetes (planned without the bucket): first the
profile's own settings (the image is one containers/build.sh pushed from a commit with this checkout's environment
files, the storage prefix is set, checkpoint_volume is a claim's mount path), then the S3 storage, one line a
problem (keys, endpoint, bucket, write), then through the current kubectl context the namespace and a node offering
the GPU resource. docs/cluster.md describes each check. Beside each rule's bound the cost table shows the
expected figures of the study's calibration (``--calibration``, default results_dir/calibration.json: ``python -m
pipeline.calibrate``), marked measured or not measured. Under the cost estimate it prints the planner's one
line (``pipeline.power``, documented defaults): the power of the paper's test and of the seed-aware one for GRAIL's
claimed effect under this design, their false-positive rates and minimum detectable effects.

The checks live in ``pipeline.clusters``, one room a concern (its modules' docstrings say what each checks
and why); this entry parses the command line, runs them in checklist order and prints them with the cost.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from pipeline.clusters.check import Check
from pipeline.clusters.compute_job import COMPUTE_JOB_SECONDS
from pipeline.clusters.disk import disk_check, quota_check
from pipeline.clusters.hub import hub_check
from pipeline.clusters.kubernetes import kubernetes_api_checks, kubernetes_static_checks, s3_checks
from pipeline.clusters.slurm import slurm_checks
from pipeline.clusters.software import (
    attention_check,
    engine_check,
    image_software_check,
    local_software_check,
    missing_plugin,
)
from pipeline.core.io import InputError, atomic_write_json, run_cli
from pipeline.core.repo import REPO_DIR
from pipeline.models.hub_cache import job_hf_home
from pipeline.runtime import cluster
from pipeline.study import power_analysis
from pipeline.study.calibration import CALIBRATION_FILE, load_calibration
from pipeline.study.load import load_study
from pipeline.study.plan import cost_table, estimate, plan

PREFLIGHT_REPLICATIONS = 1000  # simulated studies for the power summary line (pipeline.power)


def software_checks(configfile: Path) -> list[Check]:
    """The software checks alone, of this environment (an image's, when run inside it): no profile, no scheduler."""
    study = load_study([configfile])
    return [local_software_check(study, plan(None, configfile, [])), attention_check(study)]


def run_checks(args: argparse.Namespace) -> tuple[list[Check], dict[str, Any]]:
    profile_file = args.profile / "config.yaml"
    if not profile_file.exists():
        raise InputError(f"--profile {args.profile}: no config.yaml there")
    profile = yaml.safe_load(profile_file.read_text()) or {}
    if problem := missing_plugin(profile_file, profile):
        raise InputError(problem)
    study = load_study([args.configfile])
    job_hf_home(study.hf_home)  # the cache the jobs will read (the Snakefile sets the same), checked below
    extra = ["--sdm", "apptainer"] if args.sdm == "apptainer" else []
    executor = profile.get("executor")
    if executor == "grail-kubernetes":
        # planned on the fs storage in the dry run's empty directory, not the bucket: Snakemake would ask S3 about
        # every file (a botocore traceback without keys) before the checks below could name what is wrong with it
        extra += ["--default-storage-provider", "fs", "--default-storage-prefix", "planned-storage"]
    calibration_path = args.calibration or Path(study.results_dir) / CALIBRATION_FILE
    placed = {f"{study.results_dir}/{CALIBRATION_FILE}": calibration_path} if calibration_path.is_file() else {}
    jobs = plan(args.profile, args.configfile, extra, placed)
    estimate_ = estimate(study, jobs, args.concurrent_gpus, load_calibration(calibration_path), calibration_path)
    if executor == "slurm":
        checks = slurm_checks(jobs, profile, study, args.compute_job_wait if args.compute_job else None)
    elif executor == "grail-kubernetes":
        checks = kubernetes_static_checks(profile, study) + s3_checks(profile) + kubernetes_api_checks(jobs, profile)
    else:
        raise InputError(f"{profile_file}: executor {executor!r}; the preflight knows slurm and grail-kubernetes")
    if args.sdm == "apptainer":
        checks.append(image_software_check(cluster.resolve_image(study.container_image, str(REPO_DIR)), study, jobs))
    elif executor == "slurm":
        checks += [local_software_check(study, jobs), attention_check(study)]
    checks.append(engine_check(study, jobs))
    checks.append(hub_check(study, args.allow_downloads))
    if executor == "slurm":
        checks.append(disk_check(Path(study.results_dir), estimate_["disk_bytes"]["total"]))
        checks.append(quota_check(Path(study.results_dir), estimate_["disk_bytes"]["total"]))
    return checks, estimate_


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipeline.preflight", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, help="profiles/slurm or profiles/kubernetes")
    parser.add_argument("--configfile", type=Path, required=True, help="the study config (configs/paper.yaml)")
    parser.add_argument("--json", type=Path, help="write the checks and the cost estimate here")
    parser.add_argument("--concurrent-gpus", type=int, default=16, help="GPUs the wall-time estimate assumes")
    parser.add_argument(
        "--calibration", type=Path, help="python -m pipeline.calibrate's file (default: results_dir/calibration.json)"
    )
    parser.add_argument("--sdm", choices=["apptainer"], help="check the image instead of this environment")
    parser.add_argument("--allow-downloads", action="store_true", help="jobs may download: uncached hub is no fail")
    parser.add_argument(
        "--no-compute-job", dest="compute_job", action="store_false", help="skip the test job on a compute node"
    )
    parser.add_argument(
        "--compute-job-wait",
        type=int,
        default=COMPUTE_JOB_SECONDS,
        help=f"seconds the test job may take to start and write its token (default {COMPUTE_JOB_SECONDS})",
    )
    parser.add_argument(
        "--software-only",
        action="store_true",
        help="only the software checks of this environment (run inside an image: containers/check_image.sh)",
    )
    args = parser.parse_args(argv)
    if args.profile is None and not args.software_only:
        parser.error("--profile is required (unless --software-only)")
    return args


def print_checks(checks: list[Check]) -> None:
    for check in checks:
        print(f"{check.status.upper():<8} {check.name}: {check.detail}")
        if check.fix and check.status != "pass":
            print(f"{'':<9}fix: {check.fix}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.concurrent_gpus < 1:
        raise InputError("--concurrent-gpus: must be at least 1")
    start = time.monotonic()
    if args.software_only:
        checks = software_checks(args.configfile)
        print_checks(checks)
        failed = [check.name for check in checks if check.status == "fail"]
        print(
            f"\npreflight (software): {len(failed)} failed of {len(checks)} checks in {time.monotonic() - start:.0f} s"
        )
        if args.json:
            atomic_write_json(args.json, {"checks": [asdict(check) for check in checks], "ok": not failed})
        if failed:
            raise SystemExit(1)
        return
    checks, estimate_ = run_checks(args)
    print_checks(checks)
    print()
    print(cost_table(estimate_))
    design, _ = power_analysis.configured_design(args.configfile)
    assessment = power_analysis.assess(
        design,
        power_analysis.default_variance(),
        power_analysis.PAPER_EFFECT,
        PREFLIGHT_REPLICATIONS,
        0,
        estimate_["gpu_hours"],
    )
    print(power_analysis.summary_line(assessment, power_analysis.PAPER_EFFECT, "documented defaults"))
    failed = [check.name for check in checks if check.status == "fail"]
    print(f"\npreflight: {len(failed)} failed of {len(checks)} checks in {time.monotonic() - start:.0f} s")
    if args.json:
        atomic_write_json(
            args.json,
            {
                "checks": [asdict(check) for check in checks],
                "cost": estimate_,
                "power": {key: value for key, value in asdict(assessment).items() if key != "design"},
                "ok": not failed,
            },
        )
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
