"""The planner: can a study's design detect the effect it asks about, and what would it take?

    python -m pipeline.power --configfile CONFIG [--pilot RESULTS_DIR] [--effect 0.036] [--replications 2000]
                             [--seed-sd POINTS] [--seed-correlation RHO] [--seed 0] [--no-cost]

It simulates the study's own analysis of method A (GRAIL) against method B (GRPO) under the config's design
(models, benchmarks with their item counts, training seeds, samples per item), for the configured design and a
few alternatives (more seeds; more samples per item on the small benchmarks), and prints per design the power for
the effect (one-sided, alpha = 0.05, as the paper's test), the minimum detectable effect at 80 % power and the
GPU-hour bound of the cost estimate (``pipeline.cost``, from the study's ``snakemake -n`` plan).

Simulated run scores (the accuracy of run s of method A or B of model k on benchmark b, m_b items, n_b samples):

    X_kbAs = effect + sigma_seed (sqrt(rho) u_kAs + sqrt(1 - rho) v_kbAs) + sqrt((var_seed_item + var_sampling / n_b)
             / m_b) w_kbAs,
    X_kbBs = the same without the effect, u, v, w independent standard normals.

A run's seed effect (``seed_sd`` = sigma_seed) is shared by its benchmarks with correlation rho (a good run is
good everywhere); the seed x item and sampling components (``pipeline.variance``) average over the run's items and
samples. Item difficulty and the model's level cancel in every difference between A and B on the same items, so
they are not simulated. The analyses, on each simulated study:

- the paper's: d_kb = mean_s X_kbAs - mean_s X_kbBs over the (model, benchmark) cells, the exact one-sided
  Wilcoxon signed-rank test over the cells (``scipy.stats.wilcoxon(d, alternative="greater", method="exact")``);
- the seed-aware one: the permutation test over runs within models of the average of d over cells
  (``pipeline.seed_aware.stratified_permutation_pvalues``, one-sided): with one seed it flips the sign of each
  model's difference, 2^models labellings.

Power = the fraction of simulated studies with p <= alpha; the minimum detectable effect is found by bisection on
the effect with the same simulated noise (power grows with the effect in every simulated study).

Variance components come from ``--pilot RESULTS_DIR`` (a finished study: its samples at the ``final``
checkpoint, pooled over models, trained methods and benchmarks: ``pipeline.variance``'s estimates, and rho from
the runs' scores), or from DEFAULTS, each with its source; a component the pilot cannot estimate (one seed: the
seed terms) keeps its default, and ``--seed-sd`` / ``--seed-correlation`` override either.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from pipeline import cost
from pipeline.config import Study, load_config
from pipeline.io import InputError, read_jsonl, run_cli
from pipeline.layout import BASELINE_METHOD, FINAL_CHECKPOINT
from pipeline.metrics import group_by_item, parse_samples_path
from pipeline.seed_aware import stratified_permutation_pvalues
from pipeline.variance import ItemCounts, variance_table

ALPHA = 0.05
TARGET_POWER = 0.8
PAPER_EFFECT = 0.036  # GRAIL's claimed gain in average acc@3 over GRPO (upstream's README)
SMALL_BENCHMARK_ITEMS = 100  # "small": the benchmarks whose samples per item an alternative raises
MORE_SAMPLES = 16
ALTERNATIVE_SEEDS = (3, 5)
PERMUTATION_DRAWS = 500  # random labellings per simulated study when there are more than EXACT_ARRANGEMENTS
BISECTION_STEPS = 12
MAX_EFFECT = 0.5


@dataclass(frozen=True)
class Component:
    """One variance component's value and where it came from."""

    value: float
    source: str


# Documented defaults (docs/output.md, "The planner"): what is known without a pilot study.
DEFAULTS = {
    "seed_sd": Component(
        0.02,
        "2 points: this project's default study (tiny model, arith_add, 400 items x 4 samples, 2 seeds) measured "
        "seed-to-seed gaps of 1.7 (GRPO), 6.1 (OAR-G) and 3.2 (GRAIL) points, about 2.4 points of seed sd after "
        "the item noise; no published measurement for the paper's models",
    ),
    "seed_correlation": Component(
        0.5, "an assumption: how much a run's seed luck carries across its benchmarks (pilot: measured)"
    ),
    "seed_item": Component(
        0.01,
        "an assumption: runs of one method differ in which items they solve by an item-level sd of 10 points",
    ),
    "sampling": Component(
        0.075,
        "bethgelab/sober-reasoning (Hochlehnert et al. 2025): about 5 points of sd (2-7) across evaluation seeds "
        "on AIME24's 30 items with one sample each, i.e. 30 x 0.05^2",
    ),
}


