"""Fixtures for the evaluation and warm-up tests: a tiny random model and small benchmark/training files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.models.tiny_model import TinyModelSpec, save_tiny_model
from pipeline.tasks.arith import ArithmeticSpec, arithmetic_problems
from pipeline.tasks.prompts import build_prompt

FAST_SPEC = {
    "backend": "hf",
    "n_samples": 2,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "max_new_tokens": 6,
    "batch_size": 4,
}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def benchmark_rows(count: int, seed: int = 7) -> list[dict]:
    problems = arithmetic_problems(ArithmeticSpec(count=count, seed=seed), id_prefix="bench")
    return [{"id": p["id"], "problem": p["problem"], "answer": p["answer"], "source": "arith"} for p in problems]


def training_rows(count: int, seed: int = 0) -> list[dict]:
    problems = arithmetic_problems(ArithmeticSpec(count=count, seed=seed))
    return [
        {
            "id": p["id"],
            "prompt": [{"role": "user", "content": build_prompt(p["problem"])}],
            "solution": p["answer"],
            "source": "generated",
        }
        for p in problems
    ]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(TinyModelSpec(seed=0), tmp_path_factory.mktemp("tiny") / "model")
