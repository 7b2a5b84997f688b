"""Variance components (pipeline.stats.variance): a hand-worked case, statsmodels' ANOVA mean squares, planted
components recovered by simulation, what one seed or one sample leaves unknown, and the aggregate stage's table."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import statsmodels.formula.api as smf
from statsmodels.stats.anova import anova_lm

from pipeline.aggregate import main as aggregate
from pipeline.stats.variance import COMPONENTS, components


def test_hand_worked_case() -> None:
    # seed 0: item x 2/2 correct, item y 0/2; seed 1: x 1/2, y 0/2. Cell means 1, 0 / 0.5, 0; grand 0.375.
    # MS_seed = 2*2*(0.125^2 + 0.125^2) = 0.125, MS_item = 2*2*(0.375^2 * 2) = 1.125, residuals +-0.125:
    # MS_inter = 2 * 4 * 0.015625 = 0.125; MS_within = (1 * (1 - 0.5)) / 4 = 0.125.
    estimate = components(np.array([[2, 0], [1, 0]]), np.full((2, 2), 2))
    assert estimate.sampling == pytest.approx(0.125)
    assert estimate.seed_item == pytest.approx(0.0)  # (0.125 - 0.125) / 2
    assert estimate.item == pytest.approx(0.25)  # (1.125 - 0.125) / (2 * 2)
    assert estimate.seed == pytest.approx(0.0)  # (0.125 - 0.125) / (2 * 2)
    # variance of the mean score: 0.25 / 2 (items) + 0.125 / 8 (sampling)
    shares = estimate.shares()
    assert shares["item"] == pytest.approx(0.125 / 0.140625) and shares["sampling"] == pytest.approx(1 / 9)
    assert sum(shares.values()) == pytest.approx(1.0)


def test_mean_squares_match_statsmodels_anova() -> None:
    """The estimates are the expected-mean-squares solutions of statsmodels' two-way ANOVA with interaction."""
    rng = np.random.default_rng(5)
    seeds, items, samples = 3, 7, 4
    correct = rng.binomial(samples, rng.uniform(0.1, 0.9, size=(seeds, items)))
    long = pd.DataFrame(
        [
            {"seed": s, "item": i, "y": float(j < correct[s, i])}
            for s in range(seeds)
            for i in range(items)
            for j in range(samples)
        ]
    )
    table = anova_lm(smf.ols("y ~ C(seed) * C(item)", data=long).fit())
    ms = table["mean_sq"]
    ms_seed, ms_item, ms_inter, ms_within = (
        ms["C(seed)"],
        ms["C(item)"],
        ms["C(seed):C(item)"],
        ms["Residual"],
    )
    estimate = components(correct, np.full((seeds, items), samples))
    assert estimate.sampling == pytest.approx(ms_within)
    assert estimate.seed_item == pytest.approx(max(0.0, (ms_inter - ms_within) / samples))
    assert estimate.item == pytest.approx(max(0.0, (ms_item - ms_inter) / (seeds * samples)))
    assert estimate.seed == pytest.approx(max(0.0, (ms_seed - ms_inter) / (items * samples)))


def test_planted_components_are_recovered() -> None:
    """Binary samples from p_si = 0.5 + a_s + b_i + (ab)_si: the mean estimate over 150 simulated studies is the
    planted value within 4 Monte Carlo standard errors (the ANOVA estimators are unbiased; the planted components
    are large enough that the truncation at 0 almost never acts)."""
    rng = np.random.default_rng(11)
    replications, seeds, items, samples = 150, 6, 80, 4
    # uniform effects on [-h, h] (variance h^2 / 3) keep every p inside (0.13, 0.87)
    half = {"seed": 0.07, "item": 0.2, "seed_item": 0.1}
    planted = {name: h**2 / 3 for name, h in half.items()}
    p = (
        0.5
        + rng.uniform(-half["seed"], half["seed"], (replications, seeds, 1))
        + rng.uniform(-half["item"], half["item"], (replications, 1, items))
        + rng.uniform(-half["seed_item"], half["seed_item"], (replications, seeds, items))
    )
    planted["sampling"] = 0.25 - sum(planted.values())  # E[p (1 - p)] = 0.25 - var(p) at mean 0.5
    correct = rng.binomial(samples, p)
    estimates = [components(c, np.full((seeds, items), samples)) for c in correct]
    for name in COMPONENTS:
        values = np.array([getattr(e, name) for e in estimates])
        error = values.std(ddof=1) / math.sqrt(replications)
        assert abs(values.mean() - planted[name]) < 4 * error, (name, values.mean(), planted[name], error)


def test_one_seed_and_one_sample_leave_components_unknown() -> None:
    correct = np.array([[2, 0, 1, 2]])
    one_seed = components(correct, np.full((1, 4), 2))
    assert math.isnan(one_seed.seed) and math.isnan(one_seed.seed_item)
    # per-item accuracies 1, 0, 0.5, 1: MS_item = 2 * var = 2 * 0.229..., MS_within = 0.5 / 4
    assert one_seed.item == pytest.approx((2 * np.var([1, 0, 0.5, 1], ddof=1) - 0.125) / 2)
    assert all(math.isnan(share) for share in one_seed.shares().values())
    one_sample = components(np.array([[1, 0, 1], [0, 0, 1]]), np.ones((2, 3), dtype=int))
    assert math.isnan(one_sample.sampling) and not math.isnan(one_sample.seed_item)


def test_the_aggregate_stage_writes_the_variance_table(tmp_path: Path, write_samples) -> None:
    samples = [
        write_samples("m", "grpo", 0, "final", "b", {"x": [True, True], "y": [False, False]}),
        write_samples("m", "grpo", 1, "final", "b", {"x": [True, False], "y": [False, False]}),
        write_samples("m", "base", 0, "start", "b", {"x": [True, False], "y": [True, False]}),
    ]
    out = tmp_path / "tables"
    aggregate(["--samples", *map(str, samples), "--out-dir", str(out), "--figures-dir", str(tmp_path / "f")])
    table = pd.read_csv(out / "variance.csv", dtype={"checkpoint": str}).set_index("method")
    grpo = table.loc["grpo"]
    assert (grpo["seeds"], grpo["items"], grpo["samples"], grpo["metric"]) == (2, 2, 2, "acc@2")
    assert grpo["accuracy"] == pytest.approx(0.375)  # the mean of its seeds' acc@2 in scores.csv
    assert (grpo["var_sampling"], grpo["var_item"], grpo["var_seed"]) == pytest.approx((0.125, 0.25, 0.0))
    assert table.loc["base", "seeds"] == 1 and math.isnan(table.loc["base", "var_seed"])
    scores = pd.read_csv(out / "scores.csv")
    acc = scores.query("method == 'grpo' and benchmark == 'b' and metric == 'acc@2'")["value"]
    assert grpo["accuracy"] == pytest.approx(acc.mean())
    markdown = (out / "variance.md").read_text()
    assert "| m | grpo | final | b | 2 | 2 x 2 | 37.5 | 0.0 | 50.0 | 0.0 | 35.4 | 0 % / 89 % / 0 % / 11 % |" in markdown
    assert "| m | base | start | b | 1 | 2 x 2 | 50.0 | – |" in markdown
