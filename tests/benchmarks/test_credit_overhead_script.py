"""benchmarks/credit_overhead.py --model DIR: the script measures the model directory it is given and writes each
method's step time and peak memory with their ratios over GRPO from the same run (speed itself is never asserted)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.models.tiny_model import TinyModelSpec, build_model, build_tokenizer, save_tiny_model

REPO = Path(__file__).resolve().parents[2]
MEASURES = ("step_time_s", "step_cpu_time_s", "peak_mem_mb")
RATIOS = ("step_time_x_grpo", "step_cpu_time_x_grpo", "peak_mem_x_grpo")


def test_measures_the_given_model_directory_and_writes_ratios_over_grpo(tmp_path):
    spec = TinyModelSpec(num_hidden_layers=3, seed=1)  # a shape that no --arch builds
    model_dir = save_tiny_model(spec, tmp_path / "model")
    out = tmp_path / "overhead.json"
    command = [sys.executable, str(REPO / "benchmarks" / "credit_overhead.py"), "--model", str(model_dir)]
    command += ["--methods", "grpo", "grail", "examples.halfway"]  # the out-of-tree example by import path
    command += ["--repeats", "1", "--warmup-rounds", "1", "--rounds", "1"]
    command += ["--prompts-per-round", "1", "--completion-length", "24", "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "docs")])}
    subprocess.run(command, check=True, cwd=tmp_path, capture_output=True, text=True, env=env)

    result = json.loads(out.read_text())
    settings, methods = result["settings"], result["methods"]
    assert settings["model"] == str(model_dir)
    parameters = sum(p.numel() for p in build_model(spec, build_tokenizer()).parameters())
    assert settings["model_shape"] == {"parameters": parameters, "vocab_size": 100, "layers": 3, "hidden_size": 128}
    assert list(methods) == ["grpo", "grail", "examples.halfway"]
    for row in methods.values():
        assert all(math.isfinite(row[key]) and row[key] > 0 for key in (*MEASURES, *RATIOS))
    assert [methods["grpo"][ratio] for ratio in RATIOS] == [1.0, 1.0, 1.0]
    for measure, ratio in zip(MEASURES, RATIOS, strict=True):
        assert methods["grail"][ratio] == pytest.approx(methods["grail"][measure] / methods["grpo"][measure])
    # the replayed completions end in a box in the model's own tokens: GRAIL finds answers to reweight
    assert 0 < methods["grail"]["saliency_rows_frac"] <= 1


def test_kernel_pin_both_measures_each_method_pinned_and_native_side_by_side(tmp_path):
    """``--kernel-pin both``: every method twice, on the kernel path each row says, with the pin's cost."""
    model_dir = save_tiny_model(TinyModelSpec(num_hidden_layers=1, seed=1), tmp_path / "model")
    out = tmp_path / "pin.json"
    command = [sys.executable, str(REPO / "benchmarks" / "credit_overhead.py"), "--model", str(model_dir)]
    command += ["--methods", "grpo", "--kernel-pin", "both", "--repeats", "1", "--warmup-rounds", "1"]
    command += ["--rounds", "1", "--prompts-per-round", "1", "--completion-length", "24", "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(command, check=True, cwd=tmp_path, capture_output=True, text=True, env=env)

    result = json.loads(out.read_text())
    native = result["settings"]["kernel_paths"]["grpo@native"]
    assert result["settings"]["kernel_paths"]["grpo"] == "pinned AVX2" and native.startswith("native ")
    grpo = result["methods"]["grpo"]
    assert grpo["step_cpu_time_x_native"] == pytest.approx(
        grpo["step_cpu_time_s"] / result["methods"]["grpo@native"]["step_cpu_time_s"]
    )
