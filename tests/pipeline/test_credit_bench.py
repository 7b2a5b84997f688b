"""configs/credit_bench.yaml, reduced to what CI affords, end to end through the real Snakemake: the decisive-step
task, GRPO, the oracle and the grail_shuffled control, and KTAE scored without training (``placement_only``); the
credit placement stage, its report section and the viewer's decisive tokens; then a changed placement setting,
rerun, which reruns the placement and the report alone.

Only sizes are reduced (warm-up, steps, seeds, items, rollouts) and the methods cut to three; every other key is the
study's own, so a change to configs/credit_bench.yaml that breaks the comparison fails here. The full comparison
(4 seeds, 250 steps, five methods, about an hour on two cores) is not run in CI; docs/credit-methods.md has its
numbers.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
METHODS = ("grpo", "oracle", "grail_shuffled")


def reduced(config: dict[str, Any]) -> dict[str, Any]:
    """The study with sizes cut: the default study's 90 warm-up steps (the policy then miscopies operands, so
    groups are mixed and rollouts carry advantages), 2 RL steps of 2 prompts x 8, one seed, 16 items x 4 samples."""
    config = copy.deepcopy(config)
    config["methods"] = {name: config["methods"][name] for name in METHODS} | {"ktae": {"credit": "ktae"}}
    config["credit_truth"] = {"placement_only": ["ktae"]}
    config["seeds"] = [0]
    config["data"]["generated"]["count"] = 200
    config["benchmarks"]["decisive"]["generated"]["count"] = 16
    config["models"]["tiny"]["warmup"]["steps"] = 90
    config["training"].update(max_steps=2, save_steps=2, logging_steps=1, per_device_train_batch_size=16)
    config["evaluation"].update(baseline=False, checkpoints=["final"])
    config["token_analysis"].update(enabled=False, checkpoints=["final"])
    config["significance"]["resamples"] = 200
    config["token_viewer"]["rollouts"] = 1
    return config


def snakemake(directory: Path, config: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(directory),
        "--cores", "2", "--configfile", str(config), *extra,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=1500)
    logs = sorted((directory / "results").rglob("logs/**/*.log"))
    failed = "".join(f"\n--- {log}\n{log.read_text()[-2500:]}" for log in logs if "rror" in log.read_text())
    assert result.returncode == 0, result.stderr[-4000:] + failed
    return result


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One Snakemake run of the reduced study: its directory and config."""
    directory = tmp_path_factory.mktemp("credit_bench")
    config = directory / "credit_bench_ci.yaml"
    config.write_text(yaml.safe_dump(reduced(yaml.safe_load((REPO / "configs" / "credit_bench.yaml").read_text()))))
    snakemake(directory, config)
    return directory, config


def results_of(directory: Path) -> Path:
    return directory / "results" / "credit_bench"


def test_placement_scores_the_oracle_at_1_and_the_shuffled_control_at_chance_outside_the_box(study) -> None:
    result = json.loads((results_of(study[0]) / "credit_placement/tiny/placement.json").read_text())
    assert set(result["placement"]) == {"oracle", "grail_shuffled", "ktae"}  # GRPO weights no token
    for key, score in result["placement"]["oracle"].items():
        assert score["rollouts"] > 0 and score["mean"] == 1.0, key
    shuffled = result["placement"]["grail_shuffled"]
    for key in ("credit_outside_answer", "blame_outside_answer"):
        assert shuffled[key]["rollouts"] > 0 and shuffled[key]["low"] <= 0.5 <= shuffled[key]["high"], key
    assert set(result["accuracy"]) == set(METHODS)  # KTAE is scored, not trained: no runs, no accuracy
    assert result["placement"]["ktae"]["credit"]["rollouts"] == result["placement"]["oracle"]["credit"]["rollouts"]
    assert not (results_of(study[0]) / "runs" / "tiny" / "ktae").exists()


def test_the_report_and_the_viewer_show_the_placement(study) -> None:
    results = results_of(study[0])
    report = (results / "report.md").read_text()
    assert "## Credit placement" in report and "![credit placement](credit_placement/tiny/placement.png)" in report
    assert "(placement only: ktae)" in report
    assert "| oracle | 1.000 [1.000, 1.000] | 1.000 [1.000, 1.000] |" in report
    assert ("| method | accuracy (mean over runs) | gap share" in report) != ("No gap share" in report)
    page = (results / "token_weights.html").read_text()
    assert 'class="token decisive"' in page and "data-auroc=" in page


def test_a_changed_placement_setting_reruns_the_placement_and_the_report_alone(study) -> None:
    directory, config = study
    summary = results_of(directory) / "credit_placement/tiny/placement.json"
    before = json.loads(summary.read_text())["rollouts"]
    rerun = snakemake(directory, config, "--config", "credit_truth={max_rollouts: 3}")
    stats = rerun.stderr.split("Job stats:", 1)[1]
    ran = {rule for rule, _ in re.findall(r"^(\w+)\s+(\d+)$", stats, flags=re.MULTILINE)} - {"total"}
    assert ran == {"credit_placement", "report", "all"}, ran
    after = json.loads(summary.read_text())["rollouts"]
    assert 3 <= after < 3 + 4 and before > after  # whole groups of 4 samples until at least 3 are held
