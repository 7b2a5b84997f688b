"""The real DAG end to end on the CI study (every rule, every built-in method of ci.yaml and an out-of-tree one by
import path), then caching and determinism.

Slow (minutes on two CPU cores): run with ``python -m pytest tests/pipeline -m slow``.
"""

from __future__ import annotations

import ast
import html
import itertools
import json
import math
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from pipeline import power
from pipeline.core import gpu_determinism
from pipeline.core.io import canonical_json
from pipeline.study import pilot_variance, power_analysis
from pipeline.study.config import Study
from pipeline.study.load import load_study
from tests.shared_studies import CI_CONFIG, CI_CONFIG_FILES, EXAMPLES_DIR, PLUGIN_CONFIG, REPO, with_examples

pytestmark = pytest.mark.slow

CONFIG_FILES = CI_CONFIG_FILES

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SIGNIFICANCE_KEYS = {"method_a", "method_b", "metric", "n", "statistic", "p_value", "alternative", "test"}


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir)]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=3600, env=with_examples())


def job_counts(output: str) -> dict[str, int]:
    if "Job stats:" not in output:
        return {}
    rows = re.findall(r"^(\w+)\s+(\d+)$", output.split("Job stats:", 1)[1], flags=re.MULTILINE)
    return {rule: int(count) for rule, count in rows if rule != "total"}


def evaluate_jobs(counts: dict[str, int]) -> int:
    """The planned jobs of the evaluate rules (one per run and checkpoint: pipeline.study.config.evaluate_rules)."""
    return counts.get("evaluate", 0) + counts.get("evaluate_analysed", 0)


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Study]:
    """ci.yaml with ci_plugin.yaml's methods, as Snakemake merges the two config files."""
    config = yaml.safe_load(CI_CONFIG.read_text())
    config["methods"] |= yaml.safe_load(PLUGIN_CONFIG.read_text())["methods"]
    merged = tmp_path_factory.mktemp("config") / "ci_with_plugin.yaml"
    merged.write_text(yaml.safe_dump(config))
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(EXAMPLES_DIR))
        yield load_study([merged])


@pytest.fixture
def workdir(finished_ci_study: Path) -> Path:
    """The CI study, finished (every rule): read only."""
    return finished_ci_study


def test_every_rule_ran(workdir: Path, study: Study) -> None:
    results = workdir / "results"
    assert len(list((results / "logs" / "train").rglob("*.log"))) == len(study.runs())
    assert len(list((results / "eval").rglob("*.jsonl"))) == len(study.evaluations())
    # one evaluation job per (run, checkpoint), with one log and one Snakemake benchmark file
    assert len(list((results / "benchmarks" / "evaluate").rglob("*.tsv"))) == len(study.evaluation_jobs())
    logs = list((results / "logs" / "evaluate").rglob("*.log"))
    assert len(logs) == len(study.evaluation_jobs())
    assert all(log.read_text().count("evaluate: starting the hf backend") == 1 for log in logs)
    for rule in ("prepare_benchmarks", "warmup", "train", "evaluate", "token_analysis"):
        assert list((results / "benchmarks" / rule).rglob("*.tsv")), rule
    for rule in ("prepare_data", "aggregate", "significance", "token_viewer", "report"):
        assert (results / "benchmarks" / f"{rule}.tsv").is_file(), rule


def test_tables_are_sane(workdir: Path, study: Study) -> None:
    tables = workdir / "results" / "tables"
    scores = pd.read_csv(tables / "scores.csv")
    assert {"model", "method", "seed", "benchmark", "metric", "value"} <= set(scores.columns)
    assert set(scores["method"]) == {*study.methods, "base"}
    n = study.evaluation.spec["n_samples"]
    accuracy = scores[scores["metric"].isin([f"acc@{n}", f"pass@{n}", "pass@1"])]["value"]
    assert len(accuracy) and accuracy.between(0, 1).all()
    assert set(study.benchmarks) | {"average", "weighted_average"} <= set(scores["benchmark"])
    summary = pd.read_csv(tables / "summary.csv")
    assert len(summary) >= len(study.methods) + 1
    assert pd.read_excel(tables / "summary.xlsx").shape[0] >= len(study.methods)
    markdown = (tables / "summary.md").read_text()
    assert all(method in markdown for method in study.methods) and "base" in markdown


