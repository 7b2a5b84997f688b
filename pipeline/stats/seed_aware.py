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

from pipeline.core.io import InputError
from pipeline.stats.variance import run_item_variance

SEED_BOOTSTRAP_TEST = "seed_bootstrap"
SEED_PERMUTATION_TEST = "seed_permutation"
ALL_MODELS = "all"  # the model and benchmark names of a study-wide row: the average over (model, benchmark) cells
ALL_BENCHMARKS = "average"
# Per-cell permutation tests need 3 runs of each method: with 2 + 2 runs the smallest two-sided p is 1/3.
MIN_CELL_PERMUTATION_SEEDS = 3
EXACT_ARRANGEMENTS = 50_000
# Bound the (resamples x items) item weights, over all cells, of one vectorised bootstrap batch.
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


def _dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b without BLAS: these products are small, and a multi-threaded BLAS on a busy machine with few cores
    spends up to a hundred times longer synchronising its threads than computing them."""
    return np.einsum("ik,k->i", a, b) if b.ndim == 1 else np.einsum("ik,kj->ij", a, b)


def _item_weights(index: np.ndarray, items: int) -> np.ndarray:
    """(batch, items) weights of each item in each resample: how often it was drawn, over ``items``."""
    batch = index.shape[0]
    flat = (index + items * np.arange(batch)[:, None]).ravel()
    return np.bincount(flat, minlength=batch * items).reshape(batch, items) / items


def inflated(scores: np.ndarray) -> np.ndarray:
    """mean + sqrt(S / (S - 1)) (scores - mean): runs whose resampled mean has the unbiased variance s^2 / S (the
    plain bootstrap's is (S - 1) / S of it, half of it with 2 runs); unchanged with one run."""
    if len(scores) < 2:
        return scores
    return scores.mean() + math.sqrt(len(scores) / (len(scores) - 1)) * (scores - scores.mean())


def item_term(cell: Cell) -> tuple[np.ndarray, float]:
    """(lambda (delta_i - mean delta), lambda): the per-item differences of the run means, shrunk to the part that
    does not come from the runs' own item noise (module docstring)."""
    delta = cell.a.accuracy.mean(axis=0) - cell.b.accuracy.mean(axis=0)
    spread = float(delta.var(ddof=1)) if len(delta) > 1 else 0.0
    noise = sum(run_item_variance(runs.accuracy) / len(runs.seeds) for runs in (cell.a, cell.b) if len(runs.seeds) > 1)
    shrink = math.sqrt(max(0.0, 1.0 - noise / spread)) if spread > 0 else 0.0
    return shrink * (delta - delta.mean()), shrink


def hierarchical_bootstrap(
    cells: Sequence[Cell], resamples: int, confidence: float, seed: int | list[int]
) -> BootstrapResult:
    """The stratified bootstrap of the module docstring over runs and items, for every cell and the study."""
    strata = sorted({(cell.model, side): len(getattr(cell, side).seeds) for cell in cells for side in "ab"}.items())
    seed_keys = [key for key, count in strata if count > 1]
    item_counts = dict(sorted({cell.benchmark: len(cell.a.items) for cell in cells}.items()))
    item_keys = [benchmark for benchmark, count in item_counts.items() if count > 1]
    data = [np.arange(count) for _, count in strata if count > 1]
    data += [np.arange(item_counts[benchmark]) for benchmark in item_keys]
    if not data:
        raise InputError("no run or item to resample")
    residuals = [item_term(cell)[0] for cell in cells]
    run_scores = [(inflated(cell.a.scores), inflated(cell.b.scores)) for cell in cells]
    largest = max(item_counts.values())

    def statistic(*indices: np.ndarray, axis: int = -1) -> np.ndarray:
        shape = indices[0].shape[:-1]
        flat = [index.reshape(-1, index.shape[-1]) for index in indices]
        batch = flat[0].shape[0]
        seeds = dict(zip(seed_keys, flat[: len(seed_keys)], strict=True))
        weights = {
            key: _item_weights(index, item_counts[key])
            for key, index in zip(item_keys, flat[len(seed_keys) :], strict=True)
        }
        differences, improvements = [], []
        for cell, residual, pair in zip(cells, residuals, run_scores, strict=True):
            shift = _dot(weights[cell.benchmark], residual) if cell.benchmark in weights else np.zeros(batch)
            scores = []
            for side, values in zip("ab", pair, strict=True):
                runs = np.broadcast_to(values, (batch, len(values)))
                index = seeds.get((cell.model, side))
                scores.append(runs if index is None else np.take_along_axis(runs, index, axis=1))
            a, b = scores[0] + shift[:, None], scores[1]
            differences.append(a.mean(axis=1) - b.mean(axis=1))
            improvements.append(probability_of_improvement(a, b))
        differences, improvements = np.stack(differences), np.stack(improvements)
        out = np.concatenate(
            [differences, differences.mean(0, keepdims=True), improvements, improvements.mean(0, keepdims=True)]
        )
        return out.reshape(out.shape[0], *shape)

    observed = statistic(*data)
    point = _point_estimates(cells)  # P(A > B) of the runs' own scores (the inflated ones may order differently)
    result = stats.bootstrap(
        data,
        statistic,
        n_resamples=resamples,
        batch=max(1, BOOTSTRAP_BATCH_CELLS // (largest * len(cells))),
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
    return BootstrapResult(
        difference=observed[:half],
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
    rows = [_labelling(runs_a, runs_b, chosen) for chosen in itertools.combinations(range(runs_a + runs_b), runs_a)]
    return np.array(rows)


def _labelling(runs_a: int, runs_b: int, chosen: Iterable[int]) -> np.ndarray:
    row = np.full(runs_a + runs_b, -1.0 / runs_b)
    row[list(chosen)] = 1.0 / runs_a
    return row


def random_split_weights(runs_a: int, runs_b: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """``draws`` labellings drawn uniformly (each a random set of runs_a runs labelled A), as ``split_weights``."""
    chosen = rng.random((draws, runs_a + runs_b)).argsort(axis=1)[:, :runs_a]
    weights = np.full((draws, runs_a + runs_b), -1.0 / runs_b)
    np.put_along_axis(weights, chosen, 1.0 / runs_a, axis=1)
    return weights


def arrangements(runs: Iterable[tuple[int, int]]) -> int:
    """How many labellings a stratified permutation test has: prod over models of C(S_A + S_B, S_A)."""
    return math.prod(math.comb(a + b, a) for a, b in runs)


def stratified_permutation_pvalues(
    strata: Sequence[tuple[np.ndarray, int]], alternative: str, draws: int, rng: np.random.Generator
) -> tuple[np.ndarray, bool]:
    """p-values of T = sum_k (mean of stratum k's A runs - mean of its B runs) against T's distribution over the
    labellings of the runs within each stratum; a stratum is (scores, runs_a): scores (replications, runs), the
    runs_a runs of A first.

    Exact over every labelling when there are at most EXACT_ARRANGEMENTS (then exact=True), else over ``draws``
    labellings drawn uniformly: p = (1 + #{T* as or more extreme}) / (draws + 1). greater: P(T* >= T); less:
    P(T* <= T); two-sided: min(1, 2 min(greater, less)).
    """
    weights = [(_labelling(a, s.shape[1] - a, range(a)), a, s.shape[1] - a) for s, a in strata]
    observed = sum(_dot(s, w) for (s, _), (w, _, _) in zip(strata, weights, strict=True))
    tolerance = 1e-12 * max(1.0, float(np.abs(observed).max()))
    exact = arrangements((a, b) for _, a, b in weights) <= EXACT_ARRANGEMENTS
    if exact:
        null = np.zeros((len(observed), 1))
        for (scores, _), (_, a, b) in zip(strata, weights, strict=True):
            null = (null[:, :, None] + _dot(scores, split_weights(a, b).T)[:, None, :]).reshape(len(null), -1)
        count, offset = null.shape[1], 0
    else:
        null = sum(
            _dot(scores, random_split_weights(a, b, draws, rng).T)
            for (scores, _), (_, a, b) in zip(strata, weights, strict=True)
        )
        count, offset = draws, 1
    greater = ((null >= observed[:, None] - tolerance).sum(axis=1) + offset) / (count + offset)
    less = ((null <= observed[:, None] + tolerance).sum(axis=1) + offset) / (count + offset)
    if alternative == "greater":
        return greater, exact
    if alternative == "less":
        return less, exact
    return np.minimum(1.0, 2 * np.minimum(greater, less)), exact


def study_permutation_strata(cells: Sequence[Cell]) -> list[tuple[np.ndarray, int]]:
    """Per model, its runs' scores summed over its benchmarks and divided by the number of cells (A's runs first),
    shape (1, runs): the strata whose T is the average of d over all cells."""
    strata = []
    for model in dict.fromkeys(cell.model for cell in cells):
        mine = [cell for cell in cells if cell.model == model]
        summed = sum(np.concatenate([cell.a.scores, cell.b.scores]) for cell in mine)
        strata.append((summed[None, :] / len(cells), len(mine[0].a.seeds)))
    return strata


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
            strata = study_permutation_strata(cells)
            p_values, exact = stratified_permutation_pvalues(strata, "two-sided", resamples, rng)
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
