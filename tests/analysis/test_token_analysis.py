import json
import math
import subprocess
import sys

import numpy as np
import pytest

from pipeline.evaluation.token_weights import NUM_BINS, TokenAnalysisSpec, bin_statistics, summarize, u_shape_index
from pipeline.models.tiny_model import TinyModelSpec, save_tiny_model


def test_bin_statistics_known_answer():
    positions = np.array([0.0, 0.01, 0.05, 0.5, 1.0])
    values = np.array([1.0, 3.0, 5.0, 2.0, 4.0])
    stats = bin_statistics(positions, values)
    # Bin 0 is [0, 0.05] (searchsorted on right edges, left side): 1, 3 and 5.
    assert stats["count"][0] == 3
    assert stats["mean"][0] == pytest.approx(3.0)
    assert stats["std"][0] == pytest.approx(math.sqrt(8 / 3))
    assert stats["sem"][0] == pytest.approx(math.sqrt(8 / 3) / math.sqrt(3))
    assert stats["count"][9] == 1 and math.isnan(stats["sem"][9])
    assert stats["count"][NUM_BINS - 1] == 1 and stats["mean"][NUM_BINS - 1] == 4.0
    assert math.isnan(stats["mean"][5])
    assert sum(stats["count"]) == 5


def test_u_shape_index_sign():
    u_profile = [2.0] * 4 + [1.0] * 12 + [2.0] * 4
    assert u_shape_index(u_profile) == pytest.approx(1.0)
    assert u_shape_index([1.0] * NUM_BINS) == 0.0
    assert math.isnan(u_shape_index([math.nan] * NUM_BINS))


def test_summarize_splits_correct_and_wrong():
    records = [
        (np.array([0.0, 1.0]), np.array([2.0, 2.0]), np.array([0.1, 0.2]), True),
        (np.array([0.0, 1.0]), np.array([0.5, 0.5]), np.array([0.3, 0.4]), False),
    ]
    summary = summarize(records)
    assert summary["rollouts"] == 2
    assert summary["mean_weight"][0] == pytest.approx(1.25)
    assert summary["mean_weight_correct"][0] == 2.0 and summary["mean_weight_wrong"][0] == 0.5
    assert summary["count_correct"][0] == 1 and summary["count_wrong"][NUM_BINS - 1] == 1
    assert summary["mean_raw_score"][NUM_BINS - 1] == pytest.approx(0.3)


def test_unknown_spec_key_is_named():
    from pipeline.core.io import InputError
    from pipeline.core.specs import dataclass_from_mapping

    with pytest.raises(InputError, match=r"unknown key\(s\) \['bins'\]"):
        dataclass_from_mapping(TokenAnalysisSpec, {"bins": 10}, "token_analysis spec")


def test_cli_on_a_tiny_checkpoint(tmp_path):
    model_dir = save_tiny_model(TinyModelSpec(seed=1), tmp_path / "model")
    benchmark = tmp_path / "bench.jsonl"
    items = [{"id": f"q{i}", "problem": f"{i}+1=?", "answer": str(i + 1), "source": "test"} for i in range(4)]
    benchmark.write_text("".join(json.dumps(row) + "\n" for row in items))
    samples = tmp_path / "samples.jsonl"
    rows = [
        {
            "id": f"q{i}",
            "sample": 0,
            "completion": f"{i}+1={i + 1}. so \\boxed{{{i + 1}}}",
            "extracted": str(i + 1),
            "correct": i % 2 == 0,
            "num_tokens": 20,
        }
        for i in range(4)
    ] + [{"id": "q0", "sample": 1, "completion": "no box here", "extracted": None, "correct": False, "num_tokens": 11}]
    samples.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "analysis"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.token_analysis",
            "--checkpoint",
            "final",
            str(model_dir),
            str(samples),
            "--checkpoint",
            "again",
            str(model_dir),
            str(samples),
            "--benchmark",
            str(benchmark),
            "--spec",
            json.dumps({"batch_size": 2}),
            "--out-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    final = summary["checkpoints"]["final"]
    assert final["rollouts"] == 4, "the rollout without a box has no reasoning span and is skipped"
    weights = [w for w in final["mean_weight"] if not math.isnan(w)]
    assert weights and all(0.5 <= w <= 5.0 for w in weights)
    assert sum(final["count"]) == sum(len(f"{i}+1={i + 1}. so ") for i in range(4))
    assert summary["checkpoints"]["again"]["mean_weight"] == final["mean_weight"]
    assert (out / "GRAIL_positional.png").read_bytes()[:4] == b"\x89PNG"