def test_figures_are_pngs(workdir: Path) -> None:
    figures = [*(workdir / "results" / "figures").glob("*.png"), *(workdir / "results").rglob("GRAIL_positional.png")]
    assert len(figures) >= 3
    for figure in figures:
        data = figure.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, figure


def test_significance_is_sane(workdir: Path, study: Study) -> None:
    rows = json.loads((workdir / "results" / "stats" / "significance.json").read_text())
    assert rows and all(set(row) >= SIGNIFICANCE_KEYS for row in rows)
    pairs = {frozenset((row["method_a"], row["method_b"])) for row in rows}
    against_base = {frozenset((method, "base")) for method in study.methods}
    assert len(pairs - against_base) == math.comb(len(study.methods), 2)
    # every trained method is tested against the warmed-up base over items (the baseline's start samples)
    assert against_base <= {frozenset((r["method_a"], r["method_b"])) for r in rows if r["test"] == "wilcoxon_items"}
    report = (workdir / "results" / "report.md").read_text()
    assert all(f"| {method} vs base |" in report for method in study.methods)
    assert all(0 <= row["p_value"] <= 1 for row in rows if row["p_value"] is not None)
    assert {row["alternative"] for row in rows} >= {"greater", "two-sided"}
    assert (workdir / "results" / "stats" / "significance.md").read_text().strip()


def test_training_and_token_analysis_outputs(workdir: Path, study: Study) -> None:
    results = workdir / "results"
    for run in study.runs():
        run_dir = results / "runs" / run["model"] / run["method"] / f"seed{run['seed']}"
        rewards = [row["reward"] for row in map(json.loads, (run_dir / "metrics.jsonl").open()) if "reward" in row]
        assert rewards and all(0 <= reward <= 1 for reward in rewards)
        assert (run_dir / "final" / "config.json").is_file()
    for run in study.grail_runs():
        summary_path = results / "token_analysis" / run["model"] / run["method"] / f"seed{run['seed']}"
        summary = json.loads((summary_path / "summary.json").read_text())
        assert set(summary["checkpoints"]) == set(study.token_analysis.checkpoints)
        assert all(len(entry["bin_centres"]) == 20 for entry in summary["checkpoints"].values())
        trained = study.method_grail_settings(run["method"])  # the analysis uses the method's own GRAIL settings
        assert {name: summary["spec"][name] for name in trained} == trained
        report = (results / "report.md").read_text()
        assert f"`{run['method']}`: analysed with the GRAIL settings it trains with (grail_mean" in report


def test_out_of_tree_method_trains_logs_and_is_viewed(workdir: Path) -> None:
    """ci_plugin.yaml's method, named by import path: trained, its statistics logged under its own name, a row of
    its own in the token viewer, built with its option."""
    results = workdir / "results"
    rows = [json.loads(line) for line in (results / "runs/tiny/halfway/seed0/metrics.jsonl").open()]
    assert any("halfway/advantages_scale_ratio" in row for row in rows)
    # its weight statistics cover the rows that carry loss: none where the CI model earns no reward
    means = [row["halfway/weight_mean"] for row in rows if "halfway/weight_mean" in row]
    assert all(1.0 < mean < 2.0 for mean in means)
    page = (results / "token_weights.html").read_text()
    assert page.count('data-method="halfway"') == page.count('data-method="grail"') > 0
    viewed = [json.loads(html.unescape(found))["halfway"] for found in re.findall(r'data-weights="([^"]*)"', page)]
    assert all(set(weights) <= {1.0, 2.0} for weights in viewed) and any(2.0 in weights for weights in viewed)


