"""Comparisons between trained methods that treat training as random: runs (training seeds) are resampled or
permuted, not only items.

A run is one (model, method, seed): it is evaluated on every benchmark, so its per-item accuracies on benchmark b
form one row of that cell's (seeds x items) matrix. For methods A and B, a cell (model, benchmark) has the
difference d = mean_s mean_i acc_A[s, i] - mean_s mean_i acc_B[s, i], and the study the average of d over its
cells (the paper's "average accuracy" gain).

Stratified bootstrap (rliable's definition, Agarwal et al., NeurIPS 2021, "Deep RL at the Edge of the
Statistical Precipice", extended to the items): each resample draws, with replacement, S runs from the S runs of
each (model, method) independently (the strata; one draw serves all of a run's benchmarks) and m items from the
m items of each benchmark (one draw shared by every model and method, so the item pairing is kept). The interval
is the percentile interval of the resampled statistic; p = (1 + #{|d* - d| >= |d|}) / (B + 1) (two-sided,
null-centred, as the item-level bootstrap). It is ``scipy.stats.bootstrap`` with one sample per stratum (scipy
resamples each sample independently); the statistic reads the per-item accuracies through the resampled
indices. A (model, method) with one run has nothing to resample: its cells get no interval.

Probability of improvement (rliable): P(A > B) = (1 / (S_A S_B)) sum_{s, t} [x_s > y_t] + 0.5 [x_s = y_t] over the
runs' scores x (A) and y (B) on a cell (the Mann-Whitney U statistic over S_A S_B); the study's is the mean over
cells; its interval comes from the same resamples.

Permutation tests over runs (exact under H0: the runs of A and B are exchangeable, i.e. the method changes
nothing; conditional on the items): per cell, with 3 or more runs of each method, ``scipy.stats.permutation_test``
over the C(S_A + S_B, S_A) ways to label the runs (two-sided p = twice the smaller tail, capped at 1); for the
study, the runs are permuted within each model (a model's runs stay with their model, and one labelling
serves all of its benchmarks) and the statistic is the average of d over cells. scipy's test does not permute
within strata, hence ``stratified_permutation_pvalues``: exact over every labelling when there are at most
EXACT_ARRANGEMENTS of them, otherwise over ``draws`` random labellings (p = (1 + #) / (draws + 1)). With one run
per method it is the sign-flip test over models: 2^models labellings.
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from pipeline.io import InputError

SEED_BOOTSTRAP_TEST = "seed_bootstrap"
SEED_PERMUTATION_TEST = "seed_permutation"
ALL_MODELS = "all"  # the model and benchmark names of a study-wide row: the average over (model, benchmark) cells
ALL_BENCHMARKS = "average"
# Per-cell permutation tests need 3 runs of each method: with 2 + 2 runs the smallest two-sided p is 1/3.
MIN_CELL_PERMUTATION_SEEDS = 3
EXACT_ARRANGEMENTS = 50_000
# Bound the (runs x resamples x items) gather of one vectorised bootstrap batch.
BOOTSTRAP_BATCH_CELLS = 4_000_000


@dataclass(frozen=True)
class Runs:
    """The runs of one (model, method) on one benchmark: seeds (sorted), item ids (sorted) and per-item accuracy
    (seeds x items; each entry = correct / samples of that item in that run)."""

    seeds: tuple[int, ...]
    items: tuple[str, ...]
    accuracy: np.ndarray
    samples: int

    @property
    def scores(self) -> np.ndarray:
        """Each run's score on the benchmark: mean over items."""
        return self.accuracy.mean(axis=1)


@dataclass(frozen=True)
class Cell:
    """One (model, benchmark) with the runs of the two compared methods on the same items."""

    model: str
    benchmark: str
    a: Runs
    b: Runs

    @property
    def difference(self) -> float:
        return float(self.a.scores.mean() - self.b.scores.mean())


