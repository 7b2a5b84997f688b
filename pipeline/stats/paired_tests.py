"""Stage `significance`: Wilcoxon signed-rank tests between methods, paired bootstrap CIs per benchmark, seed-aware
comparisons between trained methods, Holm.

    python -m pipeline.significance --scores SCORES.csv --out OUT.json [--samples FILE...] [--markdown OUT.md]
                                    [--checkpoint final] [--metrics acc@3 pass@3] [--resamples 10000] [--seed 0]

Wilcoxon (one row per method pair, metric, test, zero handling and alternative):
- Pairs are (model, benchmark) cells of SCORES.csv at one checkpoint (default ``final``; the baseline method
  ``base`` and the rows ``average`` / ``weighted_average`` are left out); each cell's value is the mean over seeds.
  d = round(a - b, 10) (rounded as scipy's docs advise, so float round-off cannot break ties).
- ``statistic`` = W+ = sum of the ranks of |d| over pairs with d > 0 (method_a better) in every row, two-sided
  ones included; ``scipy_statistic`` is what scipy returned (min(W+, W-) for two-sided tests).
- ``alternative``: "greater" (H1: a > b) for every ordered pair, and "two-sided" once per unordered pair
  (method_a sorting first).
- ``zero_method``: "wilcox" drops zero differences before ranking; "zsplit" ranks them and adds half of their
  ranks to W+ and half to W-.
- ``test``: "wilcoxon_exact" = scipy ``method="exact"``: the null distribution of W+ for n untied ranks; scipy 1.17
  neither warns nor refuses with ties or zeros, it rounds a non-integer W+ down ("greater") before looking it up,
  which is conservative. This reproduces the paper's p = 1.3e-8 at W+ = 459.5 over 30 pairs.
  "wilcoxon_approx" = scipy ``method="asymptotic"`` (normal approximation, tie-corrected variance, no continuity
  correction). "wilcoxon_exact_conditional" = the exact permutation p-value given the observed (tied) ranks:
  every nonzero difference's sign flips independently with probability 1/2 under H0 (computed here by dynamic
  programming over doubled ranks); it is the exact test when ties or zeros are present.
- ``rank_biserial`` = (W+ - W-) / (W+ + W-), the matched-pairs rank-biserial correlation.
- ``p_holm``: Holm's step-down adjustment within one family = all rows sharing (test, alternative, zero_method),
  i.e. over every method pair and metric tested the same way.

Paired tests over items (``--samples``), per model and benchmark, for every trained method against the baseline
``base`` (its ``start`` samples; method_a = the method, method_b = base) and every unordered pair of trained
methods (method_a sorting first). Per item, acc = mean correctness over its samples and the seeds; d_i = acc_a -
acc_b. They hold the runs fixed: between trained methods they are conditional on these trained runs. Two rows per
comparison:
- ``test`` = "paired_bootstrap": items resampled with replacement; the statistic is mean(d);
  ``ci_low``/``ci_high`` the percentile interval; ``p_value`` the two-sided bootstrap
  p = (1 + #{|delta*_b - delta| >= |delta|}) / (B + 1). Each row draws from its own generator seeded by (--seed,
  crc32 of 'model/benchmark/method_a/method_b'), so a row's interval does not depend on which other rows exist.
- ``test`` = "wilcoxon_items": the exact conditional Wilcoxon signed-rank test over the items' d (zero
  differences dropped, tied ranks kept, as "wilcoxon_exact_conditional" above); one-sided "greater" (H1: the
  method beats base) against base, two-sided between trained methods.
Holm families as above: (test, alternative, zero_method).

Between trained methods, with the training runs as random (``pipeline.stats.seed_aware``, docs/output.md "The
seed-aware rows"): per (model, benchmark) and for the study (model ``all``, benchmark ``average``: the mean over
cells), a ``seed_bootstrap`` row (stratified bootstrap over runs and items: interval, two-sided p, probability of
improvement) and ``seed_permutation`` rows (exact permutation test over runs: per cell with 3 or more runs of each
method; for the study, within models). Holm families as above.

``seed_aware_key_comparisons`` and ``key_comparisons`` pick the rows that answer "did RL help, and did GRAIL beat
GRPO" for the report: between trained methods the seed-aware result first, with the item-level one beside it
(conditional on these runs); each method against base over items. The Markdown summary leads with the paper's
test (exact one-sided Wilcoxon, GRAIL > GRPO, over (model, benchmark) cells) and them, then gives the full grid.
"""