def test_training_curves_reach_tensorboard(workdir: Path, study: Study) -> None:
    """ci.yaml sets `tracking.report_to: tensorboard`: every run has its event files under its own name."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for run in study.runs():
        events = EventAccumulator(str(workdir / "results" / "tracking" / "tensorboard" / study.run_name(run)))
        events.Reload()
        assert "train/reward" in events.Tags()["scalars"], run
        assert [event.step for event in events.Scalars("train/reward")] == list(
            range(1, study.training["max_steps"] + 1)
        )


def test_report_gathers_everything(workdir: Path, study: Study) -> None:
    report = (workdir / "results" / "report.md").read_text()
    assert len(report) > 500
    for method in study.methods:
        assert method in report
    assert "summary" in report.lower() or "acc@" in report
    for benchmark in study.benchmarks:
        assert benchmark in report
        audit = json.loads((workdir / "results" / "audit" / f"{benchmark}.json").read_text())
        assert audit["modes"]["clean"]["failure_count"] == audit["modes"]["upstream"]["failure_count"] == 0
        # the audit section: one row per grading mode, nothing refused
        assert f"| {benchmark} | clean | {audit['items']} | 0 |" in report
        assert f"| {benchmark} | upstream | {audit['items']} | 0 |" in report
    assert "## Token weights" in report and "](token_weights.html)" in report
    assert (workdir / "results" / "token_weights.html").is_file()
    card = json.loads((workdir / "results" / "data" / "data_card.json").read_text())
    assert card["rows_written"] == study.data["generated"]["count"]


def test_variance_and_seed_aware_rows_follow_from_the_tables(workdir: Path, study: Study) -> None:
    """The report's variance section is tables/variance.csv; every seed-aware difference is the difference of the
    methods' seed means of acc@n in tables/scores.csv (the study row: their mean over cells); one seed leaves the
    seed terms and the seed-aware intervals empty, and the report says what follows."""
    results = workdir / "results"
    scores = pd.read_csv(results / "tables" / "scores.csv", dtype={"checkpoint": str})
    variance = pd.read_csv(results / "tables" / "variance.csv", dtype={"checkpoint": str})
    evaluated = {(e["model"], e["method"], e["checkpoint"], e["benchmark"]) for e in study.evaluations()}
    assert set(variance[["model", "method", "checkpoint", "benchmark"]].itertuples(index=False, name=None)) == evaluated
    for row in variance.itertuples(index=False):
        selected = scores.query(
            "model == @row.model and method == @row.method and checkpoint == @row.checkpoint"
            " and benchmark == @row.benchmark and metric == @row.metric"
        )
        assert row.accuracy == pytest.approx(selected["value"].mean()), row
        assert row.seeds == 1 and math.isnan(row.var_seed) and math.isnan(row.share_seed)
    report = (results / "report.md").read_text()
    section = report[report.index("## Where the variance comes from") : report.index("## Data card")]
    shown = variance[variance["checkpoint"].isin(["final", "start"])]
    assert section.count("\n| tiny |") == len(shown)
    assert "**One training seed.**" in section
    final = scores[(scores["checkpoint"] == "final") & scores["metric"].str.startswith("acc@")]
    means = final.groupby(["model", "benchmark", "method"])["value"].mean()
    rows = json.loads((results / "stats" / "significance.json").read_text())
    bootstrap = [row for row in rows if row["test"] == "seed_bootstrap"]
    assert {(r["method_a"], r["method_b"]) for r in bootstrap} == set(itertools.combinations(sorted(study.methods), 2))
    for row in bootstrap:
        if row["model"] == "all":
            cells = [r for r in bootstrap if r["model"] != "all" and r["method_a"] == row["method_a"]]
            cells = [r for r in cells if r["method_b"] == row["method_b"]]
            assert row["statistic"] == pytest.approx(np.mean([r["statistic"] for r in cells]))
        else:
            difference = (
                means[row["model"], row["benchmark"], row["method_a"]]
                - means[row["model"], row["benchmark"], row["method_b"]]
            )
            assert row["statistic"] == pytest.approx(difference), row
        assert not row["runs_resampled"] and row["ci_low"] is None and row["p_value"] is None
    assert "with one run of a method in some model the runs cannot be resampled" in report


def test_planner_reads_the_finished_study_as_its_pilot(workdir: Path, capsys) -> None:
    """``python -m pipeline.power --pilot``: the sampling variance is the mean of the compared methods' (GRAIL's
    and GRPO's) final estimates in tables/variance.csv; one seed leaves the seed terms at their documented
    defaults, flagged as fallbacks."""
    variance = pd.read_csv(workdir / "results" / "tables" / "variance.csv", dtype={"checkpoint": str})
    compared = variance[(variance["checkpoint"] == "final") & variance["method"].isin(["grail", "grpo"])]
    pilot = pilot_variance.pilot_variance(workdir / "results", ("grail", "grpo"))
    assert pilot.sampling.value == pytest.approx(compared["var_sampling"].mean())
    assert pilot.seed_sd.fallback and pilot.seed_sd.value == power_analysis.DEFAULTS["seed_sd"].value
    assert "no (model, method) has 2 seeds (0 degrees of freedom, minimum 6)" in pilot.seed_sd.source
    configfile = str(REPO / "configs" / "paper.yaml")
    power.main(["--configfile", configfile, "--pilot", str(workdir / "results"), "--replications", "100", "--no-cost"])
    out = capsys.readouterr().out
    assert f"(pilot {workdir / 'results'}: {len(compared)} (model, benchmark) cells of grail and grpo)" in out
    assert "  seed sd 2.00 points [fallback] (pilot " in out


def test_snakemake_html_report(workdir: Path, tmp_path: Path) -> None:
    html = tmp_path / "report.html"
    result = snakemake(workdir, *CONFIG_FILES, "--report", str(html))
    assert result.returncode == 0, result.stderr[-3000:]
    text = html.read_text(errors="replace")
    assert text.lstrip().lower().startswith("<!doctype html") and "GRAIL_positional" in text
    assert "token_weights.html" in text and "Token weights" in text


def test_second_run_does_nothing(workdir: Path) -> None:
    result = snakemake(workdir, "-n", *CONFIG_FILES)
    assert result.returncode == 0, result.stderr[-3000:]
    reasons = sorted(set(re.findall(r"reason: (.*)", result.stdout)))
    assert "Nothing to be done" in result.stdout + result.stderr, reasons


def test_run_time_settings_change_reruns_only_the_report(workdir: Path, tmp_path: Path) -> None:
    """The run-time settings (the stall watchdog, the health check, time windows, the collective timeout: pipeline.runtime.settings)
    reach the jobs through their environment, never a command or a param: they decide how a job runs, never what
    it computes. The report shows the whole config, so it is remade. (Checked by breaking it: with the settings as a
    plain string param of train and evaluate, every train and evaluate job and all after them are planned.)"""
    config = yaml.safe_load(CI_CONFIG.read_text())
    config["watchdog"] = {"stall_floor_s": 60, "stall_multiple": 3, "enabled": False}
    config["health"] = {"flat_window": 8, "weight_growth": 3.0}
    config["time_windows"] = 3
    config["training"]["ddp_timeout"] = 600
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(config))
    result = snakemake(workdir, "-n", "--configfile", str(changed), str(PLUGIN_CONFIG))
    assert result.returncode == 0, result.stderr[-3000:]
    assert job_counts(result.stdout) == {"report": 1, "all": 1}


def test_evaluation_change_reruns_no_training(workdir: Path, study: Study, tmp_path: Path) -> None:
    config = yaml.safe_load(CI_CONFIG.read_text())
    config["evaluation"]["temperature"] = 0.9
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(config))
    result = snakemake(workdir, "-n", "--configfile", str(changed), str(PLUGIN_CONFIG))
    assert result.returncode == 0, result.stderr[-3000:]
    counts = job_counts(result.stdout)
    assert evaluate_jobs(counts) == len(study.evaluation_jobs())
    assert {"aggregate", "significance", "token_analysis", "token_viewer", "report"} <= set(counts)
    assert not {"train", "warmup", "prepare_data", "prepare_benchmarks"} & set(counts), counts


def test_kernel_pin_change_reruns_the_stages_that_compute(workdir: Path, study: Study, tmp_path: Path) -> None:
    """``kernel_pin: false`` moves last bits (pipeline.core.kernels): warm-up, training, evaluation, token analysis and the
    viewer are planned again, data preparation is not."""
    config = yaml.safe_load(CI_CONFIG.read_text())
    config["kernel_pin"] = False
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(config))
    result = snakemake(workdir, "-n", "--configfile", str(changed), str(PLUGIN_CONFIG))
    assert result.returncode == 0, result.stderr[-3000:]
    counts = job_counts(result.stdout)
    assert counts["warmup"] == 1 and counts["train"] == len(study.runs()) and counts["token_viewer"] == 1
    assert evaluate_jobs(counts) == len(study.evaluation_jobs()) and "token_analysis" in counts
    assert not {"prepare_data", "prepare_benchmarks"} & set(counts), counts


def test_every_run_and_evaluation_records_its_run_time_settings(workdir: Path, study: Study) -> None:
    """The run-time settings a job ran under are in its provenance (pipeline.runtime.settings)."""
    results = workdir / "results"
    records = [*results.glob("runs/*/*/seed*/provenance.json"), *results.glob("eval/**/*.provenance.json")]
    assert len(records) > 4
    for path in records:
        assert json.loads(path.read_text())["runtime"] == study.runtime.record(), path
    for path in results.glob("runs/*/*/seed*/provenance.json"):  # the health check's summary (pipeline.runtime.health)
        assert json.loads(path.read_text())["health"]["verdict"] == "healthy", path


def test_every_run_and_evaluation_records_the_pinned_kernel_path(workdir: Path) -> None:
    """Provenance beside each run and samples file, and the report's provenance section (pipeline.core.kernels)."""
    results = workdir / "results"
    records = [*results.glob("runs/*/*/seed*/provenance.json"), *results.glob("eval/**/*.provenance.json")]
    assert len(records) > 4
    for path in records:
        kernel = json.loads(path.read_text())["kernels"]
        assert kernel["capability"] == "AVX2" and kernel["kernel_pin"] is True, path
        assert kernel["variables"]["MKL_CBWR"] == "COMPATIBLE,STRICT" and kernel["cpu_model"], path
    report = (results / "report.md").read_text()
    assert f"All {len(records)} training runs and evaluations ran on one CPU kernel path: capability AVX2" in report
    assert '"cpu": ' in report  # the report's hardware record (pipeline.core.provenance.hardware)
    # GPU determinism off (the default; pipeline.core.gpu_determinism), and no GPU
    for path in records:
        gpu = json.loads(path.read_text())["gpu"]
        assert gpu["gpu_determinism"] is False and gpu["deterministic_algorithms"] is False, path
        assert gpu["variables"] == {} and gpu["devices"] == [], path
    assert f"None of the {len(records)} training runs and evaluations ran on a GPU (GPU determinism off;" in report


