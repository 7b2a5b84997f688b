"""The planner (pipeline.power): its power against a brute-force simulation of the same design analysed by the
significance stage's own functions, its GPU-hours of alternative designs, and its command line on the paper's
config."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from pipeline import power
from pipeline.core.io import InputError
from pipeline.stats.paired_tests import wilcoxon_rows
from pipeline.stats.seed_aware import Runs, compared_cells, stratified_permutation_pvalues, study_permutation_strata
from pipeline.study import pilot_variance, power_analysis
from pipeline.study.cost import PlannedJob, scaled_gpu_hours
from pipeline.study.power_analysis import Component, Design, VarianceModel

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
    runs = power_analysis.simulate_runs(DESIGN, variance, 4000, seed=1)
    planned = (
        power_analysis.power(power_analysis.paper_pvalues(runs, effect)),
        power_analysis.power(power_analysis.seed_aware_pvalues(runs, effect, 1)),
    )
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
        PlannedJob("evaluate", {"method": "grpo", "seed": "0", "benchmark": "big"}, 1, 4, 60, benchmarks=("big",)),
        PlannedJob("evaluate", {"method": "grpo", "seed": "0", "benchmark": "small"}, 1, 4, 60, benchmarks=("small",)),
        PlannedJob("evaluate", {"method": "base", "seed": "0", "benchmark": "small"}, 1, 4, 60, benchmarks=("small",)),
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
    # one job per checkpoint: its limit is sized for both benchmarks, 1,590 generations; 64 samples on the small
    # one make 3,420
    per_checkpoint = [
        jobs[0],
        PlannedJob("evaluate", {"method": "grpo", "seed": "0"}, 1, 4, 60, benchmarks=("big", "small")),
        PlannedJob("evaluate_analysed", {"method": "grpo", "seed": "0"}, 1, 4, 60, benchmarks=("small",)),
    ]
    bound = scaled_gpu_hours(
        per_checkpoint, seeds_factor=1, generations=most, configured_generations=configured, baseline="base"
    )
    assert bound == pytest.approx(40 + 4 * 3420 / 1590 + 4 * 1920 / 1590)


def test_the_paper_config_with_documented_defaults(capsys) -> None:
    power.main(["--configfile", "configs/paper.yaml", "--replications", "200", "--no-cost"])
    out = capsys.readouterr().out
    assert "grail vs grpo, 5 models x 6 benchmarks (math500 500, aime24 30, amc23 40, minerva 272" in out
    assert "1 seed(s), 3 samples per item" in out
    for name, component in power_analysis.DEFAULTS.items():
        assert component.source in out, name
    rows = {line.split("  ")[0]: line for line in out.splitlines()}
    assert {"configured", "3 seeds", "5 seeds", "16 samples on aime24, amc23"} <= set(rows)
    configured = rows["configured"].split()
    assert len(configured) == 9  # name, GPU-h, samples, 2 x false positives, 2 x power, 2 x MDE
    # one seed: the seed-aware test flips the sign of each of the 5 models' difference (32 labellings)
    assert float(configured[4]) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 200)


# --------------------------------------------------------------------------------------------- the pilot

SAMPLES_PER_ITEM = 100


def write_pilot(write_samples, accuracies: dict[tuple[str, str, int, str], float]) -> None:
    """Final samples files of runs (model, method, seed, benchmark) -> accuracy (a multiple of 1 / 100): each of
    the 10 items gets that accuracy, so a run's score holds no item noise and the pilot's seed terms are those of
    the planned accuracies."""
    for (model, method, seed, benchmark), accuracy in accuracies.items():
        correct = round(accuracy * SAMPLES_PER_ITEM)
        flags = [True] * correct + [False] * (SAMPLES_PER_ITEM - correct)
        write_samples(model, method, seed, "final", benchmark, {f"i{item}": flags for item in range(10)})


def spread_runs(models: int, methods: dict[str, float], seeds: int = 2, same_sign: int | None = None) -> dict:
    """Runs of each (model, method) at 0.5 +- the method's spread on benchmarks b1 and b2: seed s is at +spread
    on both for even s and at -spread for odd s; b2's shift has the opposite sign in the (model, method)s past
    the first ``same_sign`` (counted over models within methods), which makes rho (2 same_sign - groups) / groups."""
    accuracies = {}
    for index, (model, (method, spread)) in enumerate(itertools.product(range(models), methods.items())):
        b2_sign = 1 if same_sign is None or index < same_sign else -1
        for seed in range(seeds):
            shift = spread if seed % 2 == 0 else -spread
            accuracies[f"m{model}", method, seed, "b1"] = 0.5 + shift
            accuracies[f"m{model}", method, seed, "b2"] = 0.5 + b2_sign * shift
    return accuracies


def test_a_correlation_from_one_degree_of_freedom_falls_back_to_its_default(write_samples, tmp_path, capsys) -> None:
    """One model, GRAIL's 2 seeds and GRPO's 1: rho from 1 degree of freedom, raw -1 (b2 moves against b1), is not
    clipped to 0 but replaced by the default 0.5, flagged, with the raw value, its degrees of freedom and the
    minimum in the source; the printed summary marks it."""
    runs = spread_runs(1, {"grail": 0.05}, same_sign=0)
    runs |= {("m0", "grpo", 0, "b1"): 0.5, ("m0", "grpo", 0, "b2"): 0.5}
    write_pilot(write_samples, runs)
    pilot = pilot_variance.pilot_variance(tmp_path, ("grail", "grpo"))
    rho = pilot.seed_correlation
    assert rho.fallback and rho.value == power_analysis.DEFAULTS["seed_correlation"].value
    assert "raw -1.00 from 1 degree of freedom of grail, under the minimum of 10: fallback to the default 0.50" in (
        rho.source
    )
    assert pilot.seed_sd.fallback and "under the minimum of 6" in pilot.seed_sd.source
    power.main(["--configfile", "configs/paper.yaml", "--pilot", str(tmp_path), "--replications", "100", "--no-cost"])
    out = capsys.readouterr().out
    assert "variance components (fallback to the default: seed sd, seed correlation across benchmarks):" in out
    assert "  seed correlation across benchmarks 0.50 [fallback] (pilot " in out


@pytest.mark.parametrize(("same_sign", "rho", "said"), [(8, 0.6, "(minimum 10)"), (2, 0.0, "clipped to 0")])
def test_seed_terms_from_enough_degrees_of_freedom_are_used_as_measured(
    write_samples, tmp_path, same_sign: int, rho: float, said: str
) -> None:
    """5 models x GRAIL and GRPO x 2 seeds: 10 degrees of freedom for both seed terms. The seed sd is the runs'
    (spread 2 points: sd 2 sqrt(2)) and rho theirs: 0.6 with 8 of the 10 (model, method)s moving b2 with b1; with 2,
    the raw -0.6 is clipped to 0, and the source says so."""
    write_pilot(write_samples, spread_runs(5, {"grail": 0.02, "grpo": 0.02}, same_sign=same_sign))
    pilot = pilot_variance.pilot_variance(tmp_path, ("grail", "grpo"))
    assert not pilot.seed_sd.fallback and pilot.seed_sd.value == pytest.approx(0.02 * math.sqrt(2))
    assert "10 degrees of freedom of grail and grpo (minimum 6)" in pilot.seed_sd.source
    assert not pilot.seed_correlation.fallback and pilot.seed_correlation.value == pytest.approx(rho)
    assert f"{2 * same_sign / 10 - 1:.2f} from 10 degrees of freedom of grail and grpo" in pilot.seed_correlation.source
    assert said in pilot.seed_correlation.source


def test_the_compared_methods_own_seed_spread_not_another_methods(write_samples, tmp_path) -> None:
    """3 models: OAR-G's seeds 20 points apart, GRAIL's and GRPO's 2 (6 degrees of freedom of their own). GRAIL
    vs GRPO gets their seed sd, sqrt(2) points, whatever OAR-G's runs do; OAR-G vs GRAIL gets theirs."""
    write_pilot(write_samples, spread_runs(3, {"grail": 0.01, "grpo": 0.01, "oar_g": 0.1}))
    pilot = pilot_variance.pilot_variance(tmp_path, ("grail", "grpo"))
    assert pilot.seed_sd.value == pytest.approx(0.01 * math.sqrt(2))
    assert "of grail and grpo" in pilot.seed_sd.source and "oar_g" not in pilot.seed_sd.source
    spread = pilot_variance.pilot_variance(tmp_path, ("oar_g", "grail")).seed_sd.value
    assert spread == pytest.approx(math.sqrt((0.01**2 + 0.1**2) / 2 * 2))
    assert power_analysis.compared_pair(["grpo", "grail", "oar_g"], ["oar_g", "grail"]) == ("oar_g", "grail")
    with pytest.raises(InputError, match="--methods"):
        power_analysis.compared_pair(["grpo", "grail"], ["grail", "oar_g"])


