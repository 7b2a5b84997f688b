"""Where a credit method puts its weight, scored against the decisive-step task's ground truth
(pipeline.tasks.decisive), and how much of the GRPO-to-oracle gap a method closes.

Placement: per rollout i with sequence advantage A_i != 0, the AUROC of its token weights against the truth,

    AUROC_i = P(w_t > w_u) + ½ P(w_t = w_u)    t a decisive token of i, u a non-decisive one

(the Mann-Whitney U statistic over n_decisive · n_other, from ``scipy.stats.mannwhitneyu``; ties count ½). It is
a rank measure: 1 when every decisive token outweighs every other, ½ when the weights ignore the truth (uniform
weights, or any weights permuted at random within the row), 0 when the other tokens always outweigh. It is scored
per rollout, so that rollouts of different lengths and weight scales count alike, and averaged separately by the
sign of the advantage: for A_i > 0 it is where the method puts the credit, for A_i < 0 where it puts the blame
(Â = A · w pushes hardest on the heaviest tokens either way). Rollouts with A_i = 0 carry no gradient and are left
out; rollouts with no decisive or no other valid token have no AUROC and are counted as skipped.

Intervals: a hierarchical percentile bootstrap over seeds, then rollouts (resample the training seeds with
replacement, then each drawn seed's rollouts with replacement; the statistic is the mean AUROC over all drawn
rollouts). With one seed it is the bootstrap over rollouts alone, which says nothing about training variance.

Gap share (the oracle as the ceiling, GRPO as the floor):

    share = (acc_method - acc_GRPO) / (acc_oracle - acc_GRPO)

on the runs' mean accuracies, with a stratified bootstrap over each method's runs (rliable's, as
pipeline.stats.seed_aware): 0 is GRPO, 1 the oracle. It is undefined (None) when the oracle does not beat GRPO
on the point estimate; a resample in which it does not is dropped from the interval and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import mannwhitneyu


def rollout_auroc(weights: Sequence[float], decisive: Sequence[bool]) -> float | None:
    """AUROC of ``weights`` against the ``decisive`` labels of one rollout's valid tokens (module docstring);
    None without both a decisive and another token."""
    values = np.asarray(weights, dtype=np.float64)
    truth = np.asarray(decisive, dtype=bool)
    positives, negatives = values[truth], values[~truth]
    if positives.size == 0 or negatives.size == 0:
        return None
    statistic = mannwhitneyu(positives, negatives, alternative="two-sided", method="asymptotic").statistic
    return float(statistic) / (positives.size * negatives.size)


@dataclass(frozen=True)
class Placement:
    """The mean per-rollout AUROC of one sign of advantage, its bootstrap interval and what it was computed on."""

    mean: float | None
    low: float | None
    high: float | None
    rollouts: int
    seeds: int
    skipped: int  # rollouts of this sign without both classes of token


def hierarchical_interval(
    per_seed: Sequence[np.ndarray], resamples: int, confidence: float, rng: np.random.Generator
) -> tuple[float, float]:
    """Percentile interval of the pooled mean under the seeds-then-rollouts bootstrap (module docstring)."""
    seeds = [np.asarray(values, dtype=np.float64) for values in per_seed if len(values)]
    statistics = np.empty(resamples)
    for draw in range(resamples):
        chosen = rng.integers(len(seeds), size=len(seeds))
        pooled = [seeds[s][rng.integers(len(seeds[s]), size=len(seeds[s]))] for s in chosen]
        statistics[draw] = np.concatenate(pooled).mean()
    tail = (1 - confidence) / 2
    low, high = np.quantile(statistics, [tail, 1 - tail])
    return float(low), float(high)


def placement(
    rollouts: Sequence[tuple[int, float, Sequence[float], Sequence[bool]]],
    sign: int,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Placement:
    """The placement score of the rollouts ``(training seed, advantage, weights, decisive)`` whose advantage has
    ``sign`` (+1 credit, -1 blame)."""
    per_seed: dict[int, list[float]] = {}
    skipped = 0
    for run_seed, advantage, weights, decisive in rollouts:
        if np.sign(advantage) != sign:
            continue
        score = rollout_auroc(weights, decisive)
        if score is None:
            skipped += 1
        else:
            per_seed.setdefault(run_seed, []).append(score)
    scores = [np.asarray(values) for values in per_seed.values()]
    if not scores:
        return Placement(None, None, None, 0, 0, skipped)
    mean = float(np.concatenate(scores).mean())
    low, high = hierarchical_interval(scores, resamples, confidence, np.random.default_rng(seed))
    return Placement(mean, low, high, sum(len(values) for values in scores), len(scores), skipped)


@dataclass(frozen=True)
class GapShare:
    """The share of the GRPO-to-oracle gap a method closes, its interval and the resamples left out."""

    share: float | None
    low: float | None
    high: float | None
    undefined_resamples: int


def gap_share_of(method: float, floor: float, ceiling: float) -> float | None:
    """(method - floor) / (ceiling - floor); None when the ceiling does not beat the floor."""
    return (method - floor) / (ceiling - floor) if ceiling > floor else None


def gap_share(
    method_runs: Sequence[float],
    floor_runs: Sequence[float],
    ceiling_runs: Sequence[float],
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> GapShare:
    """The gap share on the runs' mean accuracies, with the stratified bootstrap over each method's runs."""
    groups = [np.asarray(runs, dtype=np.float64) for runs in (method_runs, floor_runs, ceiling_runs)]
    point = gap_share_of(*(float(runs.mean()) for runs in groups))
    if point is None:
        return GapShare(None, None, None, resamples)
    rng = np.random.default_rng(seed)
    shares = []
    for _ in range(resamples):
        means = [runs[rng.integers(runs.size, size=runs.size)].mean() for runs in groups]
        if (value := gap_share_of(*means)) is not None:
            shares.append(value)
    if not shares:
        return GapShare(point, None, None, resamples)
    tail = (1 - confidence) / 2
    low, high = np.quantile(shares, [tail, 1 - tail])
    return GapShare(point, float(low), float(high), resamples - len(shares))
