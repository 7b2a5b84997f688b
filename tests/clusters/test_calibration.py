"""The expected cost: the prediction's formulas with known answers (pipeline.study.calibration), what the preflight
prints beside the bounds (measured, not measured), and, on a finished study, a real `python -m pipeline.calibrate`
and the report's predicted-against-actual section built by the report rule."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline import calibrate, power
from pipeline.report import cost_section
from pipeline.study import actuals, calibration, cost, plan
from pipeline.study.calibration import BENCHMARKS_DIR, CALIBRATION_FILE
from pipeline.study.config import Study
from pipeline.study.load import load_study
from tests.shared_studies import CI_CONFIG, CI_CONFIG_FILES, EXAMPLES_DIR, PLUGIN_CONFIG, with_examples

from .conftest import REPO, study

PAPER = REPO / "configs" / "paper.yaml"
DEFAULT = REPO / "configs" / "default.yaml"


def test_the_prediction_formulas_give_their_known_answers() -> None:
    # completions may grow 1.5x, but never past the token limit, and never shrink
    assert calibration.growth_factor(1.5, 24, 40) == 1.5
    assert calibration.growth_factor(1.5, 30, 33) == pytest.approx(1.1)
    assert calibration.growth_factor(1.5, 50, 40) == 1.0
    # 10 s fixed, 2 +- 0.5 s a step, 100 steps, growth 1.5: low 10 + 100 x 1.5, high 10 + 100 x 2.5 x (1 + 1.5) / 2
    assert calibration.train_seconds(10, 2, 0.5, 100, 1.5) == calibration.Range(160, 210, 322.5)
    assert calibration.train_seconds(10, 0.2, 0.5, 100, 1.0).low == 10  # a step never costs less than nothing
    # 100 sequences x 20 tokens x 10 ms; a lengthened checkpoint 1.5x that
    assert calibration.generation_seconds(100, 20, 0.01, 1.5) == calibration.Range(20, 20, 30)
    assert calibration.time_limit_minutes(322.5, 1.5) == 9  # ceil(483.75 s / 60)
    assert calibration.time_limit_minutes(1, 1.0) == 1
    # 20 h of training at a 10 h limit that warns 600 s before its end: ceil(72000 / 35400)
    assert calibration.windows_needed(20 * 3600, 600, 600) == 3
    assert calibration.windows_needed(60, 600, 600) == 1
    assert calibration.warning_lead_s("--signal=USR1@600 --exclusive") == 600
    assert calibration.warning_lead_s("--signal=B:USR1@300") == 300
    assert calibration.warning_lead_s(None) == 0
    assert calibration.spread([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert calibration.spread([4.0]) == (4.0, 0.0)


def test_other_processes_share_of_a_measurements_cpus_has_its_known_answers() -> None:
    before = calibrate.CpuCounters(busy_s=100.0, own_s=10.0, at_s=0.0)
    # 10 s of wall time: the CPUs were busy 17 s, 12 of them this process and its children: 0.5 cores of others
    assert calibrate.other_cores(before, calibrate.CpuCounters(117.0, 22.0, 10.0)) == 0.5
    assert calibrate.other_cores(before, calibrate.CpuCounters(105.0, 16.0, 10.0)) == 0.0  # never below 0
    assert calibrate.competition_warning("evaluate smol", 0.25, 2) is None
    warning = calibrate.competition_warning("evaluate smol", 0.9, 2)
    assert warning is not None and "while measuring evaluate smol, other processes kept 0.90 of its 2 CPUs" in warning


def test_a_process_competing_for_the_cpus_is_counted_and_the_measurements_own_child_is_not() -> None:
    """On the real counters: a spinning process that is not waited for within the block counts as competition;
    a child that is waited for counts as the measurement's own CPU time (a lower bound on CPU seconds, which other
    tests' load can only raise, so the assertions hold on a busy CI machine)."""
    cpus = frozenset(os.sched_getaffinity(0))
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        found: dict[str, float] = {}
        with calibrate.cpu_competition(found):
            time.sleep(3)
    finally:
        spinner.kill()
        spinner.wait()
    assert found["other_cores"] >= 0.3
    before = calibrate.CpuCounters.read(cpus)
    subprocess.run(
        [sys.executable, "-c", "import time\nend = time.process_time() + 1.5\nwhile time.process_time() < end: pass"],
        check=True,
    )
    after = calibrate.CpuCounters.read(cpus)
    assert after.own_s - before.own_s >= 1.5