@dataclass(frozen=True)
class VarianceModel:
    """The components the simulation needs (fractions, not points)."""

    seed_sd: Component
    seed_correlation: Component
    seed_item: Component
    sampling: Component

    def lines(self) -> list[str]:
        return [
            f"  seed sd {100 * self.seed_sd.value:.2f} points ({self.seed_sd.source})",
            f"  seed correlation across benchmarks {self.seed_correlation.value:.2f} ({self.seed_correlation.source})",
            f"  seed x item variance {self.seed_item.value:.4f} ({self.seed_item.source})",
            f"  sampling variance {self.sampling.value:.4f} ({self.sampling.source})",
        ]


@dataclass(frozen=True)
class Design:
    """What a study measures: models, items and samples per item of each benchmark, training seeds per method."""

    name: str
    models: int
    items: dict[str, int]
    samples: dict[str, int]
    seeds: int

    @property
    def cells(self) -> int:
        return self.models * len(self.items)


def default_variance() -> VarianceModel:
    return VarianceModel(**DEFAULTS)


# --------------------------------------------------------------------------------------------- simulation


def simulate_runs(design: Design, variance: VarianceModel, replications: int, seed: int) -> np.ndarray:
    """Run scores without the effect, shape (replications, models, benchmarks, 2 methods (A, B), seeds)."""
    rng = np.random.default_rng(seed)
    shape = (replications, design.models, len(design.items), 2, design.seeds)
    rho = variance.seed_correlation.value
    shared = rng.standard_normal((replications, design.models, 1, 2, design.seeds))
    own = rng.standard_normal(shape)
    noise = np.array(
        [
            math.sqrt((variance.seed_item.value + variance.sampling.value / design.samples[name]) / items)
            for name, items in design.items.items()
        ]
    )
    seed_part = variance.seed_sd.value * (math.sqrt(rho) * shared + math.sqrt(1 - rho) * own)
    return seed_part + noise[None, None, :, None, None] * rng.standard_normal(shape)


def _with_effect(runs: np.ndarray, effect: float) -> np.ndarray:
    shifted = runs.copy()
    shifted[:, :, :, 0] += effect
    return shifted


def paper_pvalues(runs: np.ndarray, effect: float) -> np.ndarray:
    """Per simulated study, the exact one-sided Wilcoxon p over the (model, benchmark) cells' seed-mean d."""
    shifted = _with_effect(runs, effect)
    d = (shifted[:, :, :, 0].mean(axis=-1) - shifted[:, :, :, 1].mean(axis=-1)).reshape(len(runs), -1)
    return stats.wilcoxon(d, axis=1, alternative="greater", method="exact").pvalue


def seed_aware_pvalues(runs: np.ndarray, effect: float, seed: int) -> np.ndarray:
    """Per simulated study, the one-sided permutation p over runs within models of the average d over cells."""
    shifted = _with_effect(runs, effect)
    seeds, cells = runs.shape[-1], runs.shape[1] * runs.shape[2]
    summed = shifted.sum(axis=2).reshape(len(runs), runs.shape[1], 2 * seeds) / cells  # over benchmarks, A first
    strata = [(summed[:, model], seeds) for model in range(runs.shape[1])]
    p_values, _ = stratified_permutation_pvalues(strata, "greater", PERMUTATION_DRAWS, np.random.default_rng(seed))
    return p_values


def power(p_values: np.ndarray, alpha: float = ALPHA) -> float:
    return float((p_values <= alpha + 1e-12).mean())


def minimum_detectable_effect(pvalues, target: float = TARGET_POWER) -> float | None:
    """The smallest effect (to 1/2^BISECTION_STEPS of the bracket) whose power reaches ``target``; None when even
    MAX_EFFECT does not (the test cannot reach alpha with this design)."""
    if power(pvalues(MAX_EFFECT)) < target:
        return None
    low, high = 0.0, MAX_EFFECT
    while power(pvalues(high / 4)) >= target and high > 1e-4:
        high /= 4
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2
        if power(pvalues(middle)) >= target:
            high = middle
        else:
            low = middle
    return high


