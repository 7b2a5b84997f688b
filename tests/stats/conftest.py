"""Fixtures of the statistics tests: synthetic per-sample evaluation files in the pipeline's layout."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from sample_rows import sample_rows

SamplesWriter = Callable[..., Path]


def _write_samples(
    root: Path, model: str, method: str, seed: int, checkpoint: str, benchmark: str, correct: dict[str, list[bool]]
) -> Path:
    """Write root/model/method/seed<seed>/checkpoint/benchmark.jsonl, one row per (item, sample).

    Sample j of an item has num_tokens = 10 (j + 1); a correct sample has extracted "1", a wrong one has
    extracted None (no answer), so no_answer = number of wrong samples.
    """
    path = root / model / method / f"seed{seed}" / checkpoint / f"{benchmark}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = sample_rows(correct)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def write_samples(tmp_path: Path) -> SamplesWriter:
    """write_samples(model, method, seed, checkpoint, benchmark, {id: [correct per sample]}) -> path."""

    def write(*args, **kwargs) -> Path:
        return _write_samples(tmp_path / "eval", *args, **kwargs)

    return write
