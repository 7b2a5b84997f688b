"""Why each planned job would run, down to the module whose code changed; and accepting reviewed code changes.

    python -m pipeline.why_rerun [--configfile CONFIG ...] [--config KEY=VALUE ...] [--directory DIR] [--accept]

Plans the study exactly as ``snakemake -n`` does (same Snakefile, config files, overrides and working directory;
Snakemake's own DAG and metadata) and prints, for every job it would run, its rule, wildcards and each reason:
missing or incomplete outputs, inputs updated on disk or by another planned job, changed settings (the params by
name), for a changed code digest the modules whose code changed, was added or was removed (each rule's ``code``
param holds one digest per module, pipeline.core.source_digest, and Snakemake records it with the job), and for a
changed rule command the words removed and added.

``--accept``: the escape hatch for a code change that was reviewed and does not alter results. Every planned job
whose only reasons are its code (the digest of its modules, the rule's command) and inputs that only accepted jobs
would remake is not rerun: ``snakemake --touch`` marks its outputs up to date (Snakemake's own way: it records the
current code digests and command in its metadata, and touches the outputs in the DAG's order, under the study
lock), and one line per job whose code changed goes to ``<results_dir>/provenance/accepted_code_changes.jsonl``
(pipeline.core.provenance), so that the report's provenance names those outputs, the digest they were made with and
the modules that differed (the report reruns to say so). Jobs with any other reason (a setting, a missing output, an
input changed on disk) are left to run. Without ``--accept`` nothing is written, and a code change reruns what
depends on it.

The plan is Snakemake's own DAG, built by the steps ``snakemake -n`` takes (``Workflow._prepare_dag`` and
``_build_dag``), and read with its reasons and the recorded params: Snakemake's public dry run
(``DAGApi.execute_workflow(executor="dryrun")``) marks each job finished as it simulates it and returns neither the
jobs nor their reasons, so these internal calls stay, in this one place; ``tests/pipeline/test_quick_recipe.py`` runs
this module under the newest Snakemake 9 release, so that a release that changes them is seen.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.io import InputError, append_jsonl_durably, run_cli
from pipeline.core.layout import CODE_CHANGES
from pipeline.core.repo import REPO_DIR
from pipeline.core.rerun_key import is_rerun_key
from pipeline.core.source_digest import changed_modules, parse_source_digest


@dataclass
class Plan:
    """Why one planned job runs: ``reasons`` to print; ``code`` the changed modules of its code digest;
    ``command`` the rule's command as recorded and as it is now, when it changed."""

    rule: str
    job: str
    outputs: list[str]
    snakemake_job: Any = field(repr=False)
    reasons: list[str] = field(default_factory=list)
    code: dict[str, str] = field(default_factory=dict)
    made_with: dict[str, str] = field(default_factory=dict)
    current: dict[str, str] = field(default_factory=dict)
    command: tuple[str, str] | None = None
    other_reasons: bool = False  # anything but the code (digest, command) and inputs other planned jobs remake
    remade_inputs: set[str] = field(default_factory=set)


def _literal(text: Any) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _job_label(job: Any) -> str:
    wildcards = ", ".join(f"{key}={value}" for key, value in job.wildcards_dict.items())
    return f"{job.rule.name}[{wildcards}]" if wildcards else job.rule.name


def explain(job: Any, reason: Any, persistence: Any) -> Plan:
    """The plan of one job from Snakemake's reason for it and the metadata of its outputs."""
    plan = Plan(rule=job.rule.name, job=_job_label(job), outputs=[str(f) for f in job.output], snakemake_job=job)
    if reason.forced:
        plan.reasons.append("forced")
    if reason.missing_output:
        plan.reasons.append("missing output: " + ", ".join(sorted(map(str, reason.missing_output))))
    if reason.incomplete_output:
        plan.reasons.append("incomplete output: " + ", ".join(sorted(map(str, reason.incomplete_output))))
    on_disk = set(map(str, reason.updated_input)) - set(map(str, reason.updated_input_run))
    if on_disk:
        plan.reasons.append("input newer than the output: " + ", ".join(sorted(on_disk)))
    plan.remade_inputs = set(map(str, reason.updated_input_run))
    if plan.remade_inputs:
        plan.reasons.append("input remade by a planned job: " + ", ".join(sorted(plan.remade_inputs)))
    # Asked of the metadata directly, as the params below: Snakemake does not compare the command of a job it runs
    # for another reason.
    current = job.rule.shellcmd  # what Snakemake records as a shell rule's code
    recorded = next((code for path in job.output if (code := persistence.code(path)) is not None), current)
    if recorded != current:
        plan.command = (recorded, current)
        plan.reasons.append(f"the rule's command changed: {command_change(*plan.command)}")
    for flag, text in (
        (reason.input_changed, "the set of input files changed"),
        (reason.software_stack_changed, "the software environment changed"),
        (reason.noio or reason.nooutput, "a rule without outputs"),
    ):
        if flag:
            plan.reasons.append(text)
    flags = (reason.forced, reason.missing_output, reason.incomplete_output, on_disk, reason.input_changed)
    plan.other_reasons = any(flags) or any((reason.software_stack_changed, reason.noio, reason.nooutput))
    # Asked of the metadata directly: Snakemake does not compare the params of a job it runs for another reason.
    change = persistence.params_changed(job)
    if change:
        explain_params(plan, job, change)
    return plan


