"""Variance components of the planner (``pipeline.study.power_analysis``) measured on a pilot: ``--pilot RESULTS_DIR``
(a finished study: its samples at the ``final`` checkpoint). The pilot estimates the compared methods' own components
(``--methods A B``; GRAIL and GRPO by default): another method's seed luck is not theirs (in the default study's
recorded runs, docs/lab-notes.md, OAR-G's seeds spread most). The seed x item and sampling variances are the
mean of ``pipeline.stats.variance``'s estimates over the compared methods' (model, benchmark) cells. The seed terms come
from the runs of each (model, method), weighted by their degrees of freedom S - 1 (the runs are the seed's
replicates; a run's benchmarks share its luck, so they add none):

    var_seed = sum_g (S_g - 1) v_g / sum_g (S_g - 1),   v_g = mean_b (var_s X_gbs - MS_inter_gb / (m_b n_b)),
    rho = sum_g (S_g - 1) c_g / sum_g (S_g - 1) v_g,    c_g = mean over benchmark pairs of cov_s(X_gbs, X_gb's),

with X_gbs the accuracy of run s on benchmark b (``pipeline.stats.variance``'s ANOVA estimate of var_seed, before its
clipping at 0; rho only over the (model, method)s with 2 benchmarks or more). When a compared method has no second
seed, or the two together fall short of the minimum below, the seed terms pool every trained method's runs if that
reaches it, and the source says so and which method contributes most (its part of sum_g (S_g - 1) |v_g|); if it
does not, the compared methods' own runs give the raw estimate the fallback reports. A seed term from fewer
degrees of freedom than its minimum falls back to its default, flagged, with the raw estimate and its degrees of
freedom; a raw estimate out of range (a negative seed variance, rho outside [0, 1]) is clipped and the source says
so. The minimums, chosen for the direction in which a wrong component misleads the planner:

- seed sd, MIN_SEED_SD_DF = 6: var_seed's estimate from nu degrees of freedom is about var_seed chi2_nu / nu, and
  an estimate that is too small makes the planner promise power the design lacks. From 6 on, the chance that the
  estimated sd is under half the true one, P(chi2_nu < nu / 4), is under 5 % (4.1 %); at 2, the default study's
  GRAIL and GRPO, it is 22 %.
- seed correlation, MIN_SEED_CORRELATION_DF = 10: rho's estimate is about that of a correlation of nu + 1 pairs,
  Fisher's z = atanh(r) with sd 1 / sqrt(nu - 2). From 10 on, the 95 % interval of an estimate of 0.5 (the
  default), tanh(atanh(0.5) +- 1.96 / sqrt(nu - 2)) = [-0.14, 0.85] at 10, is narrower than [0, 1]; with fewer it
  is wider than every value rho can take, and says less than the default's assumption. A pilot of the paper's 5
  models with 2 seeds of each compared method has 10.

``--seed-sd`` and ``--seed-correlation`` override the pilot or the defaults.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.core.io import InputError, read_jsonl
from pipeline.core.layout import BASELINE_METHOD, FINAL_CHECKPOINT
from pipeline.stats.metrics import group_by_item, parse_samples_path
from pipeline.stats.variance import ItemCounts, run_item_variance, stack_seeds, variance_table
from pipeline.study.power_analysis import DEFAULTS, Component, VarianceModel, component_text

MIN_SEED_SD_DF = 6  # degrees of freedom a pilot's seed sd needs (module docstring)
MIN_SEED_CORRELATION_DF = 10  # and its seed correlation


def pilot_variance(results_dir: Path, compared: tuple[str, str], checkpoint: str = FINAL_CHECKPOINT) -> VarianceModel:
    """The components measured on a finished study for the ``compared`` methods (module docstring); a component
    the pilot cannot estimate, or estimates from too few degrees of freedom, falls back to its default."""
    paths = sorted((results_dir / "eval").glob(f"*/*/seed*/{checkpoint}/*.jsonl"))
    counts = []
    for path in paths:
        key = parse_samples_path(path)
        if key.method != BASELINE_METHOD:
            counts.append((key, ItemCounts.from_items(group_by_item(read_jsonl(path), source=str(path)))))
    if not counts:
        raise InputError(f"--pilot {results_dir}: no samples of a trained method under eval/*/*/seed*/{checkpoint}/")
    table = variance_table(counts)
    runs = seed_runs(counts)
    where = f"pilot {results_dir}"
    return VarianceModel(
        seed_sd=seed_sd_component(runs, compared, where),
        seed_correlation=seed_correlation_component(runs, compared, where),
        seed_item=cell_component(table, "seed_item", compared, where),
        sampling=cell_component(table, "sampling", compared, where),
    )


def fallback(name: str, reason: str) -> Component:
    """The default of component ``name``, flagged, with why the pilot's estimate is not used."""
    default = DEFAULTS[name]
    return Component(
        default.value,
        f"{reason}: fallback to the default {component_text(name, default.value)}; the default's source: "
        f"{default.source}",
        fallback=True,
    )