def test_pooling_says_so_and_names_the_method_that_dominates(write_samples, tmp_path) -> None:
    """GRAIL has one seed per model: the seed sd pools GRPO's and OAR-G's runs (8 degrees of freedom), and the
    source says that it pools, why, and that OAR-G's 20-point spread contributes most (99 %)."""
    runs = spread_runs(4, {"grpo": 0.01, "oar_g": 0.1})
    runs |= {(f"m{model}", "grail", 0, b): 0.5 for model in range(4) for b in ("b1", "b2")}
    write_pilot(write_samples, runs)
    seed_sd = pilot_variance.pilot_variance(tmp_path, ("grail", "grpo")).seed_sd
    assert not seed_sd.fallback and seed_sd.value == pytest.approx(math.sqrt((0.01**2 + 0.1**2) / 2 * 2))
    assert "from 8 degrees of freedom pooled over grpo, oar_g (the compared methods' own runs: grail 0, grpo 4" in (
        seed_sd.source
    )
    assert "oar_g contributes most, 99 %" in seed_sd.source


def test_minimum_degrees_of_freedom_follow_their_criteria() -> None:
    """The module docstring's reasons: from MIN_SEED_SD_DF on, the chance that the estimated seed sd is under half
    the true one, P(chi2_nu < nu / 4), is under 5 %; from MIN_SEED_CORRELATION_DF on, the 95 % Fisher interval of
    an estimate of 0.5 is narrower than [0, 1]; one degree of freedom fewer meets neither."""

    def under_half(nu: int) -> float:
        return stats.chi2.cdf(nu / 4, nu)

    def interval_width(nu: int) -> float:
        half = stats.norm.ppf(0.975) / math.sqrt(nu - 2)
        return math.tanh(math.atanh(0.5) + half) - math.tanh(math.atanh(0.5) - half)

    assert under_half(pilot_variance.MIN_SEED_SD_DF) < 0.05 <= under_half(pilot_variance.MIN_SEED_SD_DF - 1)
    assert (
        interval_width(pilot_variance.MIN_SEED_CORRELATION_DF)
        < 1
        <= interval_width(pilot_variance.MIN_SEED_CORRELATION_DF - 1)
    )