def code_copy(tmp_path: Path, edits: dict[str, str] | None = None) -> Path:
    """The Snakefile, configs and package copied under ``tmp_path`` (the finished study's code), with ``edits``
    (module path -> text appended) applied: a study planned by it sees the edited code."""
    code = tmp_path / "code"
    code.mkdir(parents=True)
    shutil.copy2(REPO / "Snakefile", code / "Snakefile")
    for name in ("configs", "pipeline"):
        shutil.copytree(REPO / name, code / name, ignore=shutil.ignore_patterns("__pycache__"))
    for module, text in (edits or {}).items():
        with open(code / module, "a", encoding="utf-8") as handle:
            handle.write(text)
    return code


def plan_with(code: Path, workdir: Path) -> tuple[dict[str, int], str]:
    """``snakemake -n`` of the CI study in ``workdir`` by the code copy ``code``: planned jobs per rule (but the
    target rule ``all``), and the output."""
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(code / "Snakefile"), "--directory", str(workdir)]
    result = subprocess.run([*command, "-n", *CONFIG_FILES], capture_output=True, text=True, env=with_examples())
    assert result.returncode == 0, result.stderr[-3000:]
    counts = {rule: count for rule, count in job_counts(result.stdout).items() if rule != "all"}
    return counts, result.stdout + result.stderr