def dominant_method(contributions: dict[str, float]) -> str:
    """Which method contributes most to a pooled estimate, from each method's non-negative contribution."""
    total = sum(contributions.values())
    if total == 0:
        return "every method's estimate is 0"
    method = max(contributions, key=contributions.__getitem__)
    return f"{method} contributes most, {100 * contributions[method] / total:.0f} %"


@dataclass(frozen=True)
class SeedRuns:
    """The runs of one (model, method) of a pilot, on the benchmarks every one of them was evaluated on: ``scores``
    their accuracies (seeds x benchmarks), ``noise`` per benchmark the variance a run's accuracy gets from its
    items and samples, ``run_item_variance`` / m = (var_seed_item + var_sampling / n) / m."""

    method: str
    scores: np.ndarray
    noise: np.ndarray

    @property
    def degrees_of_freedom(self) -> int:
        """S - 1: the runs, not their benchmarks, replicate the seed (a run's benchmarks share its luck)."""
        return len(self.scores) - 1

    @property
    def seed_variance(self) -> float:
        """v = mean_b (var_s X_bs - noise_b), ``pipeline.stats.variance``'s (MS_seed - MS_inter) / (m n) averaged over
        the benchmarks, not clipped at 0."""
        return float((self.scores.var(axis=0, ddof=1) - self.noise).mean())

    @property
    def seed_covariance(self) -> float:
        """c = the mean over benchmark pairs of cov_s(X_bs, X_b's), rho var_seed (the items of two benchmarks are
        independent, so it has no noise term); NaN with one benchmark."""
        if self.scores.shape[1] < 2:
            return math.nan
        matrix = np.cov(self.scores, rowvar=False)
        return float(matrix[np.triu_indices_from(matrix, 1)].mean())


def seed_runs(counts: list[tuple]) -> list[SeedRuns]:
    """Per (model, method) with 2 seeds or more on its benchmarks of 2 items or more (with one item the run x item
    noise is not measurable), its ``SeedRuns`` over the seeds that every one of those benchmarks has."""
    grouped: dict[tuple[str, str], dict[str, dict[int, ItemCounts]]] = defaultdict(lambda: defaultdict(dict))
    for key, item_counts in counts:
        if len(item_counts.ids) > 1:
            grouped[key.model, key.method][key.benchmark][key.seed] = item_counts
    runs = []
    for (model, method), by_benchmark in sorted(grouped.items()):
        seeds = sorted(set.intersection(*(set(by_seed) for by_seed in by_benchmark.values())))
        if len(seeds) < 2:
            continue
        scores, noise = [], []
        for benchmark, by_seed in sorted(by_benchmark.items()):
            correct, samples = stack_seeds({seed: by_seed[seed] for seed in seeds}, f"{model}/{method}/{benchmark}")
            cells = correct / samples
            scores.append(cells.mean(axis=1))
            noise.append(run_item_variance(cells) / cells.shape[1])
        runs.append(SeedRuns(method, np.column_stack(scores), np.array(noise)))
    return runs


@dataclass(frozen=True)
class PooledSeeds:
    """The seed terms of some (model, method)s' runs, each weighted by its degrees of freedom (module docstring)."""

    runs: list[SeedRuns]
    scope: str  # whose runs, for the source: "of grail and grpo", or pooled and who dominates

    @property
    def degrees_of_freedom(self) -> int:
        return sum(run.degrees_of_freedom for run in self.runs)

    def _weighted(self, values: list[float]) -> float:
        weights = [run.degrees_of_freedom for run in self.runs]
        return float(np.average(values, weights=weights))

    @property
    def seed_variance(self) -> float:
        """sum_g (S_g - 1) v_g / sum_g (S_g - 1)."""
        return self._weighted([run.seed_variance for run in self.runs])

    @property
    def seed_correlation(self) -> float:
        """rho = sum_g (S_g - 1) c_g / sum_g (S_g - 1) v_g (NaN when that seed variance is not above 0)."""
        variance = self.seed_variance
        return self._weighted([run.seed_covariance for run in self.runs]) / variance if variance > 0 else math.nan


