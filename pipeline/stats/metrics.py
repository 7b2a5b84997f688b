"""Scoring of per-sample evaluation rows: unbiased pass@k, acc@n and upstream's per-benchmark metrics; the keys
of a samples file from its path.

A benchmark's samples file holds one row per (item, sample) (ARCHITECTURE.md, "Evaluation samples"):
``{"id": str, "sample": int, "completion": str, "extracted": str|null, "correct": bool, "num_tokens": int}``.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple

from pipeline.core.io import InputError

SAMPLE_FIELDS: dict[str, tuple[type, ...]] = {
    "id": (str,),
    "sample": (int,),
    "extracted": (str, type(None)),
    "correct": (bool,),
    "num_tokens": (int,),
}


SEED_PATTERN = re.compile(r"seed(-?\d+)")
SAMPLES_LAYOUT = ".../MODEL/METHOD/seedS/CHECKPOINT/BENCHMARK.jsonl"


class SamplesKey(NamedTuple):
    model: str
    method: str
    seed: int
    checkpoint: str
    benchmark: str


def parse_seed(component: str, path: Path, layout: str) -> int:
    """S of a ``seedS`` path component; an InputError naming the path and its ``layout`` otherwise."""
    match = SEED_PATTERN.fullmatch(component)
    if match is None:
        raise InputError(f"{path}: path component '{component}' is not 'seed<integer>' (layout: {layout})")
    return int(match.group(1))


def parse_samples_path(path: str | Path) -> SamplesKey:
    """(model, method, seed, checkpoint, benchmark) from ``.../MODEL/METHOD/seedS/CKPT/BENCHMARK.jsonl``."""
    path = Path(path)
    parts = path.parts
    if len(parts) < 5 or path.suffix != ".jsonl":
        raise InputError(f"{path}: samples path does not follow the layout {SAMPLES_LAYOUT}")
    model, method, seed, checkpoint = parts[-5:-1]
    return SamplesKey(model, method, parse_seed(seed, path, SAMPLES_LAYOUT), checkpoint, path.stem)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one item with ``c`` correct among ``n`` samples (Chen et al. 2021).

    pass@k = 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k/i), and 1.0 when n - c < k
    (every k-subset then holds a correct sample). The product form avoids huge binomials.
    """
    if not 0 <= c <= n:
        raise InputError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise InputError(f"pass_at_k: need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _validate_sample(row: dict[str, Any], index: int, source: str) -> None:
    """Refuse a row with a missing or mistyped field, or a correct sample without an extracted answer."""
    for field, types in SAMPLE_FIELDS.items():
        if field not in row:
            raise InputError(f"{source}: row {index}: missing field '{field}'")
        value = row[field]
        # bool is an int subclass: a boolean sample index or token count is a type error too.
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            raise InputError(f"{source}: row {index}: field '{field}' has type {type(value).__name__}")
    if row["sample"] < 0 or row["num_tokens"] < 0:
        raise InputError(f"{source}: row {index}: 'sample' and 'num_tokens' must be >= 0")
    if row["correct"] and row["extracted"] is None:
        raise InputError(f"{source}: row {index}: marked correct but has no extracted answer")


def group_by_item(samples: list[dict[str, Any]], source: str = "samples") -> dict[str, list[dict[str, Any]]]:
    """Validated rows grouped by item id, each item's rows sorted by sample index.

    Raises InputError for an empty input, a bad row, or a repeated (id, sample) pair.
    """
    if not samples:
        raise InputError(f"{source}: no samples")
    items: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for index, row in enumerate(samples, start=1):
        _validate_sample(row, index, source)
        if row["sample"] in items[row["id"]]:
            raise InputError(f"{source}: row {index}: duplicate sample {row['sample']} of item '{row['id']}'")
        items[row["id"]][row["sample"]] = row
    return {item: [rows[s] for s in sorted(rows)] for item, rows in items.items()}


def _run_accuracies(correct_by_item: list[list[bool]]) -> list[float]:
    """Upstream's "runs": run j = the j-th sample of every item that has at least j+1 samples.

    run_acc_j = mean over those items of correct_{item, j}.
    """
    longest = max(len(c) for c in correct_by_item)
    runs = []
    for j in range(longest):
        column = [c[j] for c in correct_by_item if len(c) > j]
        runs.append(sum(column) / len(column))
    return runs


def score_benchmark(samples: list[dict[str, Any]], source: str = "samples") -> dict[str, float | int]:
    """Metrics of one benchmark from its per-sample rows (``source`` names the input in error messages):
    ``score_items`` of ``group_by_item``."""
    return score_items(group_by_item(samples, source))


def score_items(items: dict[str, list[dict[str, Any]]]) -> dict[str, float | int]:
    """Metrics of one benchmark from its validated rows grouped by item (``group_by_item``).

    With items i = 1..m, n_i samples and c_i correct ones, n = min_i n_i:
    - ``acc@n`` = (1/m) sum_i c_i / n_i  (mean over items of the item's mean correctness; each item uses all
      its samples, so with unequal n_i the label's n is the minimum);
    - ``pass@k`` = (1/m) sum_i pass_at_k(n_i, c_i, k) for every k = 1..n: k stops at the *minimum* sample
      count, because the estimator needs k <= n_i for every item (pass@1 equals acc@n);
    - ``mean_tokens`` = mean num_tokens over samples with an extracted answer (upstream's avg_tokens:
      generations that produced a boxed answer; unanswered ones are often cut at the length limit and would
      swamp the mean); NaN when no sample has an answer;
    - ``no_answer`` = number of samples whose extracted answer is null; ``items`` = m;
      ``samples`` = sum_i n_i;
    - ``run_acc_mean`` / ``run_acc_std`` = mean and population std (ddof 0) of the per-run accuracies
      (run j = j-th sample of every item with at least j+1 samples; spec 6.4, docs/spec.md).
    """
    correct_by_item = [[bool(row["correct"]) for row in rows] for rows in items.values()]
    n = min(len(c) for c in correct_by_item)
    m = len(correct_by_item)
    scores: dict[str, float | int] = {f"acc@{n}": sum(sum(c) / len(c) for c in correct_by_item) / m}
    for k in range(1, n + 1):
        scores[f"pass@{k}"] = sum(pass_at_k(len(c), sum(c), k) for c in correct_by_item) / m
    answered = [row["num_tokens"] for rows in items.values() for row in rows if row["extracted"] is not None]
    total = sum(len(c) for c in correct_by_item)
    runs = _run_accuracies(correct_by_item)
    run_mean = sum(runs) / len(runs)
    scores.update(
        mean_tokens=sum(answered) / len(answered) if answered else math.nan,
        no_answer=total - len(answered),
        items=m,
        samples=total,
        run_acc_mean=run_mean,
        run_acc_std=math.sqrt(sum((r - run_mean) ** 2 for r in runs) / len(runs)),
    )
    return scores
