"""GPU determinism (pipeline.core.gpu_determinism): the study setting, checked and off by default, reaches the
training and evaluation jobs (their params and environment, from Snakemake's own planned DAG), a stage applies it
and records it, and the report says what the numbers can hold. That it changes no CPU number, and that both stages
apply and record it in a study, is checked on the CI study (tests/pipeline/test_workflow_e2e.py,
test_same_seed_same_metrics)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.core import gpu_determinism
from pipeline.core.io import InputError
from pipeline.core.provenance import NOT_RECORDED, gpu_determinism_section, gpu_fields
from pipeline.study.load import load_study
from pipeline.why_rerun import planned_workflow
from tests.shared_studies import CI_CONFIG, REPO

COMPUTING = ("train", "evaluate", "evaluate_analysed")  # the rules it is a param of
# A stage's process: apply and record without the request, then with it (torch's state is the process's own).
RECORD = f"""import json, os
from pipeline.core import gpu_determinism
gpu_determinism.apply()
records = [gpu_determinism.gpu_record()]
os.environ[{gpu_determinism.GPU_DETERMINISM_VARIABLE!r}] = "1"
gpu_determinism.apply()
print(json.dumps([*records, gpu_determinism.gpu_record()]))
"""


def test_the_setting_is_off_by_default_and_a_non_boolean_is_refused_by_name(tmp_path: Path) -> None:
    assert load_study([CI_CONFIG], check_inputs=False).gpu_determinism is False
    assert load_study([CI_CONFIG], {"gpu_determinism": True}, check_inputs=False).gpu_determinism is True
    config = yaml.safe_load(CI_CONFIG.read_text()) | {"gpu_determinism": "sometimes"}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(InputError, match="config key `gpu_determinism`"):
        load_study([tmp_path / "bad.yaml"], check_inputs=False)


def planned_params(directory: Path, monkeypatch: pytest.MonkeyPatch, *config: str) -> dict[str, list[dict]]:
    """``{rule: [params of each planned job]}`` of the CI study planned in the empty ``directory`` by Snakemake's
    API in this process (as ``why_rerun`` plans), the Snakefile's environment for its jobs put back afterwards."""
    monkeypatch.delenv(gpu_determinism.GPU_DETERMINISM_VARIABLE, raising=False)  # restored after the test
    args = argparse.Namespace(
        snakefile=str(REPO / "Snakefile"), directory=str(directory), config=list(config), configfile=[str(CI_CONFIG)]
    )
    with planned_workflow(args) as workflow:
        jobs = list(workflow.dag.needrun_jobs())
        return {rule: [dict(job.params) for job in jobs if job.rule.name == rule] for rule in COMPUTING}


def test_on_it_is_a_param_of_training_and_evaluation_and_in_every_jobs_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The jobs inherit the Snakefile's environment (pipeline.core.gpu_determinism.configure); the param reruns them
    when the setting changes, and is absent when off, so the studies made before it existed keep their params."""
    on = planned_params(tmp_path / "on", monkeypatch, "gpu_determinism=true")
    assert os.environ[gpu_determinism.GPU_DETERMINISM_VARIABLE] == "1"
    assert all(on.values())
    assert all(params["gpu_determinism"] == "on" for jobs in on.values() for params in jobs)
    off = planned_params(tmp_path / "off", monkeypatch)
    assert os.environ[gpu_determinism.GPU_DETERMINISM_VARIABLE] == "0"
    assert {rule: len(jobs) for rule, jobs in off.items()} == {rule: len(jobs) for rule, jobs in on.items()}
    assert not any("gpu_determinism" in params for jobs in off.values() for params in jobs)
    # the evaluations' rerun key (pipeline.core.rerun_key) covers it too
    keys = {state: {p["rerun_key"] for p in plan["evaluate"]} for state, plan in (("on", on), ("off", off))}
    assert keys["on"].isdisjoint(keys["off"])


def test_applied_in_a_stage_process_on_request_and_recorded_as_in_effect() -> None:
    """On this CPU machine: deterministic algorithms and the CUDA and NCCL variables, never vLLM's batch-invariant
    mode (its CPU worker would install CUDA-only kernels); without the request nothing is touched."""
    environment = {k: v for k, v in os.environ.items() if k not in gpu_determinism.OBSERVED}
    environment.pop(gpu_determinism.GPU_DETERMINISM_VARIABLE, None)
    done = subprocess.run([sys.executable, "-c", RECORD], env=environment, capture_output=True, text=True, check=True)
    off, on = json.loads(done.stdout)
    assert on["gpu_determinism"] is True and on["deterministic_algorithms"] is True
    assert on["cudnn_benchmark"] is False and on["variables"] == gpu_determinism.ENVIRONMENT
    assert on["devices"] == [] and on["processes"] == 1
    assert off == {**on, "gpu_determinism": False, "deterministic_algorithms": False, "variables": {}}


def test_the_report_says_what_gpu_numbers_can_hold() -> None:
    knobs = {"deterministic_algorithms": True, "cudnn_benchmark": False, "variables": gpu_determinism.ENVIRONMENT}
    h100 = {"gpu_determinism": True, **knobs, "devices": ["NVIDIA H100"] * 4, "processes": 4}
    on = gpu_determinism_section({"run": gpu_fields(h100), "eval": gpu_fields({**h100, "processes": 1})})
    assert "\n- GPU determinism on, GPUs NVIDIA H100 x 4, processes 4, deterministic algorithms on" in on
    assert "CUBLAS_WORKSPACE_CONFIG=:4096:8 FLASH_ATTENTION_DETERMINISTIC=1 NCCL_ALGO=Ring: 1 outputs (`run`)" in on
    assert "on for all 2 outputs made on GPUs, a rerun of each on the same GPU model and count (and processes)" in on
    assert "on another GPU model or count none is bitwise equal: compare through the seed spread" in on
    assert "Mixed" not in on and "is off" not in on
    upstream = {"gpu_determinism": False, "devices": ["NVIDIA A100"], "processes": 1}
    mixed = gpu_determinism_section({"run": gpu_fields(h100), "eval": gpu_fields(upstream)})
    assert "**GPU determinism is off** for 1 of the 2 outputs made on GPUs" in mixed
    assert "**Mixed GPU models** (NVIDIA A100; NVIDIA H100)" in mixed
    cpu = gpu_determinism_section({"run": gpu_fields({**h100, "devices": [], "processes": 1})})
    assert cpu.startswith("None of the 1 training runs and evaluations ran on a GPU (GPU determinism on;")
    # an output made before the GPU settings were recorded (read_gpu_records) is not said to have run on the CPU
    old = gpu_determinism_section({"old": dict.fromkeys(gpu_fields({}), NOT_RECORDED), "run": gpu_fields(h100)})
    assert "1 outputs were made before the GPU settings were recorded" in old and "None of" not in old
    assert "on for all 1 outputs made on GPUs, a rerun of each on the same GPU model and count" in old
