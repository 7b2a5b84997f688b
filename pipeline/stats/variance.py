"""Where the variance of a benchmark score comes from: training seeds, items, their interaction, sampling.

Per (model, method, checkpoint, benchmark), the correctness y_sij of sample j of item i by the run of training seed
s follows the two-way crossed random-effects model with replication (S seeds x m items, n samples per item):

    y_sij = mu + a_s + b_i + (ab)_si + e_sij,
    var(a) = var_seed, var(b) = var_item, var(ab) = var_seed_item, var(e) = var_sampling.

``var_seed`` is how much a run's accuracy moves with its training seed, ``var_item`` how much items differ in
difficulty, ``var_seed_item`` how much the runs differ in *which* items they solve, ``var_sampling`` the noise of
drawing an item's samples (within an item and a run). The estimates are the ANOVA (expected mean squares)
estimators of the balanced design (Searle, Casella and McCulloch, *Variance Components*, 1992, ch. 4). With the
cell means p_si (item i's accuracy in seed s), their margins p_s., p_.i and the grand mean p..:

    MS_seed   = m n sum_s (p_s. - p..)^2 / (S - 1)
    MS_item   = S n sum_i (p_.i - p..)^2 / (m - 1)
    MS_inter  = n sum_si (p_si - p_s. - p_.i + p..)^2 / ((S - 1)(m - 1))
    MS_within = sum_sij (y_sij - p_si)^2 / (S m (n - 1))
    var_sampling = MS_within,  var_seed_item = (MS_inter - MS_within) / n,
    var_item = (MS_item - MS_inter) / (S n),  var_seed = (MS_seed - MS_inter) / (m n).

A negative estimate (a component near zero, under sampling noise) is reported as 0. With one seed, ``var_seed``
and ``var_seed_item`` cannot be estimated (NaN) and var_item = (MS_item - MS_within) / n holds the seed x item
interaction too; with one sample per item, ``var_sampling`` cannot be estimated and the next component up holds
it; with one item, only ``var_sampling`` can.
Items with unequal sample counts: MS_within pools sum_j (y - p_si)^2 over sum (n_si - 1), and n is the harmonic
mean of the n_si (the "unweighted means" analysis).

The variance of a method's mean score (over its S seeds, m items and n samples each) is
var_seed / S + var_item / m + var_seed_item / (S m) + var_sampling / (S m n); the ``share_*`` columns give each
term's part of it (NaN unless every component was estimated): the one with the largest share is what more seeds,
more items or more samples per item would shrink.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipeline.core.io import InputError

COMPONENTS = ("seed", "item", "seed_item", "sampling")
VARIANCE_COLUMNS = [
    "model",
    "method",
    "checkpoint",
    "benchmark",
    "metric",
    "seeds",
    "items",
    "samples",
    "accuracy",
    *(f"var_{name}" for name in COMPONENTS),
    *(f"share_{name}" for name in COMPONENTS),
]


@dataclass(frozen=True)
class ItemCounts:
    """One evaluation file reduced to what the statistics need: per item (sorted ids), samples n and correct c."""

    ids: tuple[str, ...]
    samples: np.ndarray
    correct: np.ndarray

    @classmethod
    def from_items(cls, items: Mapping[str, list[dict]]) -> ItemCounts:
        """From ``pipeline.stats.metrics.group_by_item``'s {id: rows}."""
        ids = tuple(sorted(items))
        return cls(
            ids,
            np.array([len(items[i]) for i in ids], dtype=np.int64),
            np.array([sum(bool(row["correct"]) for row in items[i]) for i in ids], dtype=np.int64),
        )

    @property
    def accuracy(self) -> np.ndarray:
        """c_i / n_i per item."""
        return self.correct / self.samples


@dataclass(frozen=True)
class Components:
    """The four variance components (NaN: not estimable from this design) and the design they came from."""

    seed: float
    item: float
    seed_item: float
    sampling: float
    seeds: int
    items: int
    samples: float

    def shares(self) -> dict[str, float]:
        """Each component's part of the variance of the mean score over the seeds, items and samples."""
        terms = {
            "seed": self.seed / self.seeds,
            "item": self.item / self.items,
            "seed_item": self.seed_item / (self.seeds * self.items),
            "sampling": self.sampling / (self.seeds * self.items * self.samples),
        }
        total = sum(terms.values())
        if not math.isfinite(total) or total <= 0:
            return dict.fromkeys(COMPONENTS, math.nan)
        return {name: value / total for name, value in terms.items()}


