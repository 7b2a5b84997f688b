"""A truncated weights or tokenizer file is refused with exit status 2 and a message naming it, by every stage that
loads a model (pipeline.models.loading.check_model_files, called by both loaders): training, evaluation on the hf backend
and on the vllm backend (refused before the engine starts, so no vLLM is needed here), token analysis. Each stage
runs in-process through its CLI wrapper and stops before loading anything.
(Checked by breaking it: with check_model_files a no-op, training and token analysis die of a SafetensorError
traceback, and the tokenizer cases name only the directory.)"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline import evaluate, token_analysis, train
from pipeline.core.io import run_cli
from pipeline.models.tiny_model import TinyModelSpec, save_tiny_model

ROW = {"id": "r0", "prompt": [{"role": "user", "content": "1+1=?"}], "solution": "2", "source": "t"}
ITEM = {"id": "r0", "problem": "1+1=?", "answer": "2", "source": "t"}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(TinyModelSpec(), tmp_path_factory.mktemp("tiny") / "model")


def truncated_copy(model: Path, name: str, directory: Path) -> Path:
    """A copy of ``model`` whose file ``name`` keeps only its first half."""
    copy = shutil.copytree(model, directory / "model")
    damaged = copy / name
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    return copy


def train_argv(model: Path, tmp_path: Path) -> list[str]:
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps(ROW) + "\n", encoding="utf-8")
    return [
        "--model", str(model), "--training-spec", '{"max_steps": 1, "bf16": false}', "--method-spec", "{}",
        "--data", str(data), "--seed", "0", "--out", str(tmp_path / "run"),
    ]  # fmt: skip


def evaluate_argv(backend: str) -> Callable[[Path, Path], list[str]]:
    def argv(model: Path, tmp_path: Path) -> list[str]:
        benchmark = tmp_path / "bench.jsonl"
        benchmark.write_text(json.dumps(ITEM) + "\n", encoding="utf-8")
        spec = json.dumps({"backend": backend, "n_samples": 1})
        out = tmp_path / "samples.jsonl"
        return ["--model", str(model), "--benchmark", str(benchmark), "--spec", spec, "--seed", "0", "--out", str(out)]

    return argv


def token_analysis_argv(model: Path, tmp_path: Path) -> list[str]:
    samples, benchmark = tmp_path / "samples.jsonl", tmp_path / "bench.jsonl"
    return ["--checkpoint", "c", str(model), str(samples), "--benchmark", str(benchmark), "--out-dir", str(tmp_path)]


STAGES = {
    "train": (train.main, train_argv),
    "evaluate-hf": (evaluate.main, evaluate_argv("hf")),
    "evaluate-vllm": (evaluate.main, evaluate_argv("vllm")),
    "token_analysis": (token_analysis.main, token_analysis_argv),
}


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json"])
@pytest.mark.parametrize("stage", STAGES)
def test_a_truncated_model_file_exits_2_naming_it(tiny_model, tmp_path, capsys, stage, name):
    main, argv = STAGES[stage]
    model = truncated_copy(tiny_model, name, tmp_path)
    with pytest.raises(SystemExit) as stop:
        run_cli(main, argv(model, tmp_path))
    assert stop.value.code == 2
    assert f"error: {model / name}: damaged model file: {name} unreadable (" in capsys.readouterr().err
    assert not (tmp_path / "run").exists() and not (tmp_path / "samples.jsonl").exists()
