"""docs/examples/halfway.py keeps the rules docs/credit-methods.md gives: its formula on known answers, rows with
no or one real token, and statistics over the rows that carry loss; docs/examples/entropy_weights.py's formula on
known answers (its forward: tests/trainer/test_token_statistics.py)."""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from types import ModuleType

import pytest
import torch

from pipeline.credit.method import CreditInputs

DOCS = Path(__file__).resolve().parents[2] / "docs"  # the example is importable as examples.halfway


@pytest.fixture
def halfway(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(DOCS))
    return importlib.import_module("examples.halfway")


# rows: four real tokens; one (n_i = 1); none (a truncated completion under mask_truncated_completions)
MASK = torch.tensor([[1, 1, 1, 1, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]])


def test_weights_by_hand_on_rows_with_four_one_and_no_real_tokens(halfway: ModuleType) -> None:
    expected = torch.tensor([[1, 1, 3, 3, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.float32)
    torch.testing.assert_close(halfway.halfway_weights(MASK, 3.0), expected)


def test_statistics_cover_the_rows_that_carry_loss(halfway: ModuleType) -> None:
    method = halfway.METHOD(halfway.HalfwayOptions(late_weight=3.0), args=None)  # as the registry builds it
    batch = {"completion_mask": MASK, "advantages": torch.tensor([0.5, 0.0, -1.0])}  # row 1: A = 0; row 2: no token
    result = method.advantages(CreditInputs(batch, spans=None, model=None, host=None, share_loss_forward=False))
    torch.testing.assert_close(result.advantages[0], torch.tensor([0.5, 0.5, 1.5, 1.5, 0.0]))
    assert torch.isfinite(result.advantages).all() and not result.advantages[1:].any()
    assert result.stats["weight_mean"] == pytest.approx(2.0)  # row 0 only: (1 + 1 + 3 + 3) / 4
    assert result.stats["weight_std"] == pytest.approx(math.sqrt(4 / 3))
    batch["advantages"] = torch.zeros(3)  # no row carries loss: NaN, which the trainer does not log
    result = method.advantages(CreditInputs(batch, spans=None, model=None, host=None, share_loss_forward=False))
    assert math.isnan(result.stats["weight_mean"]) and math.isnan(result.stats["weight_std"])


@pytest.fixture
def entropy_example(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(DOCS))
    return importlib.import_module("examples.entropy_weights")


def test_entropy_weights_by_hand_on_rows_with_three_one_and_no_real_tokens(entropy_example: ModuleType) -> None:
    """Row 0: H = 1, 2, 3 (mean 2, σ = sqrt(2/3)), z = ∓1.2247, 0; with scale 0.5 the low end 0.388 is clipped to
    w_min 0.5. Row 1: one token, z = 0, w = 1. Row 2: none, w = 0 (finite although σ = 0)."""
    entropies = torch.tensor([[1.0, 2.0, 3.0, 0.0], [5.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    z = 1 / math.sqrt(2 / 3)
    expected = torch.tensor([[0.5, 1.0, 1 + 0.5 * z, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    weights = entropy_example.entropy_weights(entropies, mask, scale=0.5, w_min=0.5, w_max=2.0)
    torch.testing.assert_close(weights, expected)
