"""The hf backend samples each (item, sample) unit from its own seed: the rows do not depend on the batch size or
on which units share a batch, and ``UnitGumbelSampler`` samples the warped distribution (known answers, and a
chi-square test of its frequencies against ``softmax(logits / T)`` after top-k/top-p)."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from pipeline.evaluation import eval_spec, hf_backend, sampling
from tests.evaluate.conftest import FAST_SPEC, benchmark_rows, write_jsonl

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])


@pytest.mark.parametrize("batch_size", [1, 3, 10])
def test_hf_rows_do_not_depend_on_the_batch_size(tiny_model_dir, tmp_path, batch_size):
    bench = write_jsonl(tmp_path / "bench.jsonl", benchmark_rows(5))
    spec = {**FAST_SPEC, "max_new_tokens": 12}

    def rows(size: int) -> list[dict]:
        parsed = eval_spec.parse_eval_spec({**spec, "batch_size": size})
        return sampling.evaluate(str(tiny_model_dir), bench, parsed, 3, tmp_path / f"b{size}" / "bench.jsonl")

    reference = rows(4)
    assert len({row["completion"] for row in reference}) > 5  # sampled, not one repeated greedy answer
    assert rows(batch_size) == reference


def draws(seeds: range, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The token that ``UnitGumbelSampler`` picks from LOGITS for each seed (one batch, a row per seed)."""
    sampler = hf_backend.UnitGumbelSampler(list(seeds), temperature, top_k, top_p, "cpu")
    scores = LOGITS.repeat(len(seeds), 1)
    return sampler(torch.zeros(len(seeds), 1, dtype=torch.long), scores).argmax(dim=-1)


def expected_counts(probabilities: torch.Tensor, total: int) -> list[float]:
    return (probabilities.double() / probabilities.double().sum() * total).tolist()


@pytest.mark.parametrize(
    ("settings", "probabilities"),
    [
        ({"temperature": 1.0}, torch.softmax(LOGITS, dim=0)),
        ({"temperature": 0.5}, torch.softmax(LOGITS / 0.5, dim=0)),
        # top-k 3 keeps the three largest logits; top-p 0.8 keeps the smallest set whose mass reaches 0.8
        ({"top_k": 3}, torch.softmax(LOGITS[:3], dim=0)),
        ({"top_p": 0.8}, torch.softmax(LOGITS[:3], dim=0)),
    ],
)
def test_sampler_frequencies_match_the_warped_distribution(settings, probabilities):
    total = 20_000
    picked = draws(range(total), **settings)
    counts = torch.bincount(picked, minlength=len(LOGITS))[: len(probabilities)]
    assert int(counts.sum()) == total  # nothing outside top-k / top-p is ever sampled
    assert chisquare(counts.tolist(), expected_counts(probabilities, total)).pvalue > 1e-3


def test_a_row_depends_on_its_seed_alone():
    alone = [int(draws(range(seed, seed + 1))[0]) for seed in range(40)]
    assert draws(range(40)).tolist() == alone
    reversed_rows = hf_backend.UnitGumbelSampler(list(range(39, -1, -1)), 1.0, 0, 1.0, "cpu")
    picked = reversed_rows(torch.zeros(40, 1, dtype=torch.long), LOGITS.repeat(40, 1)).argmax(dim=-1)
    assert picked.flip(0).tolist() == alone
    assert len(set(alone)) > 1


def test_top_k_1_is_greedy_and_gumbel_noise_is_finite_at_the_edges():
    assert set(draws(range(200), top_k=1).tolist()) == {0}
    noise = hf_backend.gumbel_noise(torch.tensor([0.0, 0.5, 1.0]))
    assert torch.isfinite(noise).all()
    assert noise[1].item() == pytest.approx(-torch.log(torch.log(torch.tensor(2.0))).item())


def test_a_sampler_refuses_scores_for_another_number_of_rows():
    sampler = hf_backend.UnitGumbelSampler([1, 2], 1.0, 0, 1.0, "cpu")
    with pytest.raises(ValueError, match="3 rows of scores for 2 seeds"):
        sampler(torch.zeros(3, 1, dtype=torch.long), LOGITS.repeat(3, 1))