def test_benchmark_files_match_jobs_by_their_wildcard_values_in_either_evaluation_layout() -> None:
    job = {"model": "tiny", "method": "grpo", "seed": "0", "checkpoint": "final"}
    assert actuals.labels_match(("tiny", "grpo", "seed0", "final"), job)
    assert actuals.labels_match(("final", "seed0", "grpo", "tiny"), job)  # no fixed order
    assert not actuals.labels_match(("tiny", "grpo", "seed1", "final"), job)
    assert not actuals.labels_match(("tiny", "grpo", "seed0", "final", "arith_add"), job)
    per_checkpoint = actuals.benchmarked_jobs(study(DEFAULT), "evaluate")
    per_benchmark = actuals.benchmarked_jobs(
        load_study([DEFAULT], {"evaluation": {"job_per": "benchmark"}}), "evaluate"
    )
    # 6 runs at final and 2 baselines on both benchmarks, 2 GRAIL runs at the step only the token analysis needs
    assert sorted((rule, len(benchmarks)) for rule, _, benchmarks in per_checkpoint) == [
        *[("evaluate", 2)] * 8,
        *[("evaluate_analysed", 1)] * 2,
    ]
    assert len(per_benchmark) == 18 and all(rule == "evaluate" for rule, _, _ in per_benchmark)
    file = ("tiny", "grail", "seed0", "step-125")
    assert [job for job in per_checkpoint if actuals.labels_match(file, job[1])] == [
        (
            "evaluate_analysed",
            {"model": "tiny", "method": "grail", "seed": "0", "checkpoint": "step-125"},
            ("arith_add",),
        )
    ]


def synthetic_calibration(
    subject: Study, *, step_s: float, startup_s: float, tokens: float, seconds_per_token: float
) -> dict[str, Any]:
    """A calibration record of ``subject``'s own settings with the given figures (no spread)."""
    return {
        "measured_at": "2026-12-04T00:00:00+00:00",
        "hardware": {"cpu": "test CPU", "cpus": 2, "gpus": ["H200"] * 4},
        "train": {
            f"{model}/{method}": {
                "settings": calibration.train_settings(subject, model, method),
                "step_s": step_s,
                "step_sd_s": 0.0,
                "startup_s": startup_s,
                "completion_tokens": tokens,
            }
            for model in subject.models
            for method in subject.methods
        },
        "evaluate": {
            model: {
                "settings": calibration.evaluate_settings(subject, model),
                "startup_s": startup_s,
                "benchmarks": {
                    name: {"tokens_per_sequence": tokens, "seconds_per_token": seconds_per_token}
                    for name in subject.benchmarks
                },
            }
            for model in subject.models
        },
    }


def test_an_evaluation_job_per_checkpoint_starts_its_engine_once_for_all_its_benchmarks() -> None:
    default = study(DEFAULT)
    record = synthetic_calibration(default, step_s=1, startup_s=10, tokens=20, seconds_per_token=0.001)
    items = default.benchmark_sizes
    job = {"model": "tiny", "method": "grpo", "seed": "0", "checkpoint": "final"}
    one_job = calibration.predict_job(default, record, "evaluate", job, tuple(default.benchmarks), items)
    per_benchmark = [
        calibration.predict_job(default, record, "evaluate", {**job, "benchmark": name}, (name,), items)
        for name in default.benchmarks
    ]
    # 400 and 200 items x 4 samples x 20 tokens x 1 ms = 32 s + 16 s of generation, one 10 s start-up
    assert one_job.expected == pytest.approx(10 + 32 + 16)
    assert sum(p.expected for p in per_benchmark) == pytest.approx(one_job.expected + 10)
    # a trained checkpoint's completions may lengthen (1.5x: 30 of the 40 new tokens); the start model's were measured
    assert one_job.high == pytest.approx(10 + 1.5 * 48)
    base = {"model": "tiny", "method": "base", "seed": "0", "checkpoint": "start"}
    start = calibration.predict_job(default, record, "evaluate", base, tuple(default.benchmarks), items)
    assert start.high == pytest.approx(10 + 48)
    # 250 steps of 1 s, 10 s fixed
    run = {"model": "tiny", "method": "grail", "seed": "1"}
    train = calibration.predict_job(default, record, "train", run, (), items)
    assert train == calibration.Range(260, 260, 10 + 250 * 1.25)

    # a finished study's benchmark files against the prediction: the per-checkpoint job's file is compared (60 s
    # against 58 s predicted), a per-benchmark file of an earlier plan is left out, other rules are not calibrated
    finished = [
        actuals.Actual("evaluate", ("tiny", "grpo", "seed0", "final"), 60.0),
        actuals.Actual("evaluate", ("tiny", "grpo", "seed0", "final", "arith_add"), 30.0),
        actuals.Actual("report", (), 3.0),
    ]
    evaluate, report = actuals.compare(default, record, finished, items)
    assert (evaluate.jobs, evaluate.measured_jobs, evaluate.unplanned) == (1, 1, 1)
    assert evaluate.ratio == pytest.approx(60 / 58)
    assert (report.rule, report.jobs, report.predicted_hours) == ("report", 1, None)