def why_rerun(code: Path, workdir: Path, *args: str) -> str:
    """``python -m pipeline.why_rerun`` of the code copy (its own package and Snakefile) over ``workdir``."""
    command = [sys.executable, "-m", "pipeline.why_rerun", "--directory", str(workdir), *CONFIG_FILES]
    result = subprocess.run([*command, *args], capture_output=True, text=True, cwd=code, env=with_examples(code))
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


def test_comment_and_docstring_edits_rerun_nothing(workdir: Path, tmp_path: Path) -> None:
    """Every pipeline module gets a comment, blank lines and an edited module docstring: nothing to be done."""
    code = code_copy(tmp_path)
    edited = 0
    for path in sorted((code / "pipeline").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if text.startswith('"""') and ast.get_docstring(ast.parse(text)) is not None:
            text = '"""Reviewed, reworded. ' + text[3:]
            edited += 1
        path.write_text(f"# a reviewed comment\n{text}\n\n# another one\n", encoding="utf-8")
    assert edited >= 30
    counts, output = plan_with(code, workdir)
    assert not counts and "Nothing to be done" in output, counts


def test_metrics_change_reruns_aggregation_onwards_and_says_why(workdir: Path, tmp_path: Path) -> None:
    code = code_copy(tmp_path, {"pipeline/stats/metrics.py": "\nREVIEWED = 1\n"})
    counts, _ = plan_with(code, workdir)
    assert counts == {"aggregate": 1, "significance": 1, "report": 1}
    why = why_rerun(code, workdir)
    assert "aggregate\n    code changed: pipeline.stats.metrics (changed)\n" in why
    assert "significance\n    input remade by a planned job: results/tables/scores.csv" in why
    assert "train[" not in why and "evaluate[" not in why


def test_report_change_reruns_only_the_report(workdir: Path, tmp_path: Path) -> None:
    counts, _ = plan_with(code_copy(tmp_path, {"pipeline/report.py": "\nREVIEWED = 1\n"}), workdir)
    assert counts == {"report": 1}


def test_grader_change_reruns_training_and_evaluation_not_data(workdir: Path, study: Study, tmp_path: Path) -> None:
    counts, _ = plan_with(code_copy(tmp_path, {"pipeline/tasks/grading.py": "\nREVIEWED = 1\n"}), workdir)
    assert counts.get("train") == len(study.runs()) and evaluate_jobs(counts) == len(study.evaluation_jobs())
    assert counts.get("prepare_benchmarks") == len(study.benchmarks)  # its gold audit grades the golds
    assert not {"prepare_data", "warmup"} & set(counts), counts


def test_accepted_code_change_reruns_nothing_and_shows_in_the_report(ci_study_copy: Path, tmp_path: Path) -> None:
    """On a copy of the finished study: --accept re-records the digests; only the report reruns, and says so."""
    study_copy = ci_study_copy
    code = code_copy(tmp_path, {"pipeline/stats/metrics.py": "\nREVIEWED = 1\n"})
    output = why_rerun(code, study_copy, "--accept")
    assert "accepted the code change of 3 jobs" in output  # aggregate, significance, report
    entries = [json.loads(line) for line in (study_copy / "results/provenance/accepted_code_changes.jsonl").open()]
    assert {entry["rule"] for entry in entries} == {"aggregate", "significance", "report"}
    assert all(entry["modules"] == {"pipeline.stats.metrics": "changed"} for entry in entries)
    counts, _ = plan_with(code, study_copy)
    assert counts == {"report": 1}  # its new input, the accepted changes: to say so in its provenance
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(code / "Snakefile"),
        "--directory",
        str(study_copy),
    ]
    result = subprocess.run(
        [*command, "--cores", "1", *CONFIG_FILES], capture_output=True, text=True, env=with_examples()
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = (study_copy / "results" / "report.md").read_text()
    assert "2 jobs' outputs were made by an older code digest" in report  # the report itself is remade
    assert re.search(r"- `aggregate`: pipeline.stats.metrics \(changed: [0-9a-f]{16} -> [0-9a-f]{16}\)", report)
    assert "the same library versions" in report
    assert "Nothing to be done" in plan_with(code, study_copy)[1]
    assert plan_with(code_copy(tmp_path / "again", {"pipeline/stats/metrics.py": "\nREVIEWED = 2\n"}), study_copy)[0]


def _without_timings(path: Path) -> list[dict]:
    """metrics.jsonl rows without the wall-clock fields (they differ run to run by nature)."""
    timing = re.compile(r"time|runtime|per_second")
    return [{k: v for k, v in json.loads(line).items() if not timing.search(k)} for line in path.open()]


def test_same_seed_same_metrics(workdir: Path, study: Study, tmp_path: Path) -> None:
    """Retrain one run and re-evaluate the baseline into new directories: identical metrics and samples. Both with
    GPU determinism on (pipeline.core.gpu_determinism), which on the CPU must change no number: each stage applies
    it and records it in its provenance."""
    model, method, seed = "tiny", "grail", study.seeds[0]
    results = workdir / "results"
    train = [
        sys.executable, "-m", "pipeline.train", "--model", str(results / "models" / model / "start"),
        "--training-spec", canonical_json(study.training_spec(model)),
        "--method-spec", canonical_json(study.methods[method].spec),
        "--data", str(results / "data" / "train.jsonl"), "--seed", str(seed), "--out", str(tmp_path / "run"),
    ]  # fmt: skip
    deterministic = {**with_examples(), gpu_determinism.GPU_DETERMINISM_VARIABLE: "1"}
    subprocess.run(train, check=True, capture_output=True, cwd=REPO, timeout=1800, env=deterministic)
    original = results / "runs" / model / method / f"seed{seed}" / "metrics.jsonl"
    assert _without_timings(tmp_path / "run" / "metrics.jsonl") == _without_timings(original)

    benchmark = next(iter(study.benchmarks))
    evaluate = [
        sys.executable, "-m", "pipeline.evaluate", "--model", str(results / "models" / model / "start"),
        "--benchmark", str(workdir / "eval_data" / f"{benchmark}.jsonl"),
        "--spec", canonical_json(study.evaluation.spec), "--seed", str(seed), "--out", str(tmp_path / "base.jsonl"),
    ]  # fmt: skip
    subprocess.run(evaluate, check=True, capture_output=True, cwd=REPO, timeout=1800, env=deterministic)
    samples = results / "eval" / model / "base" / f"seed{seed}" / "start" / f"{benchmark}.jsonl"
    assert (tmp_path / "base.jsonl").read_text() == samples.read_text()
    for provenance in (tmp_path / "run" / "provenance.json", tmp_path / "base.provenance.json"):
        record = json.loads(provenance.read_text())["gpu"]
        assert record["gpu_determinism"] is True and record["deterministic_algorithms"] is True, provenance
        assert record["variables"] == gpu_determinism.ENVIRONMENT, provenance