from __future__ import annotations

import itertools
import math
import sys
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats
from tqdm import tqdm

from pipeline.core.io import InputError, read_jsonl
from pipeline.core.layout import BASELINE_METHOD, START_CHECKPOINT
from pipeline.stats.metrics import group_by_item, parse_samples_path
from pipeline.stats.scores import AVERAGE_BENCHMARKS
from pipeline.stats.seed_aware import ALL_MODELS, SEED_BOOTSTRAP_TEST, SEED_PERMUTATION_TEST, Runs, comparison_seed
from pipeline.stats.variance import ItemCounts, stack_seeds

REQUIRED_COLUMNS = ("model", "method", "seed", "benchmark", "metric", "value")
DIFFERENCE_DECIMALS = 10
ZERO_METHODS = ("wilcox", "zsplit")
SCIPY_TESTS = {"wilcoxon_exact": "exact", "wilcoxon_approx": "asymptotic"}
CONDITIONAL_TEST = "wilcoxon_exact_conditional"
BOOTSTRAP_TEST = "paired_bootstrap"
ITEM_WILCOXON_TEST = "wilcoxon_items"
# The paper's headline test (spec E.3): exact one-sided Wilcoxon, GRAIL better than GRPO, over (model, benchmark).
PAPER_TEST = {"test": "wilcoxon_exact", "alternative": "greater", "zero_method": "wilcox"}
PAPER_PAIR = ("grail", "grpo")
# The key comparisons hold every other trained method against these two (a control or a baseline answers "does it
# keep GRAIL's gain over GRPO"), the reference named second.
REFERENCE_METHODS = PAPER_PAIR
# Bound the (resamples x items) index matrix of one bootstrap chunk.
BOOTSTRAP_CHUNK_CELLS = 2_000_000


