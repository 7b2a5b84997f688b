"""Decisive-token placement scores and the gap share: known answers, chance under permutation (hypothesis), the
``grail_shuffled`` control's shuffle at chance, and the bootstrap intervals' behaviour."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.credit.methods.grail_shuffled import shuffle_within
from pipeline.stats.credit_truth import gap_share, placement, rollout_auroc

LABELS = [True, True, False, False, False]


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        ([5, 4, 1, 1, 1], 1.0),  # every decisive token outweighs every other
        ([1, 1, 5, 4, 3], 0.0),
        ([2, 2, 2, 2, 2], 0.5),  # uniform weights (GRPO's) ignore the truth
        ([3, 1, 2, 2, 2], 0.5),  # one above, one below every other token
        ([2, 1, 2, 1, 1], 3.5 / 6),  # 2: a tie and 2 wins; 1: a loss and 2 ties (½ each)
    ],
)
def test_rollout_auroc_known_answers(weights, expected):
    assert rollout_auroc(weights, LABELS) == pytest.approx(expected)


def test_a_rollout_without_both_classes_has_no_score():
    assert rollout_auroc([1.0, 2.0], [True, True]) is None
    assert rollout_auroc([1.0, 2.0], [False, False]) is None


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.floats(min_value=0, max_value=10), min_size=4, max_size=24),
    st.integers(min_value=0, max_value=2**31 - 1),
)
def test_weights_permuted_at_random_score_chance_in_expectation(weights, seed):
    """The mean AUROC over all permutations of a row's weights is exactly 1/2 (each pair of positions is
    equally likely either way round); over 400 random permutations it lies within a few standard errors."""
    labels = [index % 3 == 0 for index in range(len(weights))]
    rng = np.random.default_rng(seed)
    scores = [rollout_auroc(rng.permutation(weights).tolist(), labels) for _ in range(400)]
    assert abs(np.mean(scores) - 0.5) < 0.05


def test_grail_shuffled_scores_at_chance_where_grail_scores_perfectly():
    """Weights that put all of the row's weight on its decisive tokens (1.0 for GRAIL-like saliency that found
    them) lose it under the control's shuffle: the mean AUROC of the shuffled rows is 1/2 within its error.
    Broken by shuffling only the first half of each row: the shuffled score stayed well above 1/2."""
    rows, length = 400, 20
    truth = torch.zeros(rows, length, dtype=torch.bool)
    truth[:, 4:8] = True
    weights = torch.where(truth, 5.0, 0.5) + torch.rand(rows, length, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(rows, length, dtype=torch.bool)
    shuffled = shuffle_within(weights, mask, torch.Generator().manual_seed(1))
    before = [rollout_auroc(weights[i].tolist(), truth[i].tolist()) for i in range(rows)]
    after = [rollout_auroc(shuffled[i].tolist(), truth[i].tolist()) for i in range(rows)]
    assert np.mean(before) == 1.0
    assert abs(np.mean(after) - 0.5) < 3 * np.std(after) / np.sqrt(rows)


def test_placement_splits_by_the_sign_of_the_advantage_and_bootstraps_seeds_then_rollouts():
    credit = [1, 1, 0, 0, 0]
    rollouts = [
        (0, 1.0, [3, 3, 1, 1, 1], credit),  # credit on the decisive tokens: 1
        (0, -1.0, [1, 1, 3, 3, 3], credit),  # blame on the others: 0
        (1, 0.5, [3, 1, 2, 2, 2], credit),  # 0.5
        (1, 0.0, [9, 9, 0, 0, 0], credit),  # no gradient: left out
        (1, -2.0, [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]),  # no other token: skipped
    ]
    positive = placement(rollouts, +1, resamples=500)
    assert positive.mean == pytest.approx(0.75) and (positive.rollouts, positive.seeds) == (2, 2)
    assert 0.5 <= positive.low <= positive.mean <= positive.high <= 1.0
    negative = placement(rollouts, -1, resamples=500)
    assert negative.mean == 0.0 and negative.skipped == 1 and negative.low == negative.high == 0.0


def test_the_interval_carries_the_spread_between_seeds():
    """The same 200 rollouts (half scoring 1, half 0) as one seed, and as 4 seeds that each score all 1 or all 0:
    the seeds-then-rollouts bootstrap is much wider in the second case, where the training seeds disagree.
    Broken by resampling rollouts only (pooling the seeds): the two intervals were equally narrow."""
    perfect, reversed_ = [5, 5, 1, 1, 1], [1, 1, 5, 5, 5]
    rollouts = [(index % 4, 1.0, perfect if index % 4 < 2 else reversed_, LABELS) for index in range(200)]
    pooled = [(0, *rest) for _, *rest in rollouts]
    by_seed, as_one = placement(rollouts, +1, resamples=1000), placement(pooled, +1, resamples=1000)
    assert by_seed.mean == as_one.mean == 0.5
    assert as_one.high - as_one.low < 0.2
    assert by_seed.high - by_seed.low > 0.5


def test_gap_share_known_answer_and_undefined_without_a_gap():
    share = gap_share([0.60, 0.62], [0.50, 0.52], [0.70, 0.72], resamples=1000)
    assert share.share == pytest.approx(0.5)
    assert share.low < 0.5 < share.high
    assert gap_share([0.6], [0.7], [0.65]).share is None  # the oracle does not beat GRPO: no share
    exact = gap_share([0.7, 0.7], [0.5, 0.5], [0.9, 0.9])
    assert exact.share == pytest.approx(0.5) and exact.low == pytest.approx(0.5) and exact.high == pytest.approx(0.5)
