"""prob_reweight (pipeline/credit/methods/prob_reweight.py) through ``pipeline.train``: its weights lie in
[1 - alpha, 1] (alpha p + 1 - alpha with p in [0, 1]) and it adds no forward to a loss computation (the loss's own,
memoised: one, as GRPO's)."""

from __future__ import annotations

import json

from test_train_run import REWARD
from train_support import TRAINING_SPEC, run_train, train_command


def test_prob_reweight_trains_with_one_forward_per_loss(model_dir, train_jsonl, tmp_path) -> None:
    spec = {**TRAINING_SPEC, "max_steps": 2, "num_iterations": 1}
    method = {"credit": "prob_reweight", "credit_options": {"ar_alpha": 0.3}}
    result = run_train(
        train_command(model_dir, train_jsonl, tmp_path / "run", training_spec=spec, method_spec=method), REWARD
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open() if '"loss"' in line]
    assert len(rows) == 2
    for row in rows:
        assert 0.7 <= row["prob_reweight/weight_mean"] <= 1.0 and 0 < row["prob_reweight/prob_mean"] <= 1, row
        assert row["credit/loss_forwards"] == 1.0, row
