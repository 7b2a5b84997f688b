"""Bad inputs the stage owners' tests do not already cover (tests/faults/README.md lists the whole catalogue).

Each case asserts the exact message (naming the file, line, field or key) or the counted fallback, and that
nothing else was written or changed: no run directory, no output, other files byte for byte the same.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch
from fault_support import small_study, snakemake_command, stage_env, write_study
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import train
from pipeline.core.io import InputError
from pipeline.credit.grail import grail_weights_with_stats
from pipeline.evaluation import eval_spec, sampling

GOOD_ROW = {"id": "r0", "prompt": [{"role": "user", "content": "1+1=?"}], "solution": "2", "source": "t"}


# --------------------------------------------------------------------------------------- the workflow's config


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c["training"].update(max_steps="many"), "config key `training.max_steps`: 'many' is not of type"),
        (lambda c: c["evaluation"].update(n_sample=3), "config key `evaluation.n_sample`: unknown key"),
        (lambda c: c["token_analysis"].update(enabled=True, benchmark="math500"), "`token_analysis.benchmark`"),
    ],
    ids=["type-error", "unknown-nested-key", "unknown-benchmark-reference"],
)
def test_snakemake_refuses_a_bad_config_before_any_job(tmp_path: Path, edit, message: str) -> None:
    config = small_study()
    edit(config)
    write_study(tmp_path, config)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "kept.txt").write_text("another study's output\n")
    before = snapshot(tmp_path / "results")
    result = subprocess.run(
        [*snakemake_command(tmp_path), "--dry-run"], cwd=tmp_path, env=stage_env(), capture_output=True, text=True
    )
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
    assert snapshot(tmp_path / "results") == before
    assert not (tmp_path / "eval_data").exists()


# --------------------------------------------------------------------------------------- training stage


def train_args(tmp_path: Path, rows_text: str, **override: str) -> list[str]:
    data = tmp_path / "train.jsonl"
    data.write_text(rows_text, encoding="utf-8")
    args = {
        "--model": str(tmp_path / "model"),
        "--training-spec": json.dumps({"max_steps": 2, "bf16": False}),
        "--method-spec": json.dumps({"credit": "grpo"}),
        "--data": str(data),
        "--seed": "0",
        "--out": str(tmp_path / "run"),
        **override,
    }
    return [token for pair in args.items() for token in pair]


def line(row: object) -> str:
    return json.dumps(row) + "\n"


@pytest.mark.parametrize(
    ("rows_text", "override", "message"),
    [
        (
            line(GOOD_ROW) + line({**GOOD_ROW, "solution": 2}),
            {},
            "train.jsonl:2: field 'solution' must be a str, got int",
        ),
        (line([GOOD_ROW]), {}, "train.jsonl:1: expected a JSON object, got list"),
        ("\n\n", {}, "train.jsonl: no training rows"),
        (line({**GOOD_ROW, "prompt": []}), {}, "train.jsonl:1: field 'prompt' must be a non-empty list"),
        (line(GOOD_ROW), {"--training-spec": '{"max_steps": 2,}'}, "training spec: inline JSON argument is not valid"),
        (line(GOOD_ROW), {"--method-spec": "no/such/method.yaml"}, "method spec: no/such/method.yaml: spec file not"),
        (
            line(GOOD_ROW),
            {"--training-spec": '{"bf16": false, "per_device_train_batch_size": 6, "num_generations": 4}'},
            "training/method spec: generation_batch_size (6) must be divisible by num_generations (4)",
        ),
    ],
    ids=[
        "non-string-solution",
        "row-not-object",
        "no-rows",
        "empty-prompt",
        "bad-json",
        "missing-spec",
        "inconsistent-batch",
    ],
)
def test_training_refuses_before_touching_the_run(tmp_path: Path, rows_text: str, override: dict, message: str):
    with pytest.raises(InputError) as error:
        train.main(train_args(tmp_path, rows_text, **override))
    assert message in str(error.value)
    assert not (tmp_path / "run").exists()


def test_training_refuses_a_model_directory_without_files(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    with pytest.raises(InputError, match=r"model: cannot load its tokenizer"):
        train.main(train_args(tmp_path, line(GOOD_ROW)))
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------------------- evaluation stage


def test_corrupt_line_inside_a_partial_evaluation_is_named_and_kept(tmp_path: Path) -> None:
    """A partial file damaged in the middle (not a torn tail) is refused, not silently truncated or deleted."""
    benchmark = tmp_path / "bench.jsonl"
    benchmark.write_text(line({"id": "a", "problem": "1+1=?", "answer": "2"}), encoding="utf-8")
    (tmp_path / "model").mkdir()
    spec = eval_spec.parse_eval_spec({"n_samples": 2, "backend": "hf"})
    out = tmp_path / "out.jsonl"
    partial = sampling.partial_path(out)
    stamp = sampling.fingerprint(str(tmp_path / "model"), benchmark, spec, 0)
    row = {"id": "a", "sample": 0, "completion": "x", "extracted": None, "correct": False, "num_tokens": 1}
    partial.write_text(line({"fingerprint": stamp}) + "{garbage\n" + line(row), encoding="utf-8")
    before = partial.read_bytes()
    with pytest.raises(InputError, match=r"out\.jsonl\.partial:2: not valid JSON"):
        sampling.evaluate(str(tmp_path / "model"), benchmark, spec, 0, out)
    assert partial.read_bytes() == before and not out.exists()


# --------------------------------------------------------------------------------------- credit assignment


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 8), min_size=1, max_size=5),
    bad_scores=st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 7), st.sampled_from([math.nan, math.inf, -math.inf]))
    ),
    bad_advantages=st.lists(st.tuples(st.integers(0, 4), st.sampled_from([math.nan, math.inf]))),
)
def test_nonfinite_scores_or_advantages_fall_back_to_one_and_are_counted(lengths, bad_scores, bad_advantages):
    """Any pattern of NaN/Inf: weights stay finite, zero off the mask, exactly 1 on a flagged row (no span here),
    and ``nonfinite_rows`` counts the rows with a non-finite advantage or a non-finite score on a valid token."""
    rows, width = len(lengths), 8
    mask = torch.tensor([[t < n for t in range(width)] for n in lengths], dtype=torch.float32)
    scores = torch.rand(rows, width) + 0.1
    advantages = torch.ones(rows)
    for row, token, value in bad_scores:
        if row < rows:
            scores[row, token] = value
    for row, value in bad_advantages:
        if row < rows:
            advantages[row] = value
    no_span = torch.full((rows, 3), -1, dtype=torch.long)
    weights, stats = grail_weights_with_stats(scores, mask, advantages, no_span)
    flagged = ~torch.isfinite(torch.where(mask.bool(), scores, 0.0)).all(dim=1) | ~torch.isfinite(advantages)
    assert torch.isfinite(weights).all()
    assert weights[mask == 0].eq(0).all()
    assert weights[flagged][mask[flagged].bool()].eq(1.0).all()
    assert stats["nonfinite_rows"] == float(flagged.sum())