def holm(p_values: list[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values; None entries are not tests and stay None.

    With the m valid p-values sorted ascending p_(1) <= ... <= p_(m):
    p_holm_(i) = min(1, max_{j <= i} (m - j + 1) p_(j)).
    """
    valid = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, index) in enumerate(valid):
        running = max(running, min(1.0, (len(valid) - rank) * p))
        adjusted[index] = running
    return adjusted


def signed_ranks(d: np.ndarray, zero_method: str) -> tuple[np.ndarray, np.ndarray, float]:
    """(ranks of the nonzero |d|, their signs, the constant part of W+).

    Ranks are average ranks of |d| ("wilcox": over nonzero d only; "zsplit": over all d, and the zeros' ranks
    contribute half to W+ and half to W-, so W+ gets the constant sum(zero ranks) / 2).
    """
    if zero_method not in ZERO_METHODS:
        raise ValueError(f"zero_method must be one of {ZERO_METHODS}, got {zero_method!r}")
    kept = d if zero_method == "zsplit" else d[d != 0]
    ranks = stats.rankdata(np.abs(kept))
    nonzero = kept != 0
    return ranks[nonzero], np.sign(kept[nonzero]), float(ranks[~nonzero].sum()) / 2


def rank_sums(d: np.ndarray, zero_method: str) -> tuple[float, float]:
    """(W+, W-): sums of the signed ranks of d (zero handling as in ``signed_ranks``)."""
    ranks, signs, zero_half = signed_ranks(d, zero_method)
    return float(ranks[signs > 0].sum()) + zero_half, float(ranks[signs < 0].sum()) + zero_half


def conditional_exact_pvalue(d: np.ndarray, zero_method: str, alternative: str) -> float:
    """Exact permutation p-value of W+ given the observed ranks (ties and zeros included).

    Under H0 each nonzero difference's sign is +/- with probability 1/2 independently, so
    W+ = c + sum_i r_i B_i with B_i ~ Bernoulli(1/2). Average ranks are multiples of 1/2, so the distribution of
    sum_i 2 r_i B_i lives on the integers and is built by the convolution P <- (P + shift(P, 2 r_i)) / 2.
    greater: P(W+ >= w), less: P(W+ <= w), two-sided: min(1, 2 min(greater, less)).
    """
    ranks, signs, _ = signed_ranks(d, zero_method)
    doubled = np.rint(2 * ranks).astype(np.int64)
    distribution = np.zeros(int(doubled.sum()) + 1)
    distribution[0] = 1.0
    for step in doubled:
        shifted = np.zeros_like(distribution)
        shifted[step:] = distribution[: len(distribution) - step]
        distribution = (distribution + shifted) / 2
    observed = int(doubled[signs > 0].sum())
    greater = float(distribution[observed:].sum())
    less = float(distribution[: observed + 1].sum())
    if alternative == "greater":
        return greater
    if alternative == "less":
        return less
    return min(1.0, 2 * min(greater, less))


def _finite_or_none(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def wilcoxon_rows(d: np.ndarray, zero_method: str, alternative: str) -> list[dict[str, Any]]:
    """The three Wilcoxon tests (scipy exact, scipy normal approximation, conditional exact) of one d."""
    w_plus, w_minus = rank_sums(d, zero_method)
    common = {
        "n": len(d),
        "n_zero": int((d == 0).sum()),
        "statistic": w_plus,
        "alternative": alternative,
        "zero_method": zero_method,
        "w_plus": w_plus,
        "w_minus": w_minus,
        "rank_biserial": _finite_or_none((w_plus - w_minus) / (w_plus + w_minus)) if w_plus + w_minus else None,
        "mean_difference": float(d.mean()),
    }
    rows = []
    for test, method in SCIPY_TESTS.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = stats.wilcoxon(d, zero_method=zero_method, alternative=alternative, method=method)
        rows.append(
            {
                "test": test,
                **common,
                "p_value": _finite_or_none(result.pvalue),
                "scipy_statistic": _finite_or_none(result.statistic),
                "warnings": [str(w.message) for w in caught],
            }
        )
    conditional = conditional_exact_pvalue(d, zero_method, alternative)
    rows.append({"test": CONDITIONAL_TEST, **common, "p_value": conditional, "scipy_statistic": None, "warnings": []})
    return rows


def read_scores(path: Path, checkpoint: str) -> pd.DataFrame:
    """Scores at ``checkpoint`` (a missing ``checkpoint`` column means every row is at it), base and averages out.

    Raises InputError naming a missing column, a non-numeric value, a duplicated row or an empty selection.
    """
    if not path.is_file():
        raise InputError(f"{path}: file not found")
    scores = pd.read_csv(path)
    missing = [column for column in REQUIRED_COLUMNS if column not in scores.columns]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(repr(c) for c in missing)}")
    values = pd.to_numeric(scores["value"], errors="coerce")
    bad = scores.index[values.isna() & scores["value"].notna()]
    if len(bad):
        raise InputError(f"{path}: line {bad[0] + 2}: column 'value' is not a number ({scores['value'][bad[0]]!r})")
    scores = scores.assign(value=values)
    if "checkpoint" in scores.columns:
        scores = scores[scores["checkpoint"].astype(str) == checkpoint]
    keys = ["model", "method", "seed", "benchmark", "metric"]
    duplicated = scores.duplicated(keys)
    if duplicated.any():
        row = scores[duplicated].iloc[0]
        raise InputError(f"{path}: duplicate score for {', '.join(f'{k}={row[k]}' for k in keys)}")
    selected = scores[(scores["method"] != BASELINE_METHOD) & ~scores["benchmark"].isin(AVERAGE_BENCHMARKS)]
    if selected.empty:
        raise InputError(f"{path}: no per-benchmark scores of a trained method at checkpoint '{checkpoint}'")
    return selected


def default_metrics(scores: pd.DataFrame) -> list[str]:
    """acc@n and pass@n for every n with an acc@n in the scores (intermediate pass@k are left out)."""
    accs = sorted({m for m in scores["metric"] if m.startswith("acc@")})
    return [name for acc in accs for name in (acc, "pass@" + acc.split("@")[1]) if name in set(scores["metric"])]


def paired_cells(scores: pd.DataFrame, metric: str, method_a: str, method_b: str) -> tuple[np.ndarray, list[str]]:
    """d = round(mean_seeds a - mean_seeds b, 10) over the (model, benchmark) cells both methods have."""
    chosen = scores[scores["metric"] == metric]
    means = chosen.groupby(["method", "model", "benchmark"])["value"].mean()
    a, b = means.get(method_a), means.get(method_b)
    if a is None or b is None:
        return np.array([]), []
    joined = pd.concat([a.rename("a"), b.rename("b")], axis=1, join="inner").sort_index()
    d = np.round((joined["a"] - joined["b"]).to_numpy(dtype=float), DIFFERENCE_DECIMALS)
    return d, [f"{model}/{benchmark}" for model, benchmark in joined.index]


def wilcoxon_comparisons(scores: pd.DataFrame, metrics: list[str]) -> list[dict[str, Any]]:
    """Every Wilcoxon row (module docstring) for every method pair and metric."""
    methods = sorted(set(scores["method"]))
    rows = []
    for metric in metrics:
        for method_a, method_b in itertools.permutations(methods, 2):
            d, cells = paired_cells(scores, metric, method_a, method_b)
            if not len(d):
                continue
            alternatives = ["greater", "two-sided"] if method_a < method_b else ["greater"]
            for zero_method, alternative in itertools.product(ZERO_METHODS, alternatives):
                for row in wilcoxon_rows(d, zero_method, alternative):
                    rows.append({"method_a": method_a, "method_b": method_b, "metric": metric, **row, "pairs": cells})
    return rows


def read_runs(paths: list[str], checkpoint: str) -> dict[tuple[str, str], dict[str, Runs]]:
    """{(model, benchmark): {method: Runs}} from the samples files at ``checkpoint``, with the baseline ``base`` at
    its ``start`` checkpoint: per run (seed) and item, acc = mean correctness over the item's samples; the runs'
    ``samples`` = the fewest samples of any item in any seed (the acc@n label)."""
    per_seed: dict[tuple[str, str, str], dict[int, ItemCounts]] = defaultdict(dict)
    for path in tqdm(paths, desc="reading samples", unit="file", file=sys.stderr):
        key = parse_samples_path(path)
        wanted = START_CHECKPOINT if key.method == BASELINE_METHOD else checkpoint
        if key.checkpoint != wanted:
            continue
        items = group_by_item(read_jsonl(path), source=str(path))
        per_seed[key.model, key.benchmark, key.method][key.seed] = ItemCounts.from_items(items)
    result: dict[tuple[str, str], dict[str, Runs]] = defaultdict(dict)
    for (model, benchmark, method), by_seed in per_seed.items():
        correct, samples = stack_seeds(by_seed, f"{model}/{method}/{benchmark}")
        ids = by_seed[min(by_seed)].ids
        result[model, benchmark][method] = Runs(tuple(sorted(by_seed)), ids, correct / samples, int(samples.min()))
    return result


def paired_bootstrap(
    d: np.ndarray, resamples: int, confidence: float, seed: int | list[int]
) -> tuple[float, float, float]:
    """(ci_low, ci_high, p) of mean(d) by resampling items with replacement.

    delta*_b = mean of d over a resample of the m items; CI = the (1-confidence)/2 and (1+confidence)/2 quantiles
    of delta*; p = (1 + #{|delta*_b - delta| >= |delta|}) / (B + 1) (two-sided, null-centred).
    """
    rng = np.random.default_rng(seed)
    chunk = max(1, BOOTSTRAP_CHUNK_CELLS // len(d))
    means = np.concatenate(
        [
            d[rng.integers(0, len(d), size=(min(chunk, resamples - start), len(d)))].mean(axis=1)
            for start in range(0, resamples, chunk)
        ]
    )
    low, high = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    observed = d.mean()
    extreme = np.count_nonzero(np.abs(means - observed) >= abs(observed) - 1e-12)
    return float(low), float(high), float((1 + extreme) / (resamples + 1))


def compared_pairs(methods: set[str]) -> list[tuple[str, str]]:
    """(method_a, method_b) pairs tested over items: each trained method against base, then trained pairs."""
    trained = sorted(methods - {BASELINE_METHOD})
    against_base = [(method, BASELINE_METHOD) for method in trained] if BASELINE_METHOD in methods else []
    return against_base + list(itertools.combinations(trained, 2))


def item_comparisons(
    runs: dict[tuple[str, str], dict[str, Runs]], resamples: int, confidence: float, seed: int
) -> list[dict[str, Any]]:
    """A paired_bootstrap and a wilcoxon_items row per (model, benchmark) and compared pair (module docstring)."""
    rows = []
    for (model, benchmark), by_method in sorted(runs.items()):
        for method_a, method_b in compared_pairs(set(by_method)):
            a, b = by_method[method_a], by_method[method_b]
            if a.items != b.items:
                raise InputError(f"{model}/{benchmark}: {method_a} and {method_b} were scored on different items")
            d = np.round(a.accuracy.mean(axis=0) - b.accuracy.mean(axis=0), DIFFERENCE_DECIMALS)
            common = {
                "method_a": method_a,
                "method_b": method_b,
                "metric": f"acc@{min(a.samples, b.samples)}",
                "n": len(d),
                "model": model,
                "benchmark": benchmark,
            }
            row_seed = comparison_seed(seed, model, benchmark, method_a, method_b)
            low, high, p = paired_bootstrap(d, resamples, confidence, row_seed)
            rows.append(
                {
                    **common,
                    "statistic": float(d.mean()),
                    "p_value": p,
                    "alternative": "two-sided",
                    "test": BOOTSTRAP_TEST,
                    "ci_low": low,
                    "ci_high": high,
                    "confidence": confidence,
                    "resamples": resamples,
                    "seed": seed,
                }
            )
            alternative = "greater" if method_b == BASELINE_METHOD else "two-sided"
            w_plus, w_minus = rank_sums(d, "wilcox")
            rows.append(
                {
                    **common,
                    "statistic": w_plus,
                    "p_value": conditional_exact_pvalue(d, "wilcox", alternative),
                    "alternative": alternative,
                    "test": ITEM_WILCOXON_TEST,
                    "zero_method": "wilcox",
                    "n_zero": int((d == 0).sum()),
                    "w_plus": w_plus,
                    "w_minus": w_minus,
                    "mean_difference": float(d.mean()),
                }
            )
    return rows


def add_holm(rows: list[dict[str, Any]]) -> None:
    """Set ``p_holm`` on every row, adjusting within its family (test, alternative, zero_method)."""
    families: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        families[row["test"], row["alternative"], row.get("zero_method")].append(row)
    for family in families.values():
        for row, adjusted in zip(family, holm([row["p_value"] for row in family]), strict=True):
            row["p_holm"] = adjusted


def paper_test(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The paper's test row (exact one-sided Wilcoxon, GRAIL > GRPO) on the first acc@n metric, if it was run."""
    candidates = [
        row
        for row in rows
        if all(row.get(key) == value for key, value in PAPER_TEST.items())
        and (row["method_a"], row["method_b"]) == PAPER_PAIR
        and str(row["metric"]).startswith("acc@")
    ]
    return min(candidates, key=lambda row: row["metric"], default=None)


def key_comparison_pair(pair: tuple[str, str]) -> tuple[tuple[str, str], bool] | None:
    """The pair as the key comparisons show it and whether that flips the tested order; None when the pair is not
    one of them (every method against base, GRAIL against GRPO, any other method against GRPO and GRAIL)."""
    if pair[1] == BASELINE_METHOD or pair == PAPER_PAIR or pair[1] in REFERENCE_METHODS:
        return pair, False
    if pair[0] in REFERENCE_METHODS:
        return (pair[1], pair[0]), True
    return None


def key_comparisons(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model and benchmark: every method against base, GRAIL against GRPO, and every other method against
    GRPO and GRAIL, from the item-level rows.

    Each entry: model, benchmark, comparison ("a vs b"), metric, items, difference (mean per-item acc_a - acc_b),
    ci_low/ci_high (bootstrap), p_wilcoxon (one-sided against base, two-sided between methods), p_holm of it,
    p_bootstrap (two-sided). A pair tested as (reference, other) is shown as "other vs reference": its difference
    and interval are negated; its two-sided p-values do not change.
    """
    bootstrap = {
        (r["model"], r["benchmark"], r["method_a"], r["method_b"]): r for r in rows if r["test"] == BOOTSTRAP_TEST
    }
    entries = []
    for row in (r for r in rows if r["test"] == ITEM_WILCOXON_TEST):
        tested = (row["method_a"], row["method_b"])
        shown = key_comparison_pair(tested)
        if shown is None:
            continue
        pair, flipped = shown
        interval = bootstrap[row["model"], row["benchmark"], *tested]
        sign = -1 if flipped else 1
        ci_low, ci_high = sorted((sign * interval["ci_low"], sign * interval["ci_high"]))
        entries.append(
            {
                "model": row["model"],
                "benchmark": row["benchmark"],
                "comparison": f"{pair[0]} vs {pair[1]}",
                "metric": row["metric"],
                "items": row["n"],
                "difference": sign * row["mean_difference"],
                "ci_low": ci_low,
                "ci_high": ci_high,
                "alternative": row["alternative"],
                "p_wilcoxon": row["p_value"],
                "p_wilcoxon_holm": row.get("p_holm"),
                "p_bootstrap": interval["p_value"],
            }
        )
    entries.sort(key=lambda e: (e["model"], e["benchmark"], e["comparison"].endswith(f"vs {BASELINE_METHOD}") is False))
    return entries


def _oriented(
    low: float | None, high: float | None, sign: int, offset: float = 0.0
) -> tuple[float | None, float | None]:
    """The interval of offset + sign * x for x in [low, high] (None stays None)."""
    if low is None or high is None:
        return None, None
    return tuple(sorted((offset + sign * low, offset + sign * high)))


def seed_aware_key_comparisons(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The comparisons between trained methods of ``key_comparisons`` with training runs as random: per pair the
    study (model ``all``, benchmark ``average``) first, then per model and benchmark.

    Each entry: model, benchmark, comparison, metric, items (cells for the study), runs ("S_A / S_B"), difference,
    ci_low/ci_high (stratified bootstrap over runs and items; None when the runs cannot be resampled),
    improvement (P(a > b)) and its interval, p_bootstrap, p_permutation (over runs; None without one) with
    arrangements and min_p, and the item-level results conditional on these runs: items_ci_low/items_ci_high
    (paired bootstrap) and p_items_holm (Wilcoxon over items, Holm). A pair tested as (reference, other) is shown
    as "other vs reference": differences and intervals negated, P(a > b) -> 1 - P.
    """

    def keyed(test: str) -> dict[tuple[str, ...], dict[str, Any]]:
        return {(r["model"], r["benchmark"], r["method_a"], r["method_b"]): r for r in rows if r["test"] == test}

    permutation, items, wilcoxon = keyed(SEED_PERMUTATION_TEST), keyed(BOOTSTRAP_TEST), keyed(ITEM_WILCOXON_TEST)
    entries = []
    for row in (r for r in rows if r["test"] == SEED_BOOTSTRAP_TEST):
        key = (row["model"], row["benchmark"], row["method_a"], row["method_b"])
        shown = key_comparison_pair((row["method_a"], row["method_b"]))
        if shown is None:
            continue
        pair, flipped = shown
        sign = -1 if flipped else 1

        tested = permutation.get(key)
        item_row = items.get(key)
        entry = {
            "model": row["model"],
            "benchmark": row["benchmark"],
            "comparison": f"{pair[0]} vs {pair[1]}",
            "metric": row["metric"],
            "items": row["n"],
            "runs": f"{row['seeds_b']} / {row['seeds_a']}" if flipped else f"{row['seeds_a']} / {row['seeds_b']}",
            "difference": sign * row["statistic"],
            "p_bootstrap": row["p_value"],
            "improvement": 1 - row["prob_improvement"] if flipped else row["prob_improvement"],
            "p_permutation": tested["p_value"] if tested else None,
            "arrangements": tested["arrangements"] if tested else None,
            "min_p": tested["min_p"] if tested else None,
            "p_items_holm": wilcoxon[key].get("p_holm") if key in wilcoxon else None,
        }
        entry["ci_low"], entry["ci_high"] = _oriented(row["ci_low"], row["ci_high"], sign)
        entry["improvement_low"], entry["improvement_high"] = (
            _oriented(row["prob_improvement_low"], row["prob_improvement_high"], -1, 1.0)
            if flipped
            else (row["prob_improvement_low"], row["prob_improvement_high"])
        )
        entry["items_ci_low"], entry["items_ci_high"] = _oriented(
            item_row["ci_low"] if item_row else None, item_row["ci_high"] if item_row else None, sign
        )
        entries.append(entry)
    entries.sort(key=lambda e: (e["comparison"] != "grail vs grpo", e["comparison"], e["model"] != ALL_MODELS))
    return entries