def command_change(before: str, after: str) -> str:
    """The words of a rule's command that a change removed (``-``) and added (``+``)."""
    old, new = before.split(), after.split()
    edits = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag in ("delete", "replace"):
            edits.append("-`" + " ".join(old[i1:i2]) + "`")
        if tag in ("insert", "replace"):
            edits.append("+`" + " ".join(new[j1:j2]) + "`")
    return ", ".join(edits) or "(whitespace)"


def explain_params(plan: Plan, job: Any, change: Any) -> None:
    """Name the changed params; a changed code digest down to its modules. A rerun key (pipeline.core.rerun_key)
    changes exactly when another param does: it is left out."""
    old = [value for value in map(_literal, change.only_old) if not is_rerun_key(value)]
    new = [value for value in map(_literal, change.only_new) if not is_rerun_key(value)]
    old_code = [digests for value in old if (digests := parse_source_digest(value)) is not None]
    new_code = [digests for value in new if (digests := parse_source_digest(value)) is not None]
    if old_code and new_code:
        plan.made_with, plan.current = old_code[0], new_code[0]
        plan.code = changed_modules(plan.made_with, plan.current)
        listing = ", ".join(f"{module} ({change})" for module, change in plan.code.items())
        plan.reasons.append(f"code changed: {listing}")
    # A job recorded before the per-module digests holds one 16-digit digest of its code: which module changed is
    # unknown, so such a change cannot be accepted.
    legacy = [value for value in old if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{16}", value)]
    if legacy and new_code and not old_code:
        plan.other_reasons = True
        plan.reasons.append("code changed: recorded before per-module digests (which module is unknown)")
    settings = [
        name
        for name, value in job.params.items()
        if parse_source_digest(value) is None and not is_rerun_key(value) and repr(value) in change.only_new
    ]
    if settings or len(old) > len(old_code) + len(legacy) or len(new) > len(new_code):
        plan.other_reasons = True
        plan.reasons.append("settings changed: " + (", ".join(f"params.{name}" for name in settings) or "(unnamed)"))


def settled_by_accepting(plans: list[Plan]) -> list[Plan]:
    """The plans that accepting the code changes leaves with nothing to do: no reason but the code (its digest, the
    rule's command) and inputs that only (other) such jobs remake."""
    producers = {output: plan for plan in plans for output in plan.outputs}
    settled = {plan.job: plan for plan in plans if not plan.other_reasons}
    changed = True
    while changed:
        changed = False
        for job, plan in list(settled.items()):
            if any(producers.get(path) is None or producers[path].job not in settled for path in plan.remade_inputs):
                del settled[job]
                changed = True
    return list(settled.values())


def acceptable(plans: list[Plan]) -> list[Plan]:
    """The plans whose code change is accepted: those of ``settled_by_accepting`` with a changed code digest or
    command (the others only wait for their inputs)."""
    return [plan for plan in settled_by_accepting(plans) if plan.code or plan.command]


@contextmanager
def planned_workflow(args: argparse.Namespace) -> Iterator[Any]:
    """Snakemake's workflow with its DAG built as for ``snakemake -n`` (Snakemake's own API and metadata)."""
    from snakemake.api import SnakemakeApi
    from snakemake.cli import parse_config
    from snakemake.settings.enums import Quietness
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

    config = parse_config(args.config) if args.config else {}
    settings = ConfigSettings(config=config, configfiles=[Path(path) for path in args.configfile])
    output = OutputSettings(quiet={Quietness.ALL}, dryrun=True)
    with SnakemakeApi(output) as api:
        workflow_api = api.workflow(
            resource_settings=ResourceSettings(cores=1),
            config_settings=settings,
            snakefile=Path(args.snakefile).resolve(),
            workdir=Path(args.directory).resolve(),
        )
        # Snakemake's own planning steps, without executing anything: its public dry run (DAGApi.execute_workflow)
        # marks every planned job finished as it simulates them, and returns neither the jobs nor their reasons
        workflow = workflow_api.dag(DAGSettings()).workflow_api._workflow
        workflow._prepare_dag(forceall=False, ignore_incomplete=False, lock_warn_only=True)
        workflow._build_dag()
        yield workflow


def plan_jobs(workflow: Any) -> list[Plan]:
    """The plans of the jobs with outputs that the DAG would run (not a target rule like ``all``), in order."""
    dag = workflow.dag
    ordered = [job for level in dag.toposorted(list(dag.needrun_jobs())) for job in sorted(level, key=_job_label)]
    return [explain(job, dag.reason(job), workflow.persistence) for job in ordered if job.output]


def touch_command(args: argparse.Namespace, targets: list[str]) -> list[str]:
    """``snakemake --touch`` of ``targets`` with the study's Snakefile, directory, config files and overrides."""
    command = [sys.executable, "-m", "snakemake", *targets, "--touch", "--cores", "1", "--quiet"]
    command += ["--snakefile", str(Path(args.snakefile).resolve()), "--directory", str(Path(args.directory).resolve())]
    if args.configfile:
        command += ["--configfile", *args.configfile]
    if args.config:
        command += ["--config", *args.config]
    return command


def accept(args: argparse.Namespace, plans: list[Plan], ledger: Path) -> list[Plan]:
    """Mark the outputs of the jobs that accepting leaves with nothing to do up to date (``snakemake --touch``), then
    log each accepted code change; the accepted plans."""
    settled = settled_by_accepting(plans)
    accepted = acceptable(plans)
    if not accepted:
        return []
    targets = [output for plan in settled for output in plan.outputs]
    touched = subprocess.run(touch_command(args, targets), capture_output=True, text=True)
    if touched.returncode != 0:
        raise InputError(f"snakemake --touch of the accepted jobs failed; nothing accepted:\n{touched.stderr[-3000:]}")
    # after the touch: an output newer than its acceptance was remade since (pipeline.core.provenance), and the
    # ledger is an input of the report, which reruns to name the accepted changes
    now = time.time()
    ledger.parent.mkdir(parents=True, exist_ok=True)
    with open(ledger, "a", encoding="utf-8") as handle:
        append_jsonl_durably(
            handle,
            [
                {
                    "time": now,
                    "rule": plan.rule,
                    "job": plan.job,
                    "outputs": plan.outputs,
                    "modules": plan.code,
                    "made_with": plan.made_with,
                    "accepted": plan.current,
                    **(
                        {"command": {"made_with": plan.command[0], "accepted": plan.command[1]}} if plan.command else {}
                    ),
                }
                for plan in accepted
            ],
        )
    return accepted


def describe(plans: list[Plan]) -> str:
    if not plans:
        return "Nothing to be done: every output is up to date."
    lines = []
    for plan in plans:
        lines.append(plan.job)
        lines += [f"    {reason}" for reason in plan.reasons]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipeline.why_rerun", description=__doc__.splitlines()[0])
    parser.add_argument("--configfile", nargs="*", default=[], help="as snakemake's (replaces configs/default.yaml)")
    parser.add_argument("--config", nargs="*", default=[], help="KEY=VALUE overrides, as snakemake's")
    parser.add_argument("--directory", default=".", help="the study's working directory, as snakemake's")
    parser.add_argument("--snakefile", default=str(REPO_DIR / "Snakefile"))
    parser.add_argument("--accept", action="store_true", help="accept the planned jobs' reviewed code changes")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    directory = Path(args.directory).resolve()  # before Snakemake changes into it
    with planned_workflow(args) as workflow:
        plans = plan_jobs(workflow)
        results_dir = workflow.config.get("results_dir", "results")
    print(describe(plans))
    if args.accept:
        accepted = accept(args, plans, directory / results_dir / CODE_CHANGES)
        left = len(plans) - len(accepted)
        print(
            f"\naccepted the code change of {len(accepted)} jobs (recorded in {results_dir}/{CODE_CHANGES}); "
            f"{left} planned jobs still run (other reasons, or inputs that they remake)",
            file=sys.stderr,
        )


if __name__ == "__main__":
    run_cli(main)