def pooled_seeds(runs: list[SeedRuns], compared: tuple[str, str], minimum: int) -> PooledSeeds:
    """The compared methods' own runs when each has a second seed and together they reach ``minimum`` degrees of
    freedom. Else every trained method's, pooled, when that reaches it (or the compared methods have no runs with
    2 seeds), saying so and which method contributes most (its part of sum_g (S_g - 1) |v_g|): a method with
    other seed luck then moves the estimate. Else the compared methods' own, whose raw estimate the fallback
    reports."""
    own = [run for run in runs if run.method in compared]
    own_scope = f"of {' and '.join(sorted({run.method for run in own}))}"
    own_df = {method: sum(run.degrees_of_freedom for run in own if run.method == method) for method in compared}
    if len(own) == len(runs) or (all(own_df.values()) and sum(own_df.values()) >= minimum):
        return PooledSeeds(own, own_scope)
    contributions: dict[str, float] = defaultdict(float)
    for run in runs:
        contributions[run.method] += run.degrees_of_freedom * abs(run.seed_variance)
    why = ", ".join(f"{method} {df}" for method, df in own_df.items())
    pooled = PooledSeeds(
        runs,
        f"pooled over {', '.join(sorted(contributions))} (the compared methods' own runs: {why} degrees of freedom; "
        f"{dominant_method(contributions)})",
    )
    return pooled if pooled.degrees_of_freedom >= minimum or not own else PooledSeeds(own, own_scope)


def _degrees(count: int) -> str:
    return f"{count} degree{'' if count == 1 else 's'} of freedom"


def seed_sd_component(runs: list[SeedRuns], compared: tuple[str, str], where: str) -> Component:
    """sqrt(var_seed) from the runs (``pooled_seeds``); the default from under MIN_SEED_SD_DF degrees of freedom;
    0 from a negative raw variance (the seeds differ less than their items' noise), said in the source."""
    pooled = pooled_seeds(runs, compared, MIN_SEED_SD_DF)
    if not pooled.runs:
        return fallback("seed_sd", f"{where}: no (model, method) has 2 seeds ({_degrees(0)}, minimum {MIN_SEED_SD_DF})")
    variance, df = pooled.seed_variance, pooled.degrees_of_freedom
    value = f"{100 * math.sqrt(variance):.2f} points" if variance >= 0 else f"variance {1e4 * variance:.2f} points^2"
    estimate = f"{value} from {_degrees(df)} {pooled.scope}"
    if df < MIN_SEED_SD_DF:
        return fallback("seed_sd", f"{where}: raw {estimate}, under the minimum of {MIN_SEED_SD_DF}")
    if variance < 0:
        return Component(0.0, f"{where}: raw {estimate}, below 0: 0 points")
    return Component(math.sqrt(variance), f"{where}: {estimate} (minimum {MIN_SEED_SD_DF})")


def seed_correlation_component(runs: list[SeedRuns], compared: tuple[str, str], where: str) -> Component:
    """rho from the runs on 2 benchmarks or more (``pooled_seeds``); the default from under MIN_SEED_CORRELATION_DF
    degrees of freedom or without seed variance; a raw estimate outside [0, 1] clipped, said in the source."""
    minimum = MIN_SEED_CORRELATION_DF
    pooled = pooled_seeds([run for run in runs if run.scores.shape[1] > 1], compared, minimum)
    if not pooled.runs:
        reason = f"{where}: no (model, method) has 2 seeds on 2 benchmarks ({_degrees(0)}, minimum {minimum})"
        return fallback("seed_correlation", reason)
    raw, df = pooled.seed_correlation, pooled.degrees_of_freedom
    if math.isnan(raw):
        reason = (
            f"{where}: no seed variance {pooled.scope} ({_degrees(df)}, minimum {minimum}) to measure a correlation "
            "against"
        )
        return fallback("seed_correlation", reason)
    estimate = f"{raw:.2f} from {_degrees(df)} {pooled.scope}"
    if df < minimum:
        return fallback("seed_correlation", f"{where}: raw {estimate}, under the minimum of {minimum}")
    clipped = min(1.0, max(0.0, raw))
    if clipped != raw:
        return Component(clipped, f"{where}: raw {estimate}, outside [0, 1]: clipped to {clipped:.0f}")
    return Component(raw, f"{where}: {estimate} (minimum {minimum})")


NOT_ESTIMABLE = {"seed_item": "it needs 2 seeds", "sampling": "it needs 2 samples per item"}


def cell_component(table: pd.DataFrame, name: str, compared: tuple[str, str], where: str) -> Component:
    """The mean of ``pipeline.stats.variance``'s var_<name> over the compared methods' (model, benchmark) cells; over
    every trained method's, pooled and saying which contributes most, when the compared ones have none; the
    default when no cell has it."""
    column = f"var_{name}"
    estimable = table.dropna(subset=[column])
    own = estimable[estimable["method"].isin(compared)]
    if not own.empty:
        return Component(
            float(own[column].mean()),
            f"{where}: {len(own)} (model, benchmark) cells of {' and '.join(sorted(set(own['method'])))}",
        )
    if estimable.empty:
        return fallback(name, f"{where}: not estimable ({NOT_ESTIMABLE[name]})")
    contributions = estimable.groupby("method")[column].sum().to_dict()
    return Component(
        float(estimable[column].mean()),
        f"{where}: {len(estimable)} (model, benchmark) cells pooled over {', '.join(sorted(contributions))} "
        f"(none of {' and '.join(compared)}; {dominant_method(contributions)})",
    )
