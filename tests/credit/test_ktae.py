"""KTAE (pipeline/credit/methods/ktae.py) against its authors' code: on three fixed groups the keys equal those of
upstream's ``ComputeKeyTokens(alpha=1, beta_ig=1, gamma_tf=1, top=1)`` (github.com/xiaolizh1/KTAE,
verl/workers/actor/compute_key_tokens.py at 45f3e77, run once on these batches; its outputs below, to 7 decimals),
within 1e-6 (upstream computes in float32; worst seen 9e-8); and the advantages it trains on are TRL's plus the key
of each valid token."""

from __future__ import annotations

import pytest
import torch

from pipeline.credit.method import GroupInputs
from pipeline.credit.methods.ktae import Ktae, KtaeOptions, fisher_two_sided, group_keys

EOS = 151643  # Qwen's end-of-text: ends every completion and pads, as in a Qwen batch; upstream zeroes its key
CASES = {  # seed: (valid lengths, rewards)
    7: ([12, 9, 11, 6, 12, 8, 10, 7], [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]),
    11: ([5, 12, 12, 3, 9, 12, 4, 8], [0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0]),
    23: ([12, 12, 10, 11], [1.0, 0.0, 0.0, 0.0]),
}
UPSTREAM_KEYS = {  # seed: {token id: upstream's key}
    7: {
        0: -1.0,
        1: 0.0464813,
        3: 0.0230324,
        4: 0.09082,
        5: -0.0433208,
        6: -1.0,
        7: 1.0,
        8: -0.3172789,
        9: -1.0,
        10: -1.0,
        11: -0.0433208,
        12: 1.0,
        14: 0.4482175,
        15: 0.0613805,
        16: -1.0,
        17: 1.0,
        18: 0.0464813,
        19: -0.0667721,
        20: 0.1181599,
        22: 0.4482175,
        23: -0.0275117,
    },
    11: {
        0: -0.6134683,
        1: -0.028712,
        2: 1.0,
        3: 1.0,
        4: 1.0,
        5: -0.0867272,
        6: 1.0,
        7: -0.7764809,
        8: 1.0,
        9: -1.0,
        10: -0.0743411,
        11: -1.0,
        12: 1.0,
        13: 1.0,
        15: -0.0743411,
        16: 1.0,
        17: 1.0,
        18: 1.0,
        19: -0.1030887,
        20: 1.0,
        21: 1.0,
        23: 1.0,
    },
    23: {
        0: 1.0,
        1: 0.0703372,
        2: -1.0,
        3: 0.0421339,
        4: -1.0,
        5: -1.0,
        6: -1.0,
        7: 0.2025492,
        8: 0.3683075,
        9: -1.0,
        10: -1.0,
        11: 0.3683075,
        12: 0.0703372,
        14: 1.0,
        15: 0.0703372,
        17: -1.0,
        19: -1.0,
        20: -1.0,
        21: 0.3683075,
        22: -1.0,
    },
}


def fixed_group(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, mask, rewards) of one group: random ids below 24, each completion ending with EOS, padded with it."""
    lengths, rewards = CASES[seed]
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 24, (len(lengths), 12), generator=generator)
    length = torch.tensor(lengths)
    mask = (torch.arange(12)[None, :] < length[:, None]).long()
    ids[torch.arange(len(lengths)), length - 1] = EOS
    return torch.where(mask.bool(), ids, EOS), mask, torch.tensor(rewards)


@pytest.mark.parametrize("seed", list(CASES))
def test_keys_match_the_authors_code(seed: int) -> None:
    ids, mask, rewards = fixed_group(seed)
    keys = group_keys(ids, mask, rewards.double(), KtaeOptions())
    held = sorted(set(ids[mask.bool()].tolist()) - {EOS})
    assert held == sorted(UPSTREAM_KEYS[seed])
    for token in held:
        assert keys[token].item() == pytest.approx(UPSTREAM_KEYS[seed][token], abs=1e-6), token
    assert keys[EOS] == 0


def test_fisher_p_value_by_hand() -> None:
    """Both tables have 2 rollouts holding the token, 3 correct, 8 in all: P(k) = C(3, k) C(5, 2 - k) / C(8, 2) =
    10/28, 15/28, 3/28 for k = 0, 1, 2 correct holders. [[1, 1], [2, 4]] observes the likeliest, k = 1: p = 1 (float32:
    within 1e-6); [[2, 0], [1, 5]] observes k = 2, and no other table is as unlikely: p = 3/28."""
    a, b, c, d = (torch.tensor([x, y]) for x, y in ((1, 2), (1, 0), (2, 1), (4, 5)))
    p = fisher_two_sided(a, b, c, d)
    assert p[0].item() == pytest.approx(1.0, abs=1e-6)
    assert p[1].item() == pytest.approx(3 / 28, rel=1e-6)


def test_a_group_without_a_correct_or_a_wrong_rollout_has_no_keys() -> None:
    ids, mask, _ = fixed_group(7)
    for rewards in (torch.ones(8), torch.zeros(8)):
        assert not group_keys(ids, mask, rewards.double(), KtaeOptions()).any()


def test_advantages_add_each_valid_tokens_key_to_trls() -> None:
    groups = [fixed_group(seed) for seed in (7, 11)]
    ids = torch.cat([group[0] for group in groups])
    mask = torch.cat([group[1] for group in groups])
    rewards = torch.cat([group[2] for group in groups])
    grouped = rewards.view(2, 8)
    advantages = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)
    inputs = GroupInputs(ids, mask, rewards, advantages, torch.arange(16) // 8, 8)
    result = Ktae(KtaeOptions(), None).group_advantages(inputs)
    assert result.weights is None
    for row in (0, 9):
        seed = 7 if row < 8 else 11
        for t in range(12):
            token = ids[row, t].item()
            key = UPSTREAM_KEYS[seed].get(token, 0.0) if mask[row, t] else 0.0
            expected = (advantages[row].item() + key) * mask[row, t].item()
            assert result.advantages[row, t].item() == pytest.approx(expected, abs=1e-6)