def components(correct: np.ndarray, samples: np.ndarray) -> Components:
    """The ANOVA estimates (module docstring) from per-(seed, item) correct counts and sample counts (S x m)."""
    correct, samples = np.asarray(correct, dtype=float), np.asarray(samples, dtype=float)
    seeds, items = correct.shape
    cells = correct / samples
    n = float(samples.size / (1.0 / samples).sum())
    seed_means, item_means, grand = cells.mean(axis=1), cells.mean(axis=0), cells.mean()
    # sum_j (y - p)^2 of a binary cell with c of n correct is c (1 - c/n).
    within_df = float((samples - 1).sum())
    within = float((correct * (1 - cells)).sum() / within_df) if within_df > 0 else math.nan
    if items == 1:
        return Components(math.nan, math.nan, math.nan, within, seeds, items, n)
    ms_item = seeds * n * float(((item_means - grand) ** 2).sum()) / (items - 1)

    def positive(value: float) -> float:
        return max(0.0, value) if math.isfinite(value) else math.nan

    floor = 0.0 if math.isnan(within) else within
    if seeds == 1:
        return Components(math.nan, positive((ms_item - floor) / n), math.nan, within, seeds, items, n)
    ms_seed = items * n * float(((seed_means - grand) ** 2).sum()) / (seeds - 1)
    ms_inter = n * run_item_variance(cells)
    return Components(
        seed=positive((ms_seed - ms_inter) / (items * n)),
        item=positive((ms_item - ms_inter) / (seeds * n)),
        seed_item=positive((ms_inter - floor) / n),
        sampling=within,
        seeds=seeds,
        items=items,
        samples=n,
    )


def run_item_variance(cells: np.ndarray) -> float:
    """MS_inter / n of the (seeds x items) per-item accuracies: sum_si (p_si - p_s. - p_.i + p..)^2 / ((S - 1)
    (m - 1)), an unbiased estimate of var_seed_item + var_sampling / n, the noise of one run's accuracy on one
    item around the item's and the run's levels."""
    seeds, items = cells.shape
    residual = cells - cells.mean(axis=1, keepdims=True) - cells.mean(axis=0, keepdims=True) + cells.mean()
    return float((residual**2).sum()) / ((seeds - 1) * (items - 1))


def stack_seeds(by_seed: Mapping[int, ItemCounts], source: str) -> tuple[np.ndarray, np.ndarray]:
    """(correct, samples) as (S x m) arrays over the seeds in sorted order; the seeds must share their item ids."""
    seeds = sorted(by_seed)
    ids = by_seed[seeds[0]].ids
    if any(by_seed[seed].ids != ids for seed in seeds):
        raise InputError(f"{source}: the seeds' samples files hold different item ids")
    return (
        np.stack([by_seed[seed].correct for seed in seeds]),
        np.stack([by_seed[seed].samples for seed in seeds]),
    )


def variance_table(counts: Iterable[tuple[tuple[str, str, int, str, str], ItemCounts]]) -> pd.DataFrame:
    """One row (VARIANCE_COLUMNS) per (model, method, checkpoint, benchmark) from each samples file's counts,
    keyed (model, method, seed, checkpoint, benchmark). ``metric`` is acc@n with n the fewest samples of an item."""
    grouped: dict[tuple[str, str, str, str], dict[int, ItemCounts]] = defaultdict(dict)
    for (model, method, seed, checkpoint, benchmark), item_counts in counts:
        grouped[model, method, checkpoint, benchmark][seed] = item_counts
    rows = []
    for (model, method, checkpoint, benchmark), by_seed in sorted(grouped.items()):
        correct, samples = stack_seeds(by_seed, f"{model}/{method}/{checkpoint}/{benchmark}")
        estimate = components(correct, samples)
        rows.append(
            {
                "model": model,
                "method": method,
                "checkpoint": checkpoint,
                "benchmark": benchmark,
                "metric": f"acc@{int(samples.min())}",
                "seeds": estimate.seeds,
                "items": estimate.items,
                "samples": estimate.samples,
                "accuracy": float((correct / samples).mean()),
                **{f"var_{name}": getattr(estimate, name) for name in COMPONENTS},
                **{f"share_{name}": share for name, share in estimate.shares().items()},
            }
        )
    return pd.DataFrame(rows, columns=VARIANCE_COLUMNS)


VARIANCE_NOTE = (
    'Variance components of per-sample correctness (pipeline/stats/variance.py; docs/output.md, "Where the variance '
    "comes from\"), as standard deviations in points: between training seeds (a run's accuracy), between items "
    "(difficulty), seed x item (which items a run solves) and sampling (within an item and a run). Shares: each "
    "one's part of the variance of the method's mean score over its seeds, items and samples. `–`: not estimable "
    "from this design (one seed: the seed terms; one sample per item: sampling). `base` has no training seed: its "
    "seeds are evaluation seeds, so its seed term should be near 0."
)


def _points(variance: float) -> str:
    return "–" if math.isnan(variance) else f"{100 * math.sqrt(variance):.1f}"


def _percent(share: float) -> str:
    return "–" if math.isnan(share) else f"{100 * share:.0f} %"


def variance_markdown(table: pd.DataFrame) -> str:
    """A Markdown table of ``variance_table`` rows: sds in points and shares in percent."""
    header = (
        "| model | method | checkpoint | benchmark | seeds | items x samples | acc | sd seed | sd item | "
        "sd seed x item | sd sampling | share seed / item / seed x item / sampling |"
    )
    lines = [header, "|" + "---|" * 12]
    for row in table.itertuples(index=False):
        shares = " / ".join(_percent(getattr(row, f"share_{name}")) for name in COMPONENTS)
        lines.append(
            f"| {row.model} | {row.method} | {row.checkpoint} | {row.benchmark} | {row.seeds} | "
            f"{row.items} x {row.samples:g} | {100 * row.accuracy:.1f} | {_points(row.var_seed)} | "
            f"{_points(row.var_item)} | {_points(row.var_seed_item)} | {_points(row.var_sampling)} | {shares} |"
        )
    return "\n".join(lines) + "\n"