def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) + 0.5 P(X = Y) over every pair of a run of A (x[..., s]) and of B (y[..., t]), per leading index."""
    greater = (x[..., :, None] > y[..., None, :]).mean(axis=(-2, -1))
    equal = (x[..., :, None] == y[..., None, :]).mean(axis=(-2, -1))
    return greater + 0.5 * equal


def compared_cells(runs: dict[tuple[str, str], dict[str, Runs]], method_a: str, method_b: str) -> list[Cell]:
    """The (model, benchmark) cells where both methods have runs, in sorted order; items must match."""
    cells = []
    for (model, benchmark), by_method in sorted(runs.items()):
        if method_a in by_method and method_b in by_method:
            a, b = by_method[method_a], by_method[method_b]
            if a.items != b.items:
                raise InputError(f"{model}/{benchmark}: {method_a} and {method_b} were scored on different items")
            cells.append(Cell(model, benchmark, a, b))
    models = {cell.model for cell in cells}
    for model, method in itertools.product(sorted(models), (method_a, method_b)):
        seeds = {getattr(cell, "a" if method == method_a else "b").seeds for cell in cells if cell.model == model}
        if len(seeds) > 1:
            raise InputError(f"{model}/{method}: the benchmarks were evaluated with different seeds {sorted(seeds)}")
    return cells


@dataclass(frozen=True)
class BootstrapResult:
    """Per cell (in order) and for the study (last): difference, interval, p, P(A > B) and its interval."""

    difference: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    p_value: np.ndarray
    improvement: np.ndarray
    improvement_low: np.ndarray
    improvement_high: np.ndarray


def _item_weights(index: np.ndarray, items: int) -> np.ndarray:
    """(batch, items) weights of each item in each resample: how often it was drawn, over ``items``."""
    batch = index.shape[0]
    flat = (index + items * np.arange(batch)[:, None]).ravel()
    return np.bincount(flat, minlength=batch * items).reshape(batch, items) / items


def _run_scores(cells: Sequence[Cell], seeds: dict, items: dict, batch: int) -> tuple[list, list]:
    """Per cell, the resampled run scores of A and B, each (batch, runs): runs drawn by ``seeds[(model, side)]``,
    items by ``items[benchmark]`` (identity where absent)."""
    weights = {benchmark: _item_weights(index, index.shape[1]) for benchmark, index in items.items()}
    scores_a, scores_b = [], []
    for cell in cells:
        for side, runs, out in (("a", cell.a, scores_a), ("b", cell.b, scores_b)):
            if cell.benchmark in weights:
                per_run = weights[cell.benchmark] @ runs.accuracy.T  # (batch, runs)
            else:
                per_run = np.repeat(runs.scores[None, :], batch, axis=0)
            seed_index = seeds.get((cell.model, side))
            out.append(per_run if seed_index is None else np.take_along_axis(per_run, seed_index, axis=1))
    return scores_a, scores_b


def hierarchical_bootstrap(
    cells: Sequence[Cell], resamples: int, confidence: float, seed: int | list[int]
) -> BootstrapResult:
    """The stratified bootstrap of the module docstring over runs and items, for every cell and the study."""
    strata_seeds = sorted(
        {(cell.model, side): len(getattr(cell, side).seeds) for cell in cells for side in "ab"}.items()
    )
    seed_keys = [key for key, count in strata_seeds if count > 1]
    item_counts = dict(sorted({cell.benchmark: len(cell.a.items) for cell in cells}.items()))
    item_keys = [benchmark for benchmark, count in item_counts.items() if count > 1]
    data = [np.arange(count) for key, count in strata_seeds if count > 1]
    data += [np.arange(item_counts[benchmark]) for benchmark in item_keys]
    largest = max(len(getattr(cell, side).seeds) * len(cell.a.items) for cell in cells for side in "ab")

    def statistic(*indices: np.ndarray, axis: int = -1) -> np.ndarray:
        shape = indices[0].shape[:-1]
        flat = [index.reshape(-1, index.shape[-1]) for index in indices]
        batch = flat[0].shape[0]
        seeds = dict(zip(seed_keys, flat[: len(seed_keys)], strict=True))
        items = dict(zip(item_keys, flat[len(seed_keys) :], strict=True))
        scores_a, scores_b = _run_scores(cells, seeds, items, batch)
        differences = np.stack([a.mean(axis=1) - b.mean(axis=1) for a, b in zip(scores_a, scores_b, strict=True)])
        improvement = np.stack([probability_of_improvement(a, b) for a, b in zip(scores_a, scores_b, strict=True)])
        out = np.concatenate(
            [differences, differences.mean(axis=0, keepdims=True), improvement, improvement.mean(0, keepdims=True)]
        )
        return out.reshape(out.shape[0], *shape)

    if not data:
        raise InputError("no run or item to resample")
    observed = statistic(*data)
    result = stats.bootstrap(
        data,
        statistic,
        n_resamples=resamples,
        batch=max(1, BOOTSTRAP_BATCH_CELLS // largest),
        vectorized=True,
        paired=False,
        confidence_level=confidence,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    half = len(cells) + 1
    distribution = result.bootstrap_distribution
    centred = np.abs(distribution[:half] - observed[:half, None])
    extreme = (centred >= np.abs(observed[:half, None]) - 1e-12).sum(axis=1)
    low, high = result.confidence_interval
    point = _point_estimates(cells)  # the same values, without the float round-off of the weighted sums
    return BootstrapResult(
        difference=point.difference,
        ci_low=low[:half],
        ci_high=high[:half],
        p_value=(1 + extreme) / (resamples + 1),
        improvement=point.improvement,
        improvement_low=low[half:],
        improvement_high=high[half:],
    )


def cell_permutation_pvalue(x: np.ndarray, y: np.ndarray) -> float:
    """Exact two-sided permutation p of mean(x) - mean(y) over every labelling of the runs (scipy)."""

    def difference(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        return a.mean(axis=axis) - b.mean(axis=axis)

    result = stats.permutation_test(
        (x, y), difference, permutation_type="independent", vectorized=True, n_resamples=np.inf
    )
    return float(result.pvalue)


def split_weights(runs_a: int, runs_b: int) -> np.ndarray:
    """Every labelling of runs_a + runs_b runs as A or B (rows; the observed one, A first, is row 0): weight
    1/runs_a for a run labelled A and -1/runs_b for one labelled B, so weights @ scores = mean_A - mean_B."""
    total = runs_a + runs_b
    rows = []
    for chosen in itertools.combinations(range(total), runs_a):
        row = np.full(total, -1.0 / runs_b)
        row[list(chosen)] = 1.0 / runs_a
        rows.append(row)
    return np.array(rows)


def arrangements(runs: Iterable[tuple[int, int]]) -> int:
    """How many labellings a stratified permutation test has: prod over models of C(S_A + S_B, S_A)."""
    return math.prod(math.comb(a + b, a) for a, b in runs)


def stratified_permutation_pvalues(
    contributions: Sequence[np.ndarray], alternative: str, draws: int, rng: np.random.Generator
) -> tuple[np.ndarray, bool]:
    """p-values of T = sum_k contributions[k][..., 0] against its distribution when each stratum k independently
    takes any of its labellings (the columns of contributions[k], shape (replications, labellings_k)).

    Exact when prod_k labellings_k <= EXACT_ARRANGEMENTS (then returns exact=True), else ``draws`` random
    labellings: p = (1 + #{T* as or more extreme}) / (draws + 1). greater: P(T* >= T); less: P(T* <= T);
    two-sided: min(1, 2 min(greater, less)).
    """
    observed = sum(c[:, 0] for c in contributions)
    tolerance = 1e-12 * max(1.0, float(np.abs(observed).max()))
    total = math.prod(c.shape[1] for c in contributions)
    exact = total <= EXACT_ARRANGEMENTS
    greater = np.empty(len(observed))
    less = np.empty(len(observed))
    chunk = max(1, 4_000_000 // (total if exact else draws))
    for start in range(0, len(observed), chunk):
        rows = slice(start, start + chunk)
        if exact:
            null = np.zeros((len(observed[rows]), 1))
            for c in contributions:
                null = (null[:, :, None] + c[rows][:, None, :]).reshape(len(null), -1)
            count = null.shape[1]
            offset = 0
        else:
            null = sum(
                np.take_along_axis(c[rows], rng.integers(0, c.shape[1], size=(len(c[rows]), draws)), axis=1)
                for c in contributions
            )
            count, offset = draws, 1
        greater[rows] = ((null >= observed[rows, None] - tolerance).sum(axis=1) + offset) / (count + offset)
        less[rows] = ((null <= observed[rows, None] + tolerance).sum(axis=1) + offset) / (count + offset)
    if alternative == "greater":
        return greater, exact
    if alternative == "less":
        return less, exact
    return np.minimum(1.0, 2 * np.minimum(greater, less)), exact


def study_permutation_contributions(cells: Sequence[Cell]) -> list[np.ndarray]:
    """Per model, each labelling's contribution to the average of d over all cells, shape (1, labellings)."""
    contributions = []
    for model in dict.fromkeys(cell.model for cell in cells):
        mine = [cell for cell in cells if cell.model == model]
        runs_a, runs_b = len(mine[0].a.seeds), len(mine[0].b.seeds)
        # each run's scores summed over this model's benchmarks, A's runs first
        summed = sum(np.concatenate([cell.a.scores, cell.b.scores]) for cell in mine)
        contributions.append((split_weights(runs_a, runs_b) @ summed)[None, :] / len(cells))
    return contributions


def comparison_seed(seed: int, *names: str) -> list[int]:
    """A generator seed per comparison, so a row's result does not depend on which other rows exist."""
    return [seed, zlib.crc32("/".join(names).encode())]


def _resampled(cell: Cell) -> bool:
    """Whether the cell's runs can be resampled: both methods have at least two runs."""
    return len(cell.a.seeds) > 1 and len(cell.b.seeds) > 1


def _bootstrap_row(common: dict, boot: BootstrapResult, index: int, resampled: bool, settings: dict) -> dict:
    def value(array: np.ndarray) -> float | None:
        return float(array[index]) if resampled else None

    return {
        **common,
        "test": SEED_BOOTSTRAP_TEST,
        "runs_resampled": resampled,
        "p_value": value(boot.p_value),
        "ci_low": value(boot.ci_low),
        "ci_high": value(boot.ci_high),
        "prob_improvement": float(boot.improvement[index]),
        "prob_improvement_low": value(boot.improvement_low),
        "prob_improvement_high": value(boot.improvement_high),
        **settings,
    }


def _point_estimates(cells: Sequence[Cell]) -> BootstrapResult:
    """Differences and P(A > B) without intervals (no run can be resampled)."""
    differences = [cell.difference for cell in cells]
    improvements = [float(probability_of_improvement(cell.a.scores, cell.b.scores)) for cell in cells]
    missing = np.full(len(cells) + 1, np.nan)
    return BootstrapResult(
        np.array([*differences, np.mean(differences)]),
        missing,
        missing,
        missing,
        np.array([*improvements, np.mean(improvements)]),
        missing,
        missing,
    )


def seed_aware_rows(
    runs: dict[tuple[str, str], dict[str, Runs]],
    pairs: Iterable[tuple[str, str]],
    resamples: int,
    confidence: float,
    seed: int,
) -> list[dict]:
    """``seed_bootstrap`` rows per cell and for the study (model ``all``, benchmark ``average``) for every pair
    of trained methods; ``seed_permutation`` rows per cell with 3 or more runs of each method, and for the study
    (``resamples`` random labellings when it has more than EXACT_ARRANGEMENTS).

    A row whose runs cannot be resampled (a method with one run in a cell, or, for the study row, in any cell)
    keeps its difference and P(A > B) but has no interval or p (``runs_resampled`` false).
    """
    rows: list[dict] = []
    settings = {"confidence": confidence, "resamples": resamples, "seed": seed}
    for method_a, method_b in pairs:
        cells = compared_cells(runs, method_a, method_b)
        if not cells:
            continue
        resampled = [_resampled(cell) for cell in cells]
        if any(resampled):
            generator_seed = comparison_seed(seed, SEED_BOOTSTRAP_TEST, method_a, method_b)
            boot = hierarchical_bootstrap(cells, resamples, confidence, generator_seed)
        else:
            boot = _point_estimates(cells)
        pair = {"method_a": method_a, "method_b": method_b, "alternative": "two-sided"}
        for index, (cell, ok) in enumerate(zip(cells, resampled, strict=True)):
            runs_a, runs_b = len(cell.a.seeds), len(cell.b.seeds)
            common = {
                **pair,
                "metric": f"acc@{min(cell.a.samples, cell.b.samples)}",
                "model": cell.model,
                "benchmark": cell.benchmark,
                "n": len(cell.a.items),
                "seeds_a": runs_a,
                "seeds_b": runs_b,
                "statistic": float(boot.difference[index]),
            }
            rows.append(_bootstrap_row(common, boot, index, ok, settings))
            if min(runs_a, runs_b) >= MIN_CELL_PERMUTATION_SEEDS:
                count = arrangements([(runs_a, runs_b)])
                rows.append(
                    {
                        **common,
                        "test": SEED_PERMUTATION_TEST,
                        "p_value": cell_permutation_pvalue(cell.a.scores, cell.b.scores),
                        "arrangements": count,
                        "exact": True,
                        "min_p": min(1.0, 2 / count),
                    }
                )
        study = {
            **pair,
            "metric": f"acc@{min(min(cell.a.samples, cell.b.samples) for cell in cells)}",
            "model": ALL_MODELS,
            "benchmark": ALL_BENCHMARKS,
            "n": len(cells),
            "seeds_a": min(len(cell.a.seeds) for cell in cells),
            "seeds_b": min(len(cell.b.seeds) for cell in cells),
            "statistic": float(boot.difference[len(cells)]),
        }
        rows.append(_bootstrap_row(study, boot, len(cells), all(resampled), settings))
        first_cells = {cell.model: cell for cell in reversed(cells)}.values()
        count = arrangements((len(cell.a.seeds), len(cell.b.seeds)) for cell in first_cells)
        if count > 1:
            rng = np.random.default_rng(comparison_seed(seed, SEED_PERMUTATION_TEST, method_a, method_b))
            contributions = study_permutation_contributions(cells)
            p_values, exact = stratified_permutation_pvalues(contributions, "two-sided", resamples, rng)
            rows.append(
                {
                    **study,
                    "test": SEED_PERMUTATION_TEST,
                    "p_value": float(p_values[0]),
                    "arrangements": count,
                    "exact": exact,
                    "min_p": min(1.0, 2 / count) if exact else 2 / (resamples + 1),
                }
            )
    return rows
