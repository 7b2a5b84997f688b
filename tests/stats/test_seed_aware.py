"""Seed-aware comparisons (pipeline.stats.seed_aware): probability of improvement, the permutation tests over runs
against enumeration and scipy, and known answers on simulated studies with a planted effect and planted seed noise.

The simulated studies: per cell, items with accuracy p_i ~ U(0.3, 0.7) shared by both methods, a method x item
effect g_i, a training-seed shift a_s per run, a run x item shift, and 4 binary samples per item and run. Many cells
go through one ``hierarchical_bootstrap`` call (each cell has runs and a benchmark of its own, so its interval is
the one a single-cell call would give, from another random stream).
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from pipeline.aggregate import main as aggregate
from pipeline.significance import main as significance
from pipeline.stats import seed_aware
from pipeline.stats.paired_tests import paired_bootstrap
from pipeline.stats.seed_aware import (
    Cell,
    Runs,
    cell_permutation_pvalue,
    hierarchical_bootstrap,
    probability_of_improvement,
    stratified_permutation_pvalues,
)


def test_probability_of_improvement_is_the_mann_whitney_u_over_all_pairs() -> None:
    x, y = np.array([0.7, 0.5, 0.6]), np.array([0.5, 0.4])
    # pairs won: 0.7 > both, 0.6 > both, 0.5 = 0.5 (half) and > 0.4: (2 + 2 + 1.5) / 6
    assert probability_of_improvement(x, y) == pytest.approx(5.5 / 6)
    u = stats.mannwhitneyu(x, y, alternative="greater").statistic
    assert probability_of_improvement(x, y) == pytest.approx(u / 6)
    batch = probability_of_improvement(np.stack([x, y[[0, 0, 1]]]), np.stack([y, x[:2]]))
    assert batch == pytest.approx([5.5 / 6, 1 / 6])


def brute_force(strata: list[tuple[np.ndarray, int]]) -> dict[str, float]:
    """Every labelling of every stratum, T = sum of mean_A - mean_B: the one-sided and two-sided p."""
    values = []
    splits = [itertools.combinations(range(scores.shape[1]), a) for scores, a in strata]
    for choice in itertools.product(*map(list, splits)):
        total = 0.0
        for (scores, _), chosen in zip(strata, choice, strict=True):
            mask = np.isin(np.arange(scores.shape[1]), chosen)
            total += scores[0, mask].mean() - scores[0, ~mask].mean()
        values.append(total)
    observed = sum(scores[0, :a].mean() - scores[0, a:].mean() for scores, a in strata)
    values = np.array(values)
    greater, less = np.mean(values >= observed - 1e-12), np.mean(values <= observed + 1e-12)
    return {"greater": greater, "less": less, "two-sided": min(1.0, 2 * min(greater, less))}


@pytest.mark.parametrize("alternative", ["greater", "less", "two-sided"])
def test_stratified_permutation_equals_enumeration(alternative: str) -> None:
    rng = np.random.default_rng(3)
    strata = [(rng.normal(size=(1, 4)), 2), (rng.normal(size=(1, 5)), 3), (np.array([[0.2, 0.1]]), 1)]
    p_value, exact = stratified_permutation_pvalues(strata, alternative, 100, rng)
    assert exact and p_value[0] == pytest.approx(brute_force(strata)[alternative])


def test_one_stratum_is_scipys_permutation_test_and_draws_approximate_it(monkeypatch) -> None:
    x, y = np.array([0.71, 0.74, 0.69, 0.80]), np.array([0.66, 0.70, 0.64, 0.72])
    p_exact, exact = stratified_permutation_pvalues([(np.concatenate([x, y])[None], 4)], "two-sided", 1, None)
    assert exact and p_exact[0] == pytest.approx(cell_permutation_pvalue(x, y))
    assert p_exact[0] == pytest.approx(2 * 5 / 70)  # 5 of the C(8, 4) = 70 labellings are as extreme
    monkeypatch.setattr(seed_aware, "EXACT_ARRANGEMENTS", 1)
    drawn, exact = stratified_permutation_pvalues(
        [(np.concatenate([x, y])[None], 4)], "two-sided", 20_000, np.random.default_rng(0)
    )
    # 20,000 uniform labellings: Monte Carlo sd of the one-sided tail sqrt(q (1 - q) / 20000) with q = 5/70
    assert not exact and abs(drawn[0] - p_exact[0]) < 2 * 4 * math.sqrt(5 / 70 * (1 - 5 / 70) / 20_000)


def simulated_cells(
    rng: np.random.Generator, count: int, seeds: int, *, effect: float, seed_sd: float, method_item_sd: float
) -> list[Cell]:
    """``count`` independent cells of 50 items x 4 samples, ``seeds`` runs of each method (module docstring)."""
    items, samples = 50, 4
    ids = tuple(f"q{i}" for i in range(items))
    cells = []
    for index in range(count):
        p = rng.uniform(0.3, 0.7, items)

        def runs(shift: np.ndarray | float, p: np.ndarray = p) -> Runs:
            q = p + shift + rng.normal(0, seed_sd, (seeds, 1)) + rng.uniform(-0.08, 0.08, (seeds, items))
            return Runs(tuple(range(seeds)), ids, rng.binomial(samples, q) / samples, samples)

        method_item = rng.uniform(-1, 1, items) * method_item_sd * math.sqrt(3)
        cells.append(Cell(f"model{index}", f"bench{index}", runs(effect + method_item), runs(0.0)))
    return cells


REPLICATIONS = 400
# Monte Carlo sd of a rate near 5 % (or a coverage near 95 %) over REPLICATIONS simulated cells
MC_SD = math.sqrt(0.05 * 0.95 / REPLICATIONS)


def test_seed_aware_interval_covers_the_planted_difference_at_its_nominal_rate() -> None:
    """16 runs per method (where the percentile interval's small-sample shortfall is under a point; docs/output.md
    gives the coverage with fewer), a planted effect of 3 points, seed noise (sd 3 points) and a method x item
    effect (sd 5 points): the 95 % interval covers the planted effect in 95 % of the cells, within 3 Monte Carlo
    sds (1.1 points each)."""
    cells = simulated_cells(np.random.default_rng(7), REPLICATIONS, 16, effect=0.03, seed_sd=0.03, method_item_sd=0.05)
    result = hierarchical_bootstrap(cells, 999, 0.95, 0)
    covered = (result.ci_low[:-1] <= 0.03) & (result.ci_high[:-1] >= 0.03)
    assert abs(covered.mean() - 0.95) < 3 * MC_SD, covered.mean()


def test_under_pure_seed_noise_only_the_item_pooled_test_sees_differences() -> None:
    """No method effect, seed noise of 5 points: the item-pooled paired bootstrap (seed means per item, items
    resampled) calls far more than 5 % of the cells different; the seed-aware bootstrap interval (16 runs) and the
    exact permutation test over runs (the first 6 runs of each method: 924 labellings) stay at 5 % within 3
    Monte Carlo sds."""
    cells = simulated_cells(np.random.default_rng(8), REPLICATIONS, 16, effect=0.0, seed_sd=0.05, method_item_sd=0.0)
    item_pooled = np.mean(
        [
            paired_bootstrap(cell.a.accuracy.mean(0) - cell.b.accuracy.mean(0), 499, 0.95, index)[2] <= 0.05
            for index, cell in enumerate(cells)
        ]
    )
    assert item_pooled > 0.05 + 3 * MC_SD, item_pooled
    result = hierarchical_bootstrap(cells, 999, 0.95, 1)
    seed_aware_rate = np.mean((result.ci_low[:-1] > 0) | (result.ci_high[:-1] < 0))
    assert abs(seed_aware_rate - 0.05) < 3 * MC_SD, seed_aware_rate
    first_six = np.stack([np.concatenate([cell.a.scores[:6], cell.b.scores[:6]]) for cell in cells])
    p_values, exact = stratified_permutation_pvalues([(first_six, 6)], "two-sided", 1, None)
    permutation = np.mean(p_values <= 0.05)
    assert exact
    assert permutation < 0.05 + 3 * MC_SD, permutation


def test_a_difference_carried_by_one_seed_gets_no_interval_that_excludes_zero(tmp_path: Path, write_samples) -> None:
    """The issue's default study: acc@4 on 400 items, GRPO seeds about 76.7 / 78.4, OAR-G 77.9 / 71.8. Pooled over
    items, OAR-G is 2.7 points below GRPO with an interval that excludes 0; with the runs resampled, it does not."""
    rng = np.random.default_rng(2)
    items = 400
    difficulty = rng.choice([0.03, 0.5, 0.97], size=items, p=[0.15, 0.2, 0.65])
    ids = [f"q{i:03d}" for i in range(items)]
    samples = []
    for method, levels in (("grpo", (0.767, 0.784)), ("oar_g", (0.779, 0.718))):
        for seed, level in enumerate(levels):
            q = np.clip(difficulty + (level - difficulty.mean()), 0, 1)
            correct = rng.random((items, 4)) < q[:, None]
            rows = {i: list(map(bool, c)) for i, c in zip(ids, correct, strict=True)}
            samples.append(write_samples("m", method, seed, "final", "b", rows))
            # a second benchmark, so that the study row (the mean over cells) is not the one cell
            other = {f"r{i}": list(map(bool, rng.random(4) < 0.3 + 0.1 * seed)) for i in range(60)}
            samples.append(write_samples("m", method, seed, "final", "c", other))
    paths = [*map(str, samples)]
    aggregate(["--samples", *paths, "--out-dir", str(tmp_path / "tables"), "--figures-dir", str(tmp_path / "figures")])
    out = tmp_path / "significance.json"
    scores = tmp_path / "tables" / "scores.csv"
    significance(["--scores", str(scores), "--samples", *paths, "--out", str(out), "--resamples", "4000"])
    rows = json.loads(out.read_text())
    pooled = next(r for r in rows if r["test"] == "paired_bootstrap" and r["model"] == "m")
    aware = next(r for r in rows if r["test"] == "seed_bootstrap" and r["model"] == "m")
    assert (pooled["method_a"], pooled["method_b"]) == (aware["method_a"], aware["method_b"]) == ("grpo", "oar_g")
    assert pooled["statistic"] == pytest.approx(aware["statistic"])  # both: mean over runs and items
    assert 0.015 < pooled["statistic"] < 0.04 and pooled["ci_low"] > 0  # GRPO ahead, "resolved" over items
    assert aware["ci_low"] < 0 < aware["ci_high"] and aware["runs_resampled"]
    # every seed-aware difference follows from scores.csv: the difference of the methods' seed means of acc@4
    scores = pd.read_csv(scores).query("metric == 'acc@4' and checkpoint == 'final'")
    means = scores.groupby(["benchmark", "method"])["value"].mean()
    cells = [r for r in rows if r["test"] == "seed_bootstrap" and r["model"] == "m"]
    for row in cells:
        assert row["statistic"] == pytest.approx(means[row["benchmark"], "grpo"] - means[row["benchmark"], "oar_g"])
    study = next(r for r in rows if r["test"] == "seed_bootstrap" and r["model"] == "all")
    assert len(cells) == 2 and study["statistic"] == pytest.approx(np.mean([r["statistic"] for r in cells]))