def test_the_preflight_cost_table_shows_expected_beside_the_bound_and_says_what_is_measured(tmp_path: Path) -> None:
    paper = study(PAPER)
    jobs = [cost.PlannedJob("train", {k: str(v) for k, v in run.items()}, gpus=4, runtime=600) for run in paper.runs()]
    record = synthetic_calibration(paper, step_s=60, startup_s=600, tokens=1000, seconds_per_token=0.01)
    path = Path("calibration.json")
    estimate = plan.estimate(paper, jobs, 16, record, path)
    expected = estimate["expected"]
    # each run: 600 s + 200 steps x 60 s = 3.5 h on 4 GPUs
    assert expected["rules"]["train"]["status"] == "measured"
    assert expected["gpu_hours"]["expected"] == pytest.approx(len(jobs) * 4 * 3.5)
    assert expected["rules"]["train"]["proposed_limit_min"]["qwen3_8b"] == calibration.time_limit_minutes(
        600 + 200 * 60 * (1 + 1.5) / 2, 1.5
    )
    table = plan.cost_table(estimate)
    train_line = next(line for line in table.splitlines() if line.startswith("train"))
    assert f"{len(jobs) * 4 * 10:.0f}" in train_line  # the bound at the 10 h limits, unchanged
    assert f"{len(jobs) * 4 * 3.5:.0f} [" in train_line and train_line.endswith("measured")
    assert "expected: measured: calibration.json" in table
    assert "training time windows at the configured limits: 1 needed" in table

    unmeasured = plan.cost_table(plan.estimate(paper, jobs, 16, None, path))
    assert next(line for line in unmeasured.splitlines() if line.startswith("train")).endswith("not measured")
    assert "expected: not measured: no calibration at calibration.json" in unmeasured
    # the planner's line for the configured design
    written = tmp_path / "calibration.json"
    written.write_text(json.dumps(record))
    line = power.expected_line(argparse.Namespace(configfile=PAPER, calibration=written), jobs)
    assert line.startswith(f"configured design: GPU-h bound {len(jobs) * 40:,.0f}; expected {len(jobs) * 14:,.1f} [")
    assert "(train measured); measured: " in line
    missing = power.expected_line(argparse.Namespace(configfile=PAPER, calibration=tmp_path / "none.json"), jobs)
    assert "(train not measured); not measured: no calibration" in missing
    # a calibration of other settings measures nothing of this study
    stale = json.loads(json.dumps(record).replace('\\"max_completion_length\\":', '\\"max_completion_length\\":1'))
    assert plan.estimate(paper, jobs, 16, stale, path)["expected"]["rules"]["train"]["status"] == "not measured"


def test_the_warning_lead_follows_the_measured_step_and_save(tmp_path: Path) -> None:
    """Training's warning lead: margin x (slowest step + save) where the run was measured, the study's 600
    where not (or measured without a save), never under the floor, none where the study asks for none; and the
    plan (the Snakefile's resources, as the preflight and the launcher see them) carries it. Broken by a Snakefile
    that keeps the config's lead: 600 planned."""
    paper = study(PAPER)
    run = {"model": "qwen3_8b", "method": "grail"}
    record = synthetic_calibration(paper, step_s=40, startup_s=600, tokens=1000, seconds_per_token=0.01)
    assert calibration.warning_lead(paper, record, run) is None  # no save measured: the config's @600 stands
    for measured in record["train"].values():
        measured.update(step_sd_s=10.0, save_s=120.0)
    growth = calibration.growth_factor(
        1.5, 1000, int(paper.effective_training("qwen3_8b", "grail")["max_completion_length"])
    )
    lead = math.ceil(1.5 * ((40 + 10) * growth + 120))
    assert calibration.warning_lead(paper, record, run) == lead
    assert calibration.warning_lead(paper, None, run) is None
    quick = json.loads(json.dumps(record))
    for measured in quick["train"].values():
        measured.update(step_s=0.5, step_sd_s=0.0, save_s=2.0)
    assert calibration.warning_lead(paper, quick, run) == calibration.WARNING_FLOOR_S
    assert calibration.training_warning_lead(paper, quick, run) == calibration.WARNING_FLOOR_S
    assert calibration.training_warning_lead(paper, None, run) == 600  # configs/paper.yaml's time_limit_warning_s
    assert calibration.training_warning_lead(study(DEFAULT), quick, {"model": "tiny", "method": "grpo"}) == 0

    written = tmp_path / "calibration.json"
    written.write_text(json.dumps(record))
    target = f"{paper.results_dir}/runs/qwen3_8b/grail/seed{paper.seeds[0]}/final"
    placed = {f"{paper.results_dir}/{CALIBRATION_FILE}": written}
    (train,) = [job for job in plan.plan(None, PAPER, [target, "--until", "train"], placed) if job.rule == "train"]
    assert train.resources["time_limit_warning_s"] == lead, train.resources


