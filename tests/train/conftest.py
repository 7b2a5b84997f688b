"""Fixtures for the training-stage tests: a briefly warmed-up tiny model and training rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_support import training_rows, warm_up

from pipeline.models.tiny_model import TinyModelSpec, save_tiny_model


@pytest.fixture(scope="session")
def untrained_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(TinyModelSpec(), tmp_path_factory.mktemp("untrained") / "model")


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = save_tiny_model(TinyModelSpec(), tmp_path_factory.mktemp("tiny") / "model")
    warm_up(directory)
    return directory


@pytest.fixture(scope="session")
def train_jsonl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in training_rows(32, seed=1)), encoding="utf-8")
    return path
