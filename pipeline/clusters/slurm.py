"""The Slurm checks of a cluster run: the scheduler answers; per rule, every job's partition, GRES type, GPU count,
CPU count and memory exist on one node and its time limits (each retry's included) fit the partition's, read from
sinfo; and Slurm's own verdict on every distinct request (``sbatch --test-only`` of the command the executor
plugin would submit), naming the key to change when it refuses. A wrong partition, GPU type or wall time otherwise
surfaces only after the jobs have queued; here it fails in seconds, before anything is submitted. A scheduler that
cannot answer shows every per-rule check as skipped with the reason, never left out.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pipeline.clusters.check import Check
from pipeline.clusters.compute_job import compute_job_checks, skipped_compute_checks
from pipeline.clusters.hub import hub_revisions
from pipeline.models.hub_cache import hub_cache_dir
from pipeline.runtime import cluster
from pipeline.study import cost
from pipeline.study.config import Study


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
