"""An out-of-tree credit method, named by import path: docs/examples/halfway.py (docs/credit-methods.md) trains
through ``pipeline.train`` and logs its statistics under its name; a bad option is refused naming the method and
the key before any training."""

from __future__ import annotations

import json

from train_support import REPO_ROOT, run_train, train_command

EXAMPLES_ON_PATH = {"PYTHONPATH": f"{REPO_ROOT}:{REPO_ROOT / 'docs'}"}  # the example is `examples.halfway`


def test_example_method_trains_and_logs_its_statistics(model_dir, train_jsonl, tmp_path):
    method = {"credit": "examples.halfway", "credit_options": {"late_weight": 3.0}}
    result = run_train(train_command(model_dir, train_jsonl, tmp_path / "run", method_spec=method), EXAMPLES_ON_PATH)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    means = [row["halfway/weight_mean"] for row in rows if "halfway/weight_mean" in row]
    assert means and all(1.0 < mean < 3.0 for mean in means)  # weight 1 on the first half, 3 on the second
    assert any("halfway/advantages_weighted_abs_mean" in row for row in rows)


def test_bad_option_of_the_example_is_refused_by_name(model_dir, train_jsonl, tmp_path):
    method = {"credit": "examples.halfway", "credit_options": {"late_wieght": 3.0}}
    result = run_train(train_command(model_dir, train_jsonl, tmp_path / "run", method_spec=method), EXAMPLES_ON_PATH)
    assert result.returncode == 2
    assert "credit halfway: credit_options: unknown key(s) ['late_wieght']" in result.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
