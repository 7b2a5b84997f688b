"""The planner: can a study's design detect the effect it asks about, and what would it take?

    python -m pipeline.power --configfile CONFIG [--pilot RESULTS_DIR] [--methods A B] [--effect 0.036]
                             [--replications 2000] [--seed-sd POINTS] [--seed-correlation RHO] [--seed 0] [--no-cost]

It simulates the study's own analysis of method A (GRAIL) against method B (GRPO; ``--methods A B``) under the
config's design (models, benchmarks with their item counts, training seeds, samples per item), for the configured
design and a few alternatives (more seeds; more samples per item on the small benchmarks), and prints per design
the power for the effect (one-sided, alpha = 0.05, as the paper's test), the minimum detectable effect at 80 %
power and the GPU-hour bound of the cost estimate (``pipeline.study.cost``, from the study's ``snakemake -n`` plan).

Simulated run scores (the accuracy of run s of method A or B of model k on benchmark b, m_b items, n_b samples):

    X_kbAs = effect + sigma_seed (sqrt(rho) u_kAs + sqrt(1 - rho) v_kbAs) + sqrt((var_seed_item + var_sampling / n_b)
             / m_b) w_kbAs,
    X_kbBs = the same without the effect, u, v, w independent standard normals.

A run's seed effect (``seed_sd`` = sigma_seed) is shared by its benchmarks with correlation rho (a good run is
good everywhere); the seed x item and sampling components (``pipeline.stats.variance``) average over the run's items and
samples. Item difficulty and the model's level cancel in every difference between A and B on the same items, so
they are not simulated. The analyses, on each simulated study:

- the paper's: d_kb = mean_s X_kbAs - mean_s X_kbBs over the (model, benchmark) cells, the exact one-sided
  Wilcoxon signed-rank test over the cells (``scipy.stats.wilcoxon(d, alternative="greater", method="exact")``);
- the seed-aware one: the permutation test over runs within models of the average of d over cells
  (``pipeline.stats.seed_aware.stratified_permutation_pvalues``, one-sided): with one seed it flips the sign of each
  model's difference, 2^models labellings.

Power = the fraction of simulated studies with p <= alpha; the minimum detectable effect is found by bisection on
the effect with the same simulated noise (power grows with the effect in every simulated study).

Variance components come from ``--pilot RESULTS_DIR`` (``pipeline.study.pilot_variance``, which gives their
formulas) or from DEFAULTS, each with its source; ``--seed-sd`` and ``--seed-correlation`` override either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy import stats

from pipeline.core.io import InputError
from pipeline.core.layout import BASELINE_METHOD
from pipeline.stats.seed_aware import stratified_permutation_pvalues
from pipeline.study import cost
from pipeline.study.config import Study
from pipeline.study.load import load_study

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
    """One variance component's value and where it came from; ``fallback``: the default, for want of a pilot's
    estimate."""

    value: float
    source: str
    fallback: bool = False


# Documented defaults (docs/output.md, "The planner"): what is known without a pilot study.
DEFAULTS = {
    "seed_sd": Component(
        0.02,
        "2 points: an assumption of the order this project has measured for the compared methods on its default "
        "study (acc@4 on arith_add, 400 items x 4 samples, sd over 2 seeds, item noise included): GRPO 2.6 and GRAIL "
        "0.1 points in the recorded run docs/numbers/default.json (pinned kernels), GRPO 1.2 and GRAIL 2.3 before "
        "the kernel pin (docs/lab-notes.md, 30 November); from 1 degree of freedom each, neither sets it; no "
        "published measurement for the paper's models",
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
COMPONENT_NAMES = {
    "seed_sd": "seed sd",
    "seed_correlation": "seed correlation across benchmarks",
    "seed_item": "seed x item variance",
    "sampling": "sampling variance",
}


@dataclass(frozen=True)
class VarianceModel:
    """The components the simulation needs (fractions, not points)."""

    seed_sd: Component
    seed_correlation: Component
    seed_item: Component
    sampling: Component

    def lines(self) -> list[str]:
        """One line per component: its value, [fallback] when it is its default for want of a pilot's estimate,
        and its source."""
        return [
            f"  {COMPONENT_NAMES[name]} {component_text(name, getattr(self, name).value)}"
            f"{' [fallback]' if getattr(self, name).fallback else ''} ({getattr(self, name).source})"
            for name in COMPONENT_NAMES
        ]

    def fallbacks(self) -> list[str]:
        """The names of the components that fell back to their defaults."""
        return [COMPONENT_NAMES[name] for name in COMPONENT_NAMES if getattr(self, name).fallback]


def component_text(name: str, value: float) -> str:
    """A component's value as the summary prints it: the seed sd in points, rho and the variances as fractions."""
    if name == "seed_sd":
        return f"{100 * value:.2f} points"
    return f"{value:.2f}" if name == "seed_correlation" else f"{value:.4f}"


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


def design_gpu_hours(jobs: list[cost.PlannedJob], configured: Design, design: Design, study: Study) -> float:
    """The GPU-hour bound of ``design`` from the configured study's plan (``cost.scaled_gpu_hours``). An evaluate job
    that asks for its engine layout's GPUs asks for the layout of the design's generations (sized to the work, it
    grows with them); one whose GPUs are set keeps them."""
    generations = {name: design.items[name] * design.samples[name] for name in design.items}

    def evaluation_gpus(job: cost.PlannedJob) -> int:
        planned = study.evaluation_layout(job.wildcards).gpus
        return study.evaluation_layout(job.wildcards, generations).gpus if job.gpus == planned else job.gpus

    return cost.scaled_gpu_hours(
        jobs,
        seeds_factor=design.seeds / configured.seeds,
        generations=generations,
        configured_generations={name: configured.items[name] * configured.samples[name] for name in configured.items},
        baseline=BASELINE_METHOD,
        evaluation_gpus=evaluation_gpus,
    )


def configured_design(configfile: Path) -> tuple[Design, list[str]]:
    """The design of a config, and its methods."""

    study = load_study([configfile])
    items = study.benchmark_sizes
    unknown = [name for name, count in items.items() if not count]
    if unknown:
        raise InputError(f"{configfile}: the item count of benchmark(s) {', '.join(unknown)} is not known")
    samples = int(study.evaluation.spec["n_samples"])
    design = Design("configured", len(study.models), items, dict.fromkeys(items, samples), len(study.seeds))
    return design, list(study.methods)


def compared_pair(methods: list[str], requested: list[str] | None = None) -> tuple[str, str]:
    """The methods compared, A against B: ``requested`` (``--methods``), else GRAIL vs GRPO when the study has
    both, else its first two."""
    if requested:
        unknown = [name for name in requested if name not in methods]
        if unknown or requested[0] == requested[1]:
            raise InputError(f"--methods: two different methods of the config ({', '.join(methods)})")
        return requested[0], requested[1]
    if {"grail", "grpo"} <= set(methods):
        return "grail", "grpo"
    if len(methods) < 2:
        raise InputError("the planner compares two trained methods; the config has fewer")
    return methods[0], methods[1]


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
