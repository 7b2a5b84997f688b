"""Short CPU training runs: every credit method logs its metrics and changes the weights; per-generation
weights equal every-step weights on the round's first micro-step (same policy; float64, see test_weights)."""

from __future__ import annotations

import pytest
import torch
from trainer_support import make_trainer

EXPECTED_METRICS = {
    "grpo": ["reward"],
    "grail": [
        "grail/saliency_rows_frac",
        "grail/weight_mean",
        "grail/fallback_rate",
        "grail/answer_found_rate",
        "grail/advantages_raw_abs_mean",
        "grail/advantages_weighted_abs_mean",
        "grail/advantages_scale_ratio",
    ],
    "oar_g": ["oar_g/weight_mean", "oar_g/answer_found_rate", "oar_g/advantages_scale_ratio"],
}


# paper.yaml's fidelity options (docs/fidelity.md) with the OAR paper's own OAR-G
FIDELITY = {"oar_g_variant": "official", "answer_alignment": "upstream", "reward_grading": "upstream"}


@pytest.mark.parametrize(
    ("credit", "recompute", "options"),
    [
        ("grpo", "every_step", {}),
        ("grail", "every_step", {}),
        ("grail", "per_generation", {}),
        ("oar_g", "every_step", {}),
        ("oar_g", "every_step", FIDELITY),
    ],
)
def test_short_run_logs_metrics_and_updates_weights(boxing_model_dir, tmp_path, credit, recompute, options):
    trainer = make_trainer(
        boxing_model_dir, tmp_path, credit=credit, grail_recompute=recompute, max_steps=2, num_iterations=2, **options
    )
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    logged = {key for entry in trainer.state.log_history for key in entry}
    assert set(EXPECTED_METRICS[credit]) <= logged
    assert any(not torch.equal(a, p) for a, p in zip(before, trainer.model.parameters(), strict=True))
    if credit == "grail":
        found = [
            entry["grail/answer_found_rate"]
            for entry in trainer.state.log_history
            if "grail/answer_found_rate" in entry
        ]
        assert max(found) > 0  # the SFT'd model boxes answers, so the saliency path ran


def test_per_generation_weights_equal_every_step_on_first_micro_step(boxing_model_dir, tmp_path):
    trainer = make_trainer(
        boxing_model_dir, tmp_path, dtype=torch.float64, credit="grail", grail_recompute="per_generation"
    )
    trainer.model.train()
    rows = [trainer.train_dataset[i] for i in range(8)]
    round_batch = trainer._generate_and_score_completions(rows)
    every_step = trainer._credit_weights(trainer.model, round_batch, share_loss_forward=True)
    trainer._memoised_forward = None
    assert round_batch["answer_spans"][:, 0].ge(0).any()
    torch.testing.assert_close(round_batch["credit_weights"], every_step, rtol=1e-4, atol=1e-4)
