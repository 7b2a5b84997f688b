"""The compute-node test job: a tiny sbatch job, asked for with the site's partition, account, QoS, reservation
and node features as the study's jobs are, writes a token into the results directory that this side reads back;
where the study has GPU jobs it reports the node's driver and GPUs against the image's CUDA floor, and it tries the
hub cache the jobs will read. The login node sees none of this: a results directory the compute nodes do not
share, a driver too old for the image, or an HF_HOME only the login node can read each fail a first run after it
has queued.
"""

from __future__ import annotations

import shlex
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from pipeline.clusters.check import Check
from pipeline.runtime import gpu_floor
from pipeline.study import cost

COMPUTE_JOB_SECONDS = 40  # the test job's default wait (--compute-job-wait)
COMPUTE_JOB = "results directory from a compute node"
COMPUTE_GPU = "GPU stack on a compute node"
COMPUTE_HUB = "hub cache from a compute node"


def compute_job_script(target: Path, token: str, gpu: bool, hub: Path | None) -> str:
    """The test job's shell: the GPU query (``target``.gpus) and whether the hub cache is readable there
    (``target``.hub), then the token last, so that the token's arrival means the rest is written."""
    lines = []
    if gpu:
        query = f"command -v nvidia-smi >/dev/null && {gpu_floor.GPU_QUERY} || echo nvidia-smi is not on PATH"
        lines.append(f"{{ {query}; }} > {shlex.quote(f'{target}.gpus')} 2>&1")
    if hub is not None:
        quoted = shlex.quote(str(hub))
        lines.append(f"{{ test -r {quoted} && test -x {quoted} && echo readable; }} > {shlex.quote(f'{target}.hub')}")
    return "; ".join([*lines, f"echo {token} > {shlex.quote(str(target))}"])


def gpu_stack_check(job_id: str, report: str) -> Check:
    """The node's driver and GPUs (``gpu_floor.GPU_QUERY``'s output) against the image's CUDA floor."""
    fix = (
        "a partition with newer GPUs or drivers (slurm_partition, constraint), or an image built for CUDA 12 "
        '(docs/cluster.md, "The GPU stack\'s floor")'
    )
    try:
        gpus = gpu_floor.parse_gpu_query(report)
    except ValueError as error:
        return Check(COMPUTE_GPU, "fail", f"job {job_id}: nvidia-smi gave no GPU ({error})", fix)
    if not gpus:
        return Check(COMPUTE_GPU, "fail", f"job {job_id}: nvidia-smi listed no GPU", fix)
    found = f"job {job_id}: {gpu_floor.describe(gpus)}"
    if problems := gpu_floor.gpu_stack_problems(gpus):
        return Check(COMPUTE_GPU, "fail", f"{found}: {'; '.join(problems)}; {gpu_floor.FLOOR_TEXT}", fix)
    return Check(COMPUTE_GPU, "pass", f"{found}; {gpu_floor.FLOOR_TEXT}")


def hub_path_check(job_id: str, hub: Path, readable: bool) -> Check:
    """Whether the hub cache this side checked (and every job reads: the Snakefile exports its HF_HOME) is
    readable on a compute node."""
    if readable:
        return Check(COMPUTE_HUB, "pass", f"job {job_id} reads {hub}")
    return Check(
        COMPUTE_HUB,
        "fail",
        f"job {job_id} cannot read {hub}, the hub cache checked here",
        "set HF_HOME to a directory on storage the compute nodes share, then download into it (docs/cluster.md)",
    )


def compute_job_site_flags(profile: dict[str, Any], gpu_job: cost.PlannedJob | None) -> list[str]:
    """The sbatch flags of the site's settings that the study's jobs carry (profiles/slurm SITE SETTINGS): partition
    and account (the first GPU job's own where it has them), QoS, reservation and the GPU job's node features; the
    test job asks for its node as they do, so it tests the nodes they will get."""
    site = {**(profile.get("default-resources") or {}), **(gpu_job.resources if gpu_job else {})}
    values = (
        ("-p", site.get("slurm_partition")),
        ("-A", site.get("slurm_account")),
        ("--qos", site.get("qos") or profile.get("slurm-qos")),
        ("--reservation", profile.get("slurm-reservation")),
        ("-C", site.get("constraint")),
    )
    return [flag for option, value in values if value for flag in (option, str(value))]