@dataclass(frozen=True)
class Assessment:
    """Both analyses' false-positive rate (effect 0), power for the effect and minimum detectable effect."""

    design: Design
    size_paper: float
    size_seed_aware: float
    power_paper: float
    power_seed_aware: float
    mde_paper: float | None
    mde_seed_aware: float | None
    gpu_hours: float | None
    evaluation_samples: int


def assess(
    design: Design, variance: VarianceModel, effect: float, replications: int, seed: int, gpu_hours: float | None
) -> Assessment:
    """Power and minimum detectable effect of both analyses for one design."""
    runs = simulate_runs(design, variance, replications, seed)

    def seed_aware(value: float) -> np.ndarray:
        return seed_aware_pvalues(runs, value, seed)

    def paper(value: float) -> np.ndarray:
        return paper_pvalues(runs, value)

    return Assessment(
        design=design,
        size_paper=power(paper(0.0)),
        size_seed_aware=power(seed_aware(0.0)),
        power_paper=power(paper(effect)),
        power_seed_aware=power(seed_aware(effect)),
        mde_paper=minimum_detectable_effect(paper),
        mde_seed_aware=minimum_detectable_effect(seed_aware),
        gpu_hours=gpu_hours,
        evaluation_samples=evaluation_samples(design),
    )


def evaluation_samples(design: Design) -> int:
    """Samples a study generates in evaluation for the two compared methods' final checkpoints."""
    return 2 * design.models * design.seeds * sum(design.items[b] * design.samples[b] for b in design.items)


# --------------------------------------------------------------------------------------------- designs and costs


def alternatives(configured: Design) -> list[Design]:
    """The configured design, more seeds (3 and 5), more samples per item on the small benchmarks, and both."""
    small = [name for name, items in configured.items.items() if items < SMALL_BENCHMARK_ITEMS]
    more_samples = {name: max(n, MORE_SAMPLES) if name in small else n for name, n in configured.samples.items()}
    designs = [configured]
    designs += [
        replace(configured, name=f"{seeds} seeds", seeds=seeds)
        for seeds in ALTERNATIVE_SEEDS
        if seeds > configured.seeds
    ]
    if small and more_samples != configured.samples:
        label = f"{MORE_SAMPLES} samples on {', '.join(small)}"
        designs.append(replace(configured, name=label, samples=more_samples))
        seeds = max(configured.seeds, ALTERNATIVE_SEEDS[0])
        designs.append(replace(configured, name=f"{seeds} seeds, {label}", seeds=seeds, samples=more_samples))
    return designs


def design_gpu_hours(jobs: list[cost.PlannedJob], configured: Design, design: Design) -> float:
    """The GPU-hour bound of ``design`` from the configured study's plan (``cost.scaled_gpu_hours``)."""
    return cost.scaled_gpu_hours(
        jobs,
        seeds_factor=design.seeds / configured.seeds,
        generations={name: design.items[name] * design.samples[name] for name in design.items},
        configured_generations={name: configured.items[name] * configured.samples[name] for name in configured.items},
        baseline=BASELINE_METHOD,
    )


# --------------------------------------------------------------------------------------------- the pilot


