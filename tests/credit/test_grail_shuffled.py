"""grail_shuffled: GRAIL's weights permuted among each row's reasoning tokens, known answers on small inputs
(in the trainer: tests/trainer/test_control_methods.py)."""

from __future__ import annotations

import torch

from pipeline.credit.methods.grail_shuffled import reasoning_mask, shuffle_within


def test_reasoning_is_the_valid_tokens_before_the_box():
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0, 0]])
    spans = torch.tensor([[3, 5, 7], [-1, -1, -1]])  # row 0: \boxed{ at 3-4, content 5, } at 6, post 7
    expected = torch.tensor([[1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0]], dtype=torch.bool)
    assert torch.equal(reasoning_mask(mask, spans), expected)


def test_shuffle_is_the_seeded_permutation_and_leaves_the_rest():
    weights = torch.tensor([[0.5, 1.0, 2.0, 1.0, 5.0, 1.0], [3.0, 4.0, 0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    generator = torch.Generator().manual_seed(3)
    shuffled = shuffle_within(weights, mask, generator)
    reference = torch.Generator().manual_seed(3)
    first, second = torch.randperm(3, generator=reference), torch.randperm(2, generator=reference)
    torch.testing.assert_close(shuffled[0, :3], weights[0, :3][first])
    torch.testing.assert_close(shuffled[1, :2], weights[1, :2][second])
    torch.testing.assert_close(shuffled[~mask], weights[~mask])  # answer override and padding untouched


def test_placement_is_destroyed_but_not_the_distribution():
    weights = torch.arange(1.0, 9.0)[None, :]
    mask = torch.ones_like(weights, dtype=torch.bool)
    generator = torch.Generator().manual_seed(0)
    draws = [shuffle_within(weights, mask, generator) for _ in range(20)]
    assert all(torch.equal(draw.sort().values, weights) for draw in draws)
    assert len({int(draw.argmax()) for draw in draws}) > 3  # the largest weight lands in many places
