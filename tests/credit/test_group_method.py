"""Group credit methods (pipeline.credit.method.GroupInputs): a batch that cuts a group is refused naming the group,
and docs/examples/group_contrast.py's formula holds on a group worked by hand (its training layouts:
tests/train/test_group_layouts.py)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.io import InputError
from pipeline.credit.method import GroupInputs, cut_group

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture
def group_contrast(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(DOCS))
    return importlib.import_module("examples.group_contrast")


def group_inputs(group_ids: list[int], group_size: int, rewards: list[float] | None = None) -> GroupInputs:
    rows = len(group_ids)
    reward = torch.tensor(rewards if rewards is not None else [0.0] * rows)
    return GroupInputs(
        completion_ids=torch.zeros(rows, 3, dtype=torch.long),
        completion_mask=torch.ones(rows, 3, dtype=torch.long),
        rewards=reward,
        advantages=torch.zeros(rows),
        group_ids=torch.tensor(group_ids),
        group_size=group_size,
    )


@pytest.mark.parametrize(
    ("group_ids", "message"),
    [
        ([0, 0, 0, 1, 1, 1, 1, 1], "group 0 holds 3 of its 4 rollouts (a fragment)"),
        ([0, 0, 1, 1, 0, 0, 1, 1], "group 0 is not 4 consecutive rows (rows 0-3 hold groups [0, 1])"),
    ],
)
def test_a_batch_that_cuts_a_group_is_refused_naming_the_group(group_ids: list[int], message: str) -> None:
    with pytest.raises(InputError, match=re.escape(f"needs whole groups of 4 rollouts: {message}")):
        group_inputs(group_ids, 4)


@given(st.integers(1, 6), st.integers(1, 5))
def test_consecutive_whole_groups_pass(groups: int, size: int) -> None:
    ids = torch.arange(groups * size) // size
    assert cut_group(ids, size) is None
    assert group_inputs(ids.tolist(), size).groups == groups


def test_group_contrast_by_hand(group_contrast: ModuleType) -> None:
    """Winners (rows 0, 1: reward 1 > mean 0.5) and losers (rows 2, 3). Token 5 is in both winners and no loser:
    c = 1; 6 in one of each: 0; 7 in one winner: 1/2; 8 and 9 in one loser each: -1/2. A winner's weight is
    1 + c, a loser's 1 - c; padding 0. The second group's rewards are all equal: its advantages are 0, and so are
    its advantages after the method (weights 1: no contrast without winners)."""
    ids = torch.tensor([[5, 6, 0], [5, 7, 7], [8, 6, 0], [9, 9, 9]] * 2)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]] * 2)
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    grouped = rewards.view(2, 4)
    advantages = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)
    inputs = GroupInputs(ids, mask, rewards, advantages, torch.arange(8) // 4, 4)
    weights = group_contrast.group_contrast_weights(inputs, beta=1.0)
    expected = torch.tensor([[2, 1, 0], [2, 1.5, 1.5], [1.5, 1, 0], [1.5, 1.5, 1.5]])
    assert torch.equal(weights[:4], expected)
    assert torch.equal(weights[4:], mask[4:].float())
    result = group_contrast.GroupContrast(group_contrast.GroupContrastOptions(beta=1.0), None).group_advantages(inputs)
    assert torch.equal(result.advantages, advantages[:, None] * weights)
    assert torch.equal(result.advantages[4:], torch.zeros(4, 3))
    half = group_contrast.group_contrast_weights(inputs, beta=0.5)
    assert torch.equal(half[0], torch.tensor([1.5, 1, 0]))  # beta scales the contrast