def pilot_variance(results_dir: Path, checkpoint: str = FINAL_CHECKPOINT) -> VarianceModel:
    """The components measured on a finished study (module docstring); defaults where it cannot estimate them."""
    paths = sorted((results_dir / "eval").glob(f"*/*/seed*/{checkpoint}/*.jsonl"))
    counts = []
    for path in paths:
        key = parse_samples_path(path)
        if key.method != BASELINE_METHOD:
            counts.append((key, ItemCounts.from_items(group_by_item(read_jsonl(path), source=str(path)))))
    if not counts:
        raise InputError(f"--pilot {results_dir}: no samples of a trained method under eval/*/*/seed*/{checkpoint}/")
    table = variance_table(counts)
    where = f"pilot {results_dir}: {len(table)} (model, method, benchmark) cells, {int(table['seeds'].max())} seed(s)"

    def measured(column: str, name: str, transform=lambda v: v) -> Component:
        values = table[column].dropna()
        if values.empty:
            return replace(DEFAULTS[name], source=f"default, not estimable from the pilot: {DEFAULTS[name].source}")
        return Component(float(transform(values.mean())), where)

    seed_sd = measured("var_seed", "seed_sd", math.sqrt)
    correlation = seed_correlation(counts, table)
    return VarianceModel(
        seed_sd=seed_sd,
        seed_correlation=Component(correlation, where)
        if correlation is not None
        else replace(
            DEFAULTS["seed_correlation"],
            source=f"default, not estimable from the pilot: {DEFAULTS['seed_correlation'].source}",
        ),
        seed_item=measured("var_seed_item", "seed_item"),
        sampling=measured("var_sampling", "sampling"),
    )