def test_a_save_lasts_from_the_first_file_of_the_last_checkpoint_to_its_last(tmp_path: Path) -> None:
    for step, written in ((2, (100.0, 104.0)), (10, (200.0, 201.5, 207.5)), (4, (300.0, 390.0))):
        for index, mtime in enumerate(written):
            path = tmp_path / f"checkpoint-{step}" / "global_step" / f"file{index}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
            os.utime(path, (mtime, mtime))
    assert calibrate.checkpoint_save_seconds(tmp_path) == 7.5  # checkpoint-10, not the newest-named or oldest
    assert calibrate.checkpoint_save_seconds(tmp_path / "none") is None


# ----------------------------------------------------------------------------------- on a finished study, for real


@pytest.fixture(scope="module")
def calibrated_study(finished_ci_study: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the finished CI study, calibrated for real for its GRPO runs (2 training steps) and its model's
    evaluation: one training job and one evaluation probe."""
    directory = tmp_path_factory.mktemp("calibrated") / "study"
    shutil.copytree(finished_ci_study, directory, symlinks=True)
    grpo_only = directory / "grpo_only.yaml"
    grpo_only.write_text("methods_only: [grpo]\n")
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.calibrate", "--configfile", str(CI_CONFIG), str(grpo_only), "--steps", "2"],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=600,
        env=with_examples(REPO),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "calibrate: 100%" in result.stderr  # the progress bar
    return directory


def test_calibrate_measures_training_steps_and_evaluation_batches_of_the_study(calibrated_study: Path) -> None:
    record = json.loads((calibrated_study / "results" / CALIBRATION_FILE).read_text())
    assert set(record["train"]) == {"tiny/grpo"}
    grpo = record["train"]["tiny/grpo"]
    assert grpo["steps"] == 2 and len(grpo["step_times_s"]) == 2
    assert grpo["step_s"] > 0 and grpo["startup_s"] > 0 and 0 < grpo["completion_tokens"] <= 32
    assert grpo["save_s"] > 0  # the checkpoint of its last step: config.json first, trainer_state.json last
    evaluation = record["evaluate"]["tiny"]
    assert evaluation["backend"] == "hf" and evaluation["startup_s"] > 0
    assert set(evaluation["benchmarks"]) == {"arith_add", "arith_add_hard"}
    # one batch of the study's batch size: 32 (item, sample) units
    assert all(batch["sequences"] == 24 for batch in evaluation["benchmarks"].values())  # 12 items x 2 samples
    assert record["hardware"]["cpus"] and record["code"]["commit"]
    assert grpo["other_cores"] >= 0 and evaluation["other_cores"] >= 0
    assert not list((calibrated_study / "results").glob("calibration-*"))  # the scratch runs are gone


def test_the_report_puts_the_prediction_beside_the_actuals_and_says_not_measured_without_one(
    calibrated_study: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES_DIR))  # the CI study's out-of-tree method, examples.halfway
    snakemake = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]
    result = subprocess.run(
        [*snakemake, "results/report.md", "--directory", str(calibrated_study), "--cores", "1", *CI_CONFIG_FILES],
        capture_output=True,
        text=True,
        timeout=600,
        env=with_examples(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = (calibrated_study / "results" / "report.md").read_text()
    section = report.split("## Cost: predicted and actual", 1)[1].split("##", 1)[0]
    header, _, *lines = [line.strip("|").split(" | ") for line in section.splitlines() if line.startswith("|")]
    rows = {cells[0].strip(): dict(zip([name.strip() for name in header], cells, strict=True)) for cells in lines}
    assert "Prediction: measured:" in section
    assert rows["train"]["prediction"].strip() == "1 of 4 jobs"  # the GRPO run; the other methods were not calibrated
    evaluations = len(ci_study().evaluation_jobs())  # one model: its one probe measures every evaluation
    assert rows["evaluate"]["prediction"].strip() == f"{evaluations} of {evaluations} jobs"
    assert float(rows["train"]["actual / predicted"]) > 0 and float(rows["evaluate"]["actual / predicted"]) > 0
    assert float(rows["train"]["their CPU h"]) > 0
    assert rows["report"]["prediction"].strip() == "not calibrated"

    without = cost_section(ci_study().config, calibrated_study / "results" / BENCHMARKS_DIR, None)
    assert "Prediction: not measured: no calibration" in without
    assert "| train | 4 |" in without and without.count("| not measured |") == 2


def ci_study() -> Study:
    """The CI study as its controller plans it (with the plugin's method)."""
    return load_study([CI_CONFIG, PLUGIN_CONFIG])
