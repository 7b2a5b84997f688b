"""The planner (pipeline.power): its power against a brute-force simulation of the same design analysed by the
significance stage's own functions, its GPU-hours of alternative designs, and its command line on the paper's
config."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline import power
from pipeline.cost import PlannedJob, scaled_gpu_hours
from pipeline.power import Component, Design, VarianceModel
from pipeline.seed_aware import Runs, compared_cells, stratified_permutation_pvalues, study_permutation_strata
from pipeline.significance import wilcoxon_rows

# A small study: 3 models x 4 benchmarks (30 to 200 items), 2 seeds per method, 2 samples per item; a run's seed
# luck (sd 4 points) mostly shared by its benchmarks.
ITEMS = {"b30": 30, "b60": 60, "b120": 120, "b200": 200}
DESIGN = Design("small", 3, ITEMS, dict.fromkeys(ITEMS, 2), 2)
SEED_SD, RHO, RUN_ITEM_HALF = 0.04, 0.8, 0.15  # run x item effect uniform on [-0.15, 0.15]
ITEM_LOW, ITEM_HIGH = 0.35, 0.65


def sampling_variance(effect: float) -> float:
    """E[q (1 - q)] of the binary samples, averaged over the two methods: 0.25 - var(q) - effect^2 / 2."""
    variance = (ITEM_HIGH - ITEM_LOW) ** 2 / 12 + SEED_SD**2 + RUN_ITEM_HALF**2 / 3
    return 0.25 - variance - effect**2 / 2


def brute_force_power(effect: float, replications: int, rng: np.random.Generator) -> tuple[float, float]:
    """Binary samples of the whole design, analysed as the significance stage does: the paper's exact one-sided
    Wilcoxon over the cells' seed-mean differences (``wilcoxon_rows``) and the seed-aware permutation test over
    runs within models (``study_permutation_strata``); the fraction of studies with p <= 0.05."""
    paper, aware = 0, 0
    seeds = DESIGN.seeds
    for _ in range(replications):
        runs = {}
        for model in range(DESIGN.models):
            shared = rng.standard_normal((2, seeds, 1))
            for benchmark, items in DESIGN.items.items():
                p = rng.uniform(ITEM_LOW, ITEM_HIGH, items)
                own = rng.standard_normal((2, seeds, 1))
                seed_shift = SEED_SD * (math.sqrt(RHO) * shared + math.sqrt(1 - RHO) * own)
                q = p + seed_shift + rng.uniform(-RUN_ITEM_HALF, RUN_ITEM_HALF, (2, seeds, items))
                q[0] += effect
                n = DESIGN.samples[benchmark]
                correct = rng.binomial(n, np.clip(q, 0, 1)) / n
                ids = tuple(map(str, range(items)))
                runs[f"m{model}", benchmark] = {
                    method: Runs(tuple(range(seeds)), ids, correct[index], n)
                    for index, method in enumerate(("grail", "grpo"))
                }
        cells = compared_cells(runs, "grail", "grpo")
        d = np.round([cell.difference for cell in cells], 10)
        exact = next(row for row in wilcoxon_rows(d, "wilcox", "greater") if row["test"] == "wilcoxon_exact")
        paper += exact["p_value"] <= 0.05
        p_value, _ = stratified_permutation_pvalues(study_permutation_strata(cells), "greater", 500, rng)
        aware += p_value[0] <= 0.05
    return paper / replications, aware / replications


@pytest.mark.parametrize("effect", [0.0, 0.03])
def test_planner_power_matches_brute_force_simulation(effect: float) -> None:
    """At no effect (the false-positive rates: the paper's test is above 5 % here, its cells share runs) and at
    3 points: the planner's (4,000 normal-approximation studies) and the brute force's (300 binary studies)
    rejection rates agree within 3 Monte Carlo sds of their difference."""
    variance = VarianceModel(
        seed_sd=Component(SEED_SD, "test"),
        seed_correlation=Component(RHO, "test"),
        seed_item=Component(RUN_ITEM_HALF**2 / 3, "test"),
        sampling=Component(sampling_variance(effect), "test"),
    )
    runs = power.simulate_runs(DESIGN, variance, 4000, seed=1)
    planned = power.power(power.paper_pvalues(runs, effect)), power.power(power.seed_aware_pvalues(runs, effect, 1))
    brute = brute_force_power(effect, 300, np.random.default_rng(2))
    for planner_rate, brute_rate in zip(planned, brute, strict=True):
        rate = (planner_rate + brute_rate) / 2
        sd = math.sqrt(rate * (1 - rate) * (1 / 4000 + 1 / 300))
        assert abs(planner_rate - brute_rate) < 3 * sd + 1e-9, (effect, planned, brute)
    if effect == 0:
        assert brute[0] > 0.05 + 3 * math.sqrt(0.05 * 0.95 / 300)  # the paper's test: false positives
        assert planned[1] < 0.05 + 3 * math.sqrt(0.05 * 0.95 / 4000)  # the seed-aware one keeps its level


def test_gpu_hours_of_more_seeds_and_more_samples() -> None:
    """Trained runs' jobs scale with the seeds, base's do not; an evaluation's time limit grows only past the
    largest configured evaluation's generations."""
    jobs = [
        PlannedJob("train", {"model": "m", "method": "grpo", "seed": "0"}, gpus=4, runtime=600),
        PlannedJob("evaluate", {"method": "grpo", "seed": "0", "benchmark": "big"}, gpus=4, runtime=60),
        PlannedJob("evaluate", {"method": "grpo", "seed": "0", "benchmark": "small"}, gpus=4, runtime=60),
        PlannedJob("evaluate", {"method": "base", "seed": "0", "benchmark": "small"}, gpus=4, runtime=60),
        PlannedJob("aggregate"),
    ]
    configured = {"big": 500 * 3, "small": 30 * 3}
    same = scaled_gpu_hours(
        jobs, seeds_factor=1, generations=configured, configured_generations=configured, baseline="base"
    )
    assert same == 40 + 4 + 4 + 4
    three_seeds = scaled_gpu_hours(
        jobs, seeds_factor=3, generations=configured, configured_generations=configured, baseline="base"
    )
    assert three_seeds == 3 * (40 + 4 + 4) + 4
    # 16 samples on the small benchmark: 480 generations, within big's 1,500: the bound does not move; 64: 1,920
    more = {"big": 1500, "small": 30 * 16}
    assert (
        scaled_gpu_hours(jobs, seeds_factor=1, generations=more, configured_generations=configured, baseline="base")
        == same
    )
    most = {"big": 1500, "small": 30 * 64}
    grown = scaled_gpu_hours(jobs, seeds_factor=1, generations=most, configured_generations=configured, baseline="base")
    assert grown == pytest.approx(40 + 4 + 2 * 4 * 1920 / 1500)


def test_the_paper_config_with_documented_defaults(capsys) -> None:
    power.main(["--configfile", "configs/paper.yaml", "--replications", "200", "--no-cost"])
    out = capsys.readouterr().out
    assert "grail vs grpo, 5 models x 6 benchmarks (math500 500, aime24 30, amc23 40, minerva 272" in out
    assert "1 seed(s), 3 samples per item" in out
    for name, component in power.DEFAULTS.items():
        assert component.source in out, name
    rows = {line.split("  ")[0]: line for line in out.splitlines()}
    assert {"configured", "3 seeds", "5 seeds", "16 samples on aime24, amc23"} <= set(rows)
    configured = rows["configured"].split()
    assert len(configured) == 9  # name, GPU-h, samples, 2 x false positives, 2 x power, 2 x MDE
    # one seed: the seed-aware test flips the sign of each of the 5 models' difference (32 labellings)
    assert float(configured[4]) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 200)
