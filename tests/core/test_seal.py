"""Seals (pipeline.core.seal): a sealed output that is cut (at a line boundary or mid-line), changed or incomplete is
found, named, and refused by its readers; an unsealed one is taken as it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core import seal
from pipeline.core.io import InputError, publish_directory, publish_jsonl, read_jsonl
from pipeline.models.loading import check_model_files

ROWS = [{"id": f"q{index}", "sample": 0, "correct": index % 2 == 0} for index in range(10)]


@pytest.fixture
def samples(tmp_path: Path) -> Path:
    path = tmp_path / "arith_add.jsonl"
    publish_jsonl(path, ROWS)
    return path


def test_a_published_file_is_sealed_with_its_rows_size_and_digest(samples: Path) -> None:
    record = json.loads((samples.parent / "arith_add.jsonl.seal.json").read_text())
    assert record["format"] == "grail-seal/1"
    entry = record["files"]["."]
    assert entry["lines"] == 10 and entry["bytes"] == samples.stat().st_size and len(entry["sha256"]) == 64
    assert seal.seal_problem(samples) is None
    assert read_jsonl(samples) == ROWS


def test_a_file_cut_at_a_line_boundary_is_damaged_and_refused_by_its_readers(samples: Path) -> None:
    lines = samples.read_text().splitlines(keepends=True)
    samples.write_text("".join(lines[:6]))
    problem = seal.seal_problem(samples)
    assert problem == f"6 lines, {len(''.join(lines[:6]))} bytes, but sealed with 10 lines, {len(''.join(lines))} bytes"
    with pytest.raises(InputError, match=r"arith_add\.jsonl: damaged: 6 lines, .* a plain `snakemake` run writes it"):
        read_jsonl(samples)


def test_a_changed_row_of_the_same_size_is_damaged(samples: Path) -> None:
    samples.write_text(samples.read_text().replace('"q1"', '"q7"', 1))
    assert seal.seal_problem(samples) == "same size, but its SHA-256 differs from the sealed one"


def test_an_unsealed_file_is_taken_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text('{"id": "a"}\n')
    assert seal.seal_problem(path) is None
    assert read_jsonl(path) == [{"id": "a"}]


@settings(max_examples=40, deadline=None)
@given(cut=st.integers(min_value=0, max_value=10_000))
def test_every_cut_of_a_sealed_file_is_found(tmp_path_factory: pytest.TempPathFactory, cut: int) -> None:
    path = tmp_path_factory.mktemp("cut") / "rows.jsonl"
    publish_jsonl(path, ROWS)
    data = path.read_bytes()
    path.write_bytes(data[: cut % len(data)])
    assert seal.seal_problem(path) is not None


def model_directory(tmp_path: Path) -> Path:
    staging, model = tmp_path / "staging", tmp_path / "final"
    staging.mkdir()
    (staging / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"]}')
    (staging / "model.safetensors").write_bytes(b"\0" * 4096)
    publish_directory(staging, model)
    return model


def test_a_published_directory_is_sealed_and_a_missing_file_is_named(tmp_path: Path) -> None:
    model = model_directory(tmp_path)
    assert sorted(json.loads((model / "seal.json").read_text())["files"]) == ["config.json", "model.safetensors"]
    assert seal.seal_problem(model) is None
    (model / "config.json").unlink()
    assert seal.seal_problem(model) == "config.json: missing"
    with pytest.raises(InputError, match=r"final: damaged: config\.json: missing"):
        check_model_files(str(model))


def test_a_file_over_the_hash_limit_is_sealed_by_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seal, "HASH_LIMIT", 1024)
    model = model_directory(tmp_path)
    assert json.loads((model / "seal.json").read_text())["files"]["model.safetensors"] == {"bytes": 4096}
    (model / "model.safetensors").write_bytes(b"\1" * 4096)  # same size: not read, not found
    assert seal.seal_problem(model) is None
    (model / "model.safetensors").write_bytes(b"\0" * 4000)
    assert seal.seal_problem(model) == "model.safetensors: 4000 bytes, but sealed with 4096 bytes"
