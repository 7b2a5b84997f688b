"""Scores of a study: per-sample evaluation files -> one long table of scores, benchmark averages, and the summary
table (one row per model, method and checkpoint; mean and std over seeds) that the report and the docs quote.

Values are fractions; ``average`` is the unweighted mean over benchmarks and ``weighted_average`` weights each
benchmark by its items (``add_averages``). The stage that writes them is ``pipeline.aggregate``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from tqdm import tqdm

from pipeline.core.io import InputError, read_jsonl
from pipeline.core.layout import BASELINE_METHOD, EXPORT_PREFIX, FINAL_CHECKPOINT, METRICS_FILE, START_CHECKPOINT
from pipeline.stats.metrics import SamplesKey, group_by_item, parse_samples_path, parse_seed, score_items
from pipeline.stats.variance import ItemCounts

SCORE_COLUMNS = ["model", "method", "seed", "checkpoint", "benchmark", "metric", "value"]
AVERAGE_BENCHMARKS = ("average", "weighted_average")
# Counts are summed in the item-weighted average and averaged in the plain one (spec 6.4, docs/spec.md).
COUNT_METRICS = ("items", "samples", "no_answer")
SUMMARY_NOTE = (
    "Scores in percent, mean ± std (ddof 1) over seeds; `average` is unweighted over benchmarks, "
    "`weighted_average` weights each benchmark by its item count."
)


RUN_LAYOUT = ".../MODEL/METHOD/seedS/metrics.jsonl"


class RunKey(NamedTuple):
    model: str
    method: str
    seed: int


def parse_run_path(path: str | Path) -> RunKey:
    """(model, method, seed) from ``.../MODEL/METHOD/seedS/metrics.jsonl``."""
    path = Path(path)
    parts = path.parts
    if len(parts) < 4 or path.name != METRICS_FILE:
        raise InputError(f"{path}: training metrics path does not follow the layout {RUN_LAYOUT}")
    return RunKey(parts[-4], parts[-3], parse_seed(parts[-2], path, RUN_LAYOUT))


def missing_items_problem(path: str, items: Mapping[str, Any], benchmark: str, benchmark_ids: list[str]) -> str | None:
    """Why the items of a samples file are not those of its benchmark (items missing, or not in it); None if they are."""
    expected = set(benchmark_ids)
    missing, unknown = len(expected - set(items)), len(set(items) - expected)
    if not missing and not unknown:
        return None
    problems = [f"{missing} of the {len(expected)} items of benchmark {benchmark!r} have no sample"] if missing else []
    problems += [f"{unknown} items are not in the benchmark"] if unknown else []
    return f"{path}: {'; '.join(problems)}: the file is incomplete or from another benchmark"


def samples_per_item_problem(path: str, items: Mapping[str, list[Any]], samples_per_item: int | None) -> str | None:
    """Why the items of a samples file do not each hold ``samples_per_item`` samples (default: as many as its
    fullest item), naming the counts; None if they do. A file cut short (a lost last row) or padded is refused rather
    than summarized: its pass@k would stop at the smallest count and its method drop out of the tables."""
    counts = {item: len(rows) for item, rows in items.items()}
    expected = max(counts.values()) if samples_per_item is None else samples_per_item
    off = {item: count for item, count in counts.items() if count != expected}
    if not off:
        return None
    shown = ", ".join(f"{item!r} has {count}" for item, count in sorted(off.items())[:3])
    more = f" and {len(off) - 3} more" if len(off) > 3 else ""
    return (
        f"{path}: {len(off)} of its {len(counts)} items do not hold {expected} samples ({shown}{more}): the file is"
        " incomplete or from other settings; a plain `snakemake` run samples it again"
    )


def score_files(
    paths: list[str], benchmark_ids: Mapping[str, list[str]] | None = None, samples_per_item: int | None = None
) -> tuple[pd.DataFrame, list[tuple[SamplesKey, ItemCounts]]]:
    """Long-format scores (SCORE_COLUMNS) of every samples file, and each file's per-item counts (the variance
    table's input); a repeated key is refused, and so is a file whose items are not those of its benchmark, when
    ``benchmark_ids`` (benchmark name -> item ids) has it, or whose items do not each hold ``samples_per_item``
    samples (default: as many as its fullest item)."""
    rows: list[dict[str, Any]] = []
    counts: list[tuple[SamplesKey, ItemCounts]] = []
    seen: dict[SamplesKey, str] = {}
    for path in tqdm(paths, desc="scoring", unit="file", file=sys.stderr):
        key = parse_samples_path(path)
        if key in seen:
            raise InputError(f"{path}: same model/method/seed/checkpoint/benchmark as {seen[key]}")
        seen[key] = path
        items = group_by_item(read_jsonl(path), source=str(path))
        expected = (benchmark_ids or {}).get(key.benchmark)
        if expected is not None and (problem := missing_items_problem(path, items, key.benchmark, expected)):
            raise InputError(problem)
        if problem := samples_per_item_problem(path, items, samples_per_item):
            raise InputError(problem)
        scores = score_items(items)
        counts.append((key, ItemCounts.from_items(items)))
        rows.extend({**key._asdict(), "metric": metric, "value": float(value)} for metric, value in scores.items())
    return pd.DataFrame(rows, columns=SCORE_COLUMNS), counts


def _metric_average(metric: str, values: pd.Series, items: pd.Series, weighted: bool) -> float:
    """Unweighted: mean_b v_b. Item-weighted: sum_b m_b v_b / sum_b m_b (m_b = items of benchmark b).

    Counts (COUNT_METRICS) are summed in the weighted and averaged in the unweighted average (as upstream).
    NaN values (mean_tokens of a benchmark without any answer) are left out.
    """
    if metric in COUNT_METRICS:
        return float(values.sum()) if weighted else float(values.mean())
    finite = values.notna()
    if not finite.any():
        return math.nan
    if not weighted:
        return float(values[finite].mean())
    return float(np.average(values[finite], weights=items[finite]))


def add_averages(scores: pd.DataFrame) -> pd.DataFrame:
    """Append benchmarks ``average`` and ``weighted_average`` for every (model, method, seed, checkpoint).

    Only metrics that every benchmark of the run has are averaged (no pass@3 where a benchmark has n < 3).
    """
    run_columns = ["model", "method", "seed", "checkpoint"]
    averages: list[dict[str, Any]] = []
    for run, frame in scores.groupby(run_columns, sort=False):
        table = frame.pivot(index="benchmark", columns="metric", values="value")
        complete = frame.groupby("metric").size().eq(len(table))
        for name in AVERAGE_BENCHMARKS:
            for metric in complete.index[complete]:
                value = _metric_average(metric, table[metric], table["items"], name == "weighted_average")
                averages.append(
                    {
                        **dict(zip(run_columns, run, strict=True)),
                        "benchmark": name,
                        "metric": metric,
                        "value": value,
                    }
                )
    return pd.concat([scores, pd.DataFrame(averages, columns=SCORE_COLUMNS)], ignore_index=True)


def headline_metrics(scores: pd.DataFrame) -> dict[str, tuple[str, str]]:
    """Per benchmark, the (acc@n, pass@n) metric names with n = the largest k of any pass@k it has.

    Benchmarks are in sorted order, the averages last.
    """
    passes = scores[scores["metric"].str.startswith("pass@")]
    largest = passes.groupby("benchmark")["metric"].agg(lambda m: max(int(x.split("@")[1]) for x in m))
    order = sorted(b for b in largest.index if b not in AVERAGE_BENCHMARKS)
    order += [b for b in AVERAGE_BENCHMARKS if b in largest.index]
    return {b: (f"acc@{largest[b]}", f"pass@{largest[b]}") for b in order}


def _row_order(key: tuple[str, str, str]) -> tuple[Any, ...]:
    """Sort rows by model, then baseline (base/start), final checkpoints, then step-N checkpoints by step."""
    model, method, checkpoint = key
    if (method, checkpoint) == (BASELINE_METHOD, START_CHECKPOINT):
        return (model, 0, method, 0, checkpoint)
    if checkpoint == FINAL_CHECKPOINT:
        return (model, 1, method, 0, checkpoint)
    step = checkpoint.removeprefix(EXPORT_PREFIX)
    return (model, 2, method, int(step) if step.isdigit() else 0, checkpoint)


def summary_table(scores: pd.DataFrame) -> pd.DataFrame:
    """Rows (model, method, checkpoint); columns (benchmark, metric, stat) with stat mean / std over seeds.

    std = sample standard deviation (ddof 1) across seeds, NaN with one seed; column ``seeds`` counts them.
    """
    headline = headline_metrics(scores)
    wanted = [(b, m) for b, metrics in headline.items() for m in metrics]
    keys = ["model", "method", "checkpoint"]
    selected = scores.set_index(["benchmark", "metric"]).loc[lambda f: f.index.isin(wanted)].reset_index()
    stats = selected.groupby([*keys, "benchmark", "metric"])["value"].agg(mean="mean", std="std")
    table = stats.unstack(["benchmark", "metric"]).reorder_levels([1, 2, 0], axis=1)
    columns = [(b, m, s) for b, m in wanted for s in ("mean", "std") if (b, m, s) in table.columns]
    table = table.reindex(columns=pd.MultiIndex.from_tuples(columns, names=["benchmark", "metric", "stat"]))
    table = table.reindex(sorted(table.index, key=_row_order))
    table.insert(0, ("seeds", "", ""), scores.groupby(keys)["seed"].nunique().reindex(table.index))
    return table


def _cell(mean: float, std: float) -> str:
    """'mean ± std' in percent; the std is left out when undefined (one seed); '–' for a missing score."""
    if math.isnan(mean):
        return "–"
    return f"{100 * mean:.1f}" if math.isnan(std) else f"{100 * mean:.1f} ± {100 * std:.1f}"


def formatted_summary(table: pd.DataFrame) -> pd.DataFrame:
    """The summary as text cells: model, method, checkpoint, seeds, then 'benchmark metric' = 'mean ± std' (%)."""
    pairs = list(dict.fromkeys((b, m) for b, m, _ in table.columns if b != "seeds"))
    rows = [
        {
            "model": model,
            "method": method,
            "checkpoint": checkpoint,
            "seeds": str(int(row[("seeds", "", "")])),
            **{
                f"{b} {m}": _cell(row.get((b, m, "mean"), math.nan), row.get((b, m, "std"), math.nan)) for b, m in pairs
            },
        }
        for (model, method, checkpoint), row in table.iterrows()
    ]
    return pd.DataFrame(rows)


def summary_markdown(table: pd.DataFrame) -> str:
    """A Markdown table: one row per (model, method, checkpoint), one column per (benchmark, metric)."""
    formatted = formatted_summary(table)
    lines = [
        SUMMARY_NOTE,
        "",
        "| " + " | ".join(formatted.columns) + " |",
        "|" + "---|" * len(formatted.columns),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in formatted.itertuples(index=False, name=None)]
    return "\n".join(lines) + "\n"