def compute_job_checks(
    results_dir: Path, profile: dict[str, Any], gpu_job: cost.PlannedJob | None, hub: Path | None, wait: int
) -> list[Check]:
    """A tiny sbatch job on a compute node, asked for with the site's flags (``compute_job_site_flags``), writes a
    token into the results directory, which this side reads back within ``wait`` seconds; where the study has GPU
    jobs it asks for one GPU as the first of them does and reports the node's driver and GPUs
    (``gpu_stack_check``), and it tries the hub cache (``hub_path_check``, None: the study reads no hub)."""
    token = uuid.uuid4().hex
    target = results_dir.resolve() / ".preflight" / token
    target.parent.mkdir(parents=True, exist_ok=True)
    command = ["sbatch", "--parsable", "-J", "grail-preflight", "-t", "2", "-c", "1", "--mem", "200", "-o", "/dev/null"]
    site_flags = compute_job_site_flags(profile, gpu_job)
    command += site_flags
    if gpu_job is not None:
        command.append(f"--gpus={gpu_job.gpu_model}:1" if gpu_job.gpu_model else "--gpus=1")
    script = compute_job_script(target, token, gpu_job is not None, hub)
    submitted = subprocess.run([*command, "--wrap", script], capture_output=True, text=True, timeout=30)
    if submitted.returncode != 0:
        detail = f"sbatch refused the test job ({' '.join(site_flags) or 'no site flags'}): {submitted.stderr.strip()}"
        return [
            Check(COMPUTE_JOB, "fail", detail, "fix the account, partition, QoS or reservation in SITE SETTINGS"),
            *node_checks(None, target, gpu_job is not None, hub),
        ]
    job_id = submitted.stdout.strip().split(";")[0]
    try:
        result = await_token(job_id, target, token, wait)
        return [result, *node_checks(job_id if result.status == "pass" else None, target, gpu_job is not None, hub)]
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)
        for path in (target, *target.parent.glob(f"{token}.*")):
            path.unlink(missing_ok=True)
        if not any(target.parent.iterdir()):
            target.parent.rmdir()


def node_checks(job_id: str | None, target: Path, gpu: bool, hub: Path | None) -> list[Check]:
    """The GPU stack and the hub cache as the test job ``job_id`` found them (None: it did not run, or was not
    submitted), each skipped with the reason where it could not be judged."""
    ran = "" if job_id else "the test job did not run"
    gpu_reason = "the study has no GPU job" if not gpu else ran
    hub_reason = "the study reads no hub model or dataset" if hub is None else ran
    return [
        Check(COMPUTE_GPU, "skipped", gpu_reason)
        if gpu_reason
        else gpu_stack_check(str(job_id), target.with_name(f"{target.name}.gpus").read_text()),
        Check(COMPUTE_HUB, "skipped", hub_reason)
        if hub_reason or hub is None
        else hub_path_check(str(job_id), hub, target.with_name(f"{target.name}.hub").read_text().strip() == "readable"),
    ]


def await_token(job_id: str, target: Path, token: str, wait: int) -> Check:
    """Wait up to ``wait`` seconds for job ``job_id`` to write ``token`` to ``target``; a job still queued then is
    SKIPPED with Slurm's reason for it (a busy cluster is no fault of the settings)."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if target.exists() and target.read_text().strip() == token:
            return Check(COMPUTE_JOB, "pass", f"job {job_id} wrote {target} and it is visible here")
        state = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
        if not state.stdout.strip() and not target.exists():
            time.sleep(2)  # finished: give a network filesystem a moment
            if not target.exists():
                return Check(
                    COMPUTE_JOB,
                    "fail",
                    f"job {job_id} ended but {target} is not visible here",
                    "put results_dir on a filesystem the compute nodes share (e.g. /scratch or /work)",
                )
        time.sleep(1)
    queued = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T %r"], capture_output=True, text=True)
    state, _, reason = queued.stdout.strip().partition(" ")
    if state == "PENDING":
        detail = f"job {job_id} still queued after {wait} s (Slurm's reason: {reason or 'none given'})"
        return Check(COMPUTE_JOB, "skipped", f"{detail}; rerun when it can start, or with a longer --compute-job-wait")
    return Check(
        COMPUTE_JOB,
        "fail",
        f"job {job_id} did not write its token within {wait} s (state: {state or 'gone'})",
        "rerun with a longer --compute-job-wait",
    )


def skipped_compute_checks(reason: str) -> list[Check]:
    """The test job's checks, none of which could run."""
    return [Check(name, "skipped", reason) for name in (COMPUTE_JOB, COMPUTE_GPU, COMPUTE_HUB)]