def seed_correlation(counts: list[tuple], table: pd.DataFrame) -> float | None:
    """rho: the covariance of a run's scores on two benchmarks (deviations from its (model, method)'s mean over
    seeds, pooled over models, methods and benchmark pairs) over the seed variance; None without 2 seeds and 2
    benchmarks, or without seed variance."""
    scores: dict[tuple[str, str], dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for key, item_counts in counts:
        scores[key.model, key.method][key.benchmark][key.seed] = float(item_counts.accuracy.mean())
    covariance, pairs = 0.0, 0
    for by_benchmark in scores.values():
        frame = pd.DataFrame(by_benchmark).dropna()  # seeds x benchmarks
        if len(frame) < 2 or frame.shape[1] < 2:
            continue
        matrix = frame.cov().to_numpy()
        upper = np.triu_indices(frame.shape[1], 1)
        covariance += float(matrix[upper].sum())
        pairs += len(upper[0])
    seed_variance = float(table["var_seed"].dropna().mean()) if table["var_seed"].notna().any() else 0.0
    if not pairs or seed_variance <= 0:
        return None
    return min(1.0, max(0.0, covariance / pairs / seed_variance))


# --------------------------------------------------------------------------------------------- the CLI


def configured_design(configfile: Path) -> tuple[Design, list[str]]:
    """The design of a config, and its methods."""
    from pipeline.preflight import benchmark_items  # here: the preflight imports this module for its summary line

    study = Study.from_config(load_config(configfile))
    items = {name: benchmark_items(name, spec) for name, spec in study.benchmarks.items()}
    unknown = [name for name, count in items.items() if not count]
    if unknown:
        raise InputError(f"{configfile}: the item count of benchmark(s) {', '.join(unknown)} is not known")
    samples = int(study.evaluation.spec["n_samples"])
    design = Design("configured", len(study.models), items, dict.fromkeys(items, samples), len(study.seeds))
    return design, list(study.methods)


def compared_pair(methods: list[str]) -> tuple[str, str]:
    """GRAIL vs GRPO when the study has both, else its first two methods (A, B)."""
    if {"grail", "grpo"} <= set(methods):
        return "grail", "grpo"
    if len(methods) < 2:
        raise InputError("the planner compares two trained methods; the config has fewer")
    return methods[0], methods[1]


def _points(effect: float | None) -> str:
    return "never" if effect is None else f"{100 * effect:.1f}"


def table_lines(assessments: list[Assessment], effect: float) -> list[str]:
    width = max(len(a.design.name) for a in assessments) + 2
    lines = [
        f"{'':<{width}}{'':>12}{'':>14}{'false positives':>22}{'power':>22}{'MDE (points)':>22}",
        f"{'design':<{width}}{'GPU-h bound':>12}{'eval samples':>14}" + f"{'paper':>11}{'seed-aware':>11}" * 3,
    ]
    for a in assessments:
        hours = "–" if a.gpu_hours is None else f"{a.gpu_hours:,.0f}"
        lines.append(
            f"{a.design.name:<{width}}{hours:>12}{a.evaluation_samples:>14,}{a.size_paper:>11.2f}"
            f"{a.size_seed_aware:>11.2f}{a.power_paper:>11.2f}{a.power_seed_aware:>11.2f}"
            f"{_points(a.mde_paper):>11}{_points(a.mde_seed_aware):>11}"
        )
    lines.append(
        f"One-sided tests at alpha = {ALPHA}. false positives: the rate at which each test rejects when the "
        f"methods do not differ (nominal {ALPHA}); power: for an effect of {100 * effect:+.1f} points; MDE: the "
        f"smallest effect with {100 * TARGET_POWER:.0f} % power ('never': not even {100 * MAX_EFFECT:.0f} points, "
        "the test cannot reach alpha with this design). paper: the exact Wilcoxon over (model, benchmark) "
        "cells; seed-aware: the permutation test over runs within models. A test whose false-positive rate is "
        "above alpha buys its power with false positives."
    )
    return lines


def summary_line(assessment: Assessment, effect: float, source: str) -> str:
    """The preflight's one line: both analyses' false-positive rate, power and minimum detectable effect for the
    configured design."""

    def needed(mde: float | None) -> str:
        return "no effect (p <= alpha is out of reach)" if mde is None else f"{100 * mde:.1f} points"

    return (
        f"power ({source}): for {100 * effect:+.1f} points, {assessment.power_paper:.2f} with the paper's "
        f"Wilcoxon (false positives {assessment.size_paper:.2f} at alpha {ALPHA}), {assessment.power_seed_aware:.2f} "
        f"with the seed-aware test ({assessment.size_seed_aware:.2f}); {100 * TARGET_POWER:.0f} % power needs "
        f"{needed(assessment.mde_paper)} and {needed(assessment.mde_seed_aware)}; python -m pipeline.power for "
        "alternatives"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipeline.power", description=__doc__.splitlines()[0])
    parser.add_argument("--configfile", type=Path, required=True, help="the study config (configs/paper.yaml)")
    parser.add_argument("--pilot", type=Path, help="a finished study's results directory: measured components")
    parser.add_argument("--effect", type=float, default=PAPER_EFFECT, help="the effect, a fraction (0.036)")
    parser.add_argument("--replications", type=int, default=2000, help="simulated studies per design")
    parser.add_argument("--seed-sd", type=float, help="override: seed sd of a run's accuracy, in points")
    parser.add_argument("--seed-correlation", type=float, help="override: a run's seed correlation across benchmarks")
    parser.add_argument("--seed", type=int, default=0, help="the simulation's seed")
    parser.add_argument("--no-cost", dest="cost", action="store_false", help="skip the plan and the GPU-hours")
    return parser.parse_args(argv)


def variance_model(args: argparse.Namespace) -> VarianceModel:
    """The pilot's or the default components, with the command line's overrides."""
    variance = pilot_variance(args.pilot) if args.pilot else default_variance()
    if args.seed_sd is not None:
        if args.seed_sd < 0:
            raise InputError("--seed-sd: must be >= 0")
        variance = replace(variance, seed_sd=Component(args.seed_sd / 100, "--seed-sd"))
    if args.seed_correlation is not None:
        if not 0 <= args.seed_correlation <= 1:
            raise InputError("--seed-correlation: must be in [0, 1]")
        variance = replace(variance, seed_correlation=Component(args.seed_correlation, "--seed-correlation"))
    return variance


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.replications < 100:
        raise InputError("--replications: at least 100")
    configured, methods = configured_design(args.configfile)
    method_a, method_b = compared_pair(methods)
    variance = variance_model(args)
    jobs = None
    if args.cost:
        from pipeline.preflight import plan  # here: the preflight imports this module for its summary line

        jobs = plan(None, args.configfile, [])
    print(
        f"{args.configfile}: {method_a} vs {method_b}, {configured.models} models x {len(configured.items)} "
        f"benchmarks ({', '.join(f'{name} {count}' for name, count in configured.items.items())} items), "
        f"{configured.seeds} seed(s), {next(iter(configured.samples.values()))} samples per item; "
        f"{args.replications} simulated studies per design"
    )
    print("variance components:")
    print("\n".join(variance.lines()))
    assessments = [
        assess(
            design,
            variance,
            args.effect,
            args.replications,
            args.seed,
            design_gpu_hours(jobs, configured, design) if jobs is not None else None,
        )
        for design in alternatives(configured)
    ]
    print()
    print("\n".join(table_lines(assessments, args.effect)))


if __name__ == "__main__":
    run_cli(main)
