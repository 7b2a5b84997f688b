"""Stage `aggregate`: per-sample evaluation files -> scores.csv, summary tables (CSV/MD/XLSX) and figures.

    python -m pipeline.aggregate --samples FILE... --train-metrics FILE... --out-dir DIR --figures-dir DIR
        [--benchmarks FILE...] [--samples-per-item N] [--credit-methods CREDIT...]

Keys come from paths: samples files are ``.../<model>/<method>/seed<seed>/<checkpoint>/<benchmark>.jsonl`` and
training metrics ``.../<model>/<method>/seed<seed>/metrics.jsonl``. A samples file whose items are not those of its
benchmark (``--benchmarks``: the file ``<benchmark>.jsonl``) is refused, naming how many are missing, and so is one
whose items do not each hold ``--samples-per-item`` samples (the study's ``n_samples``), naming the counts; every
file read must match its seal (``pipeline.core.seal``).

Outputs (each written atomically):
- ``scores.csv``: long format (model, method, seed, checkpoint, benchmark, metric, value), values as fractions;
  metrics of ``pipeline.stats.metrics.score_benchmark`` per benchmark, plus benchmarks ``average`` (unweighted) and
  ``weighted_average`` (by items) per run;
- ``summary.csv`` / ``summary.xlsx`` (sheet "summary": numbers; sheet "formatted": text cells) / ``summary.md``:
  one row per (model, method, checkpoint), the baseline ``base``/``start`` first; per benchmark acc@n and pass@n
  (n = the largest k with a pass@k), mean and std over seeds;
- ``variance.csv`` / ``variance.md``: per (model, method, checkpoint, benchmark) the variance components of
  per-sample correctness, between training seeds, between items, seed x item and sampling
  (``pipeline.stats.variance``);
- figures ``scores_by_benchmark.png``, ``training_curves.png`` (reward and each credit method's headline
  statistics) and ``training_diagnostics.png`` (reward and the methods' other statistics); the credit methods
  are those ``--credit-methods`` names (the study's ``credit`` values), each read from the registry.
"""

from __future__ import annotations

import argparse
import math
import zlib
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from pipeline.core.io import InputError, atomic_path, atomic_save_figure, atomic_write_text, read_jsonl, run_cli
from pipeline.core.layout import (
    BASELINE_METHOD,
    FINAL_CHECKPOINT,
    SCORES_FIGURE,
    START_CHECKPOINT,
    TRAINING_CURVES_FIGURE,
    TRAINING_DIAGNOSTICS_FIGURE,
)
from pipeline.credit.method import built_in_names, credit_method
from pipeline.stats.scores import (
    RunKey,
    add_averages,
    formatted_summary,
    parse_run_path,
    score_files,
    summary_markdown,
    summary_table,
)
from pipeline.stats.variance import VARIANCE_NOTE, variance_markdown, variance_table

# Logged values per moving-average window in the training-curve figure (a tenth of a 100-step run at 2 a log).
SMOOTHING_WINDOW = 5
# The same colour for a method in every figure; other methods take the remaining matplotlib cycle colours.
METHOD_COLORS = {"base": "C7", "grpo": "C0", "oar_g": "C2", "grail": "C3"}


def _flat_columns(table: pd.DataFrame) -> pd.DataFrame:
    """Columns 'benchmark/metric/stat' (and 'seeds'), values as fractions: the CSV and the first XLSX sheet."""
    flat = table.copy()
    flat.columns = ["/".join(part for part in column if part) for column in table.columns]
    return flat.reset_index()


def method_color(method: str) -> str:
    """A fixed colour per method (METHOD_COLORS), else a cycle colour chosen by a stable hash of the name."""
    spare = [f"C{i}" for i in range(10) if f"C{i}" not in METHOD_COLORS.values()]
    return METHOD_COLORS.get(method) or spare[zlib.crc32(method.encode()) % len(spare)]


def plot_scores(table: pd.DataFrame, path: Path) -> None:
    """Grouped bars: per model a row of panels (acc@n, pass@n); x = benchmark, a bar per method, std bars.

    Shows the baseline (base/start) and every method's final checkpoint.
    """
    headline = [
        k for k in table.index if k[2] == FINAL_CHECKPOINT or (k[1], k[2]) == (BASELINE_METHOD, START_CHECKPOINT)
    ]
    shown = headline or list(table.index)
    models = list(dict.fromkeys(k[0] for k in shown))
    benchmarks = list(dict.fromkeys(b for b, _, _ in table.columns if b != "seeds"))
    fig, axes = plt.subplots(
        len(models), 2, figsize=(max(6, 1.6 * len(benchmarks)) * 2, 3.5 * len(models)), squeeze=False
    )
    for row_axes, model in zip(axes, models, strict=True):
        rows = [k for k in shown if k[0] == model]
        width = 0.8 / len(rows)
        for panel, (axis, label) in enumerate(zip(row_axes, ("acc@n", "pass@n"), strict=True)):
            metric_of = {b: m for b, m, _ in table.columns if b != "seeds" and m.startswith(("acc@", "pass@")[panel])}
            for offset, key in enumerate(rows):
                means = [table.loc[key].get((b, metric_of[b], "mean"), math.nan) for b in benchmarks]
                stds = [table.loc[key].get((b, metric_of[b], "std"), math.nan) for b in benchmarks]
                positions = np.arange(len(benchmarks)) + (offset - (len(rows) - 1) / 2) * width
                axis.bar(
                    positions,
                    means,
                    width,
                    yerr=np.nan_to_num(stds),
                    capsize=3,
                    color=method_color(key[1]),
                    label=key[1] if key[2] == FINAL_CHECKPOINT else f"{key[1]} ({key[2]})",
                )
            axis.set_xticks(np.arange(len(benchmarks)), [f"{b}\n{metric_of[b]}" for b in benchmarks], fontsize=8)
            axis.set_ylim(0, 1)
            axis.set_title(f"{model}: {label} (mean ± std over seeds)")
        row_axes[0].legend(fontsize=8)
    fig.tight_layout()
    _save_figure(fig, path)


def _save_figure(fig: plt.Figure, path: Path) -> None:
    atomic_save_figure(fig, path, dpi=120)
    plt.close(fig)


def load_training_curves(paths: list[str]) -> dict[RunKey, pd.DataFrame]:
    """Per run, a frame indexed by ``step`` with the numeric logged values (rows without a value give NaN)."""
    curves: dict[RunKey, pd.DataFrame] = {}
    for path in paths:
        key = parse_run_path(path)
        if key in curves:
            raise InputError(f"{path}: a second metrics file for run {key.model}/{key.method}/seed{key.seed}")
        records = []
        for number, row in enumerate(read_jsonl(path), start=1):
            if not isinstance(row.get("step"), int) or isinstance(row.get("step"), bool):
                raise InputError(f"{path}: record {number}: missing or non-integer 'step'")
            records.append({k: v for k, v in row.items() if isinstance(v, int | float) and not isinstance(v, bool)})
        curves[key] = pd.DataFrame(records).set_index("step").sort_index() if records else pd.DataFrame()
    return curves


def smoothed(series: pd.Series, window: int) -> pd.Series:
    """Trailing moving average over the last ``window`` logged values (fewer at the start): s_j = mean(x_{j-w+1..j})."""
    return series.rolling(window, min_periods=1).mean()


def seed_bands(curves: dict[RunKey, pd.DataFrame], key: str, window: int) -> dict[tuple[str, str], pd.DataFrame]:
    """Per (model, method): columns mean, low, high over seeds of each run's smoothed ``key``, indexed by step.

    Each seed's logged values are smoothed (``smoothed``) first; at a step, mean/low/high are the mean, minimum
    and maximum over the seeds that logged it.
    """
    runs: dict[tuple[str, str], list[pd.Series]] = defaultdict(list)
    for run, curve in sorted(curves.items()):
        if key in curve.columns and curve[key].notna().any():
            runs[run.model, run.method].append(smoothed(curve[key].dropna(), window).rename(run.seed))
    bands = {}
    for group, series in runs.items():
        joined = pd.concat(series, axis=1)
        bands[group] = pd.DataFrame(
            {"mean": joined.mean(axis=1), "low": joined.min(axis=1), "high": joined.max(axis=1)}
        )
    return bands


def training_curve_keys(
    curves: dict[RunKey, pd.DataFrame], credits: list[str] | None = None
) -> tuple[list[str], list[str]]:
    """The panels of the two training-curve figures: ``reward`` and the headline statistics
    (``CreditMethod.headline``, at most four, those logged) of each method that ``credits`` names (a study config's
    ``credit`` values: built-in names or import paths; default every built-in method), then the rest of those
    methods' logged statistics. Built-in or out-of-tree, a method is read the same way: from the registry.

    Statistics of a method that no credit names are refused rather than left out of both figures: the trainer
    logs ``<name>/advantages_scale_ratio`` for every per-token method, so its name is known."""
    logged = {key for curve in curves.values() for key in curve.columns if "/" in key}
    headlines = {method.name: method.headline[:4] for method in map(credit_method, credits or built_in_names())}
    logged_methods = {key.split("/")[0] for key in logged if key.endswith("/advantages_scale_ratio")}
    if unnamed := sorted(logged_methods - headlines.keys()):
        raise InputError(
            f"training metrics hold the statistics of credit method(s) {unnamed}, which no --credit-methods names "
            f"(named: {sorted(headlines)}); name each study method's credit (built-in name or import path)"
        )
    prefixes = sorted(headlines.keys() & {key.split("/")[0] for key in logged})
    headline = [f"{prefix}/{name}" for prefix in prefixes for name in headlines[prefix] if f"{prefix}/{name}" in logged]
    rest = sorted(key for key in logged if key.split("/")[0] in prefixes and key not in headline)
    return ["reward", *headline], rest


def training_curves_figure(
    curves: dict[RunKey, pd.DataFrame], keys: list[str] | None = None, window: int = SMOOTHING_WINDOW
) -> plt.Figure:
    """Reward first (wide), then one panel per other key (default: the headline ones of ``training_curve_keys``);
    one line per model/method (mean over seeds of the smoothed curves) with a band from the lowest to the highest
    seed."""
    keys = keys or training_curve_keys(curves)[0]
    columns = 3
    rows = 1 + math.ceil((len(keys) - 1) / columns)
    fig = plt.figure(figsize=(5 * columns, 3.4 * rows))
    grid = fig.add_gridspec(rows, columns)
    axes = [fig.add_subplot(grid[0, :])]
    axes += [fig.add_subplot(grid[1 + i // columns, i % columns]) for i in range(len(keys) - 1)]
    models = {run.model for run in curves}
    seeds = len({run.seed for run in curves})
    for axis, key in zip(axes, keys, strict=True):
        for (model, method), band in seed_bands(curves, key, window).items():
            label = method if len(models) == 1 else f"{model}/{method}"
            color = method_color(method)
            axis.plot(band.index, band["mean"], color=color, label=label)
            axis.fill_between(band.index, band["low"], band["high"], color=color, alpha=0.2, linewidth=0)
        # The smoothing is said once, on the wide reward panel: long titles overlap on the narrow panels.
        axis.set_title(key)
        axis.set_xlabel("step")
        if not axis.lines:
            axis.text(0.5, 0.5, "not logged", ha="center", va="center", transform=axis.transAxes)
    axes[0].set_title(f"reward (every panel: moving average of {window} logs, band: min-max over {seeds} seed(s))")
    if axes[0].lines:
        axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_training_curves(
    curves: dict[RunKey, pd.DataFrame], keys: tuple[list[str], list[str]], path: Path, diagnostics_path: Path
) -> None:
    """Write the headline training curves to ``path`` and the reward with every other diagnostic to
    ``diagnostics_path`` (PNGs); ``keys``: the two panel lists of ``training_curve_keys``."""
    headline, rest = keys
    _save_figure(training_curves_figure(curves, headline), path)
    _save_figure(training_curves_figure(curves, ["reward", *rest]), diagnostics_path)


def write_outputs(
    scores: pd.DataFrame,
    variance: pd.DataFrame,
    curves: dict[RunKey, pd.DataFrame],
    out_dir: Path,
    figures_dir: Path,
    credits: list[str] | None = None,
) -> None:
    """scores.csv, summary.{csv,md,xlsx} and variance.{csv,md} under ``out_dir``; the PNG figures under
    ``figures_dir`` (the training curves' credit methods: ``credits``, as in ``training_curve_keys``, checked before
    anything is written)."""
    keys = training_curve_keys(curves, credits)
    table = summary_table(scores)
    with atomic_path(out_dir / "scores.csv") as temporary:
        scores.to_csv(temporary, index=False)
    with atomic_path(out_dir / "variance.csv") as temporary:
        variance.to_csv(temporary, index=False)
    atomic_write_text(out_dir / "variance.md", VARIANCE_NOTE + "\n\n" + variance_markdown(variance))
    with atomic_path(out_dir / "summary.csv") as temporary:
        _flat_columns(table).to_csv(temporary, index=False)
    atomic_write_text(out_dir / "summary.md", summary_markdown(table))
    with atomic_path(out_dir / "summary.xlsx") as temporary, pd.ExcelWriter(temporary, engine="openpyxl") as excel:
        _flat_columns(table).to_excel(excel, sheet_name="summary", index=False)
        formatted_summary(table).to_excel(excel, sheet_name="formatted", index=False)
    plot_scores(table, figures_dir / SCORES_FIGURE)
    plot_training_curves(curves, keys, figures_dir / TRAINING_CURVES_FIGURE, figures_dir / TRAINING_DIAGNOSTICS_FIGURE)


def benchmark_item_ids(paths: list[str]) -> dict[str, list[str]]:
    """Benchmark name (the file's stem) -> its item ids."""
    return {Path(path).stem: [str(row.get("id")) for row in read_jsonl(path)] for path in paths}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", nargs="+", required=True, help="per-sample evaluation JSONL files")
    parser.add_argument("--train-metrics", nargs="*", default=[], help="training metrics.jsonl files")
    parser.add_argument("--out-dir", type=Path, required=True, help="directory for scores.csv and summary.*")
    parser.add_argument("--figures-dir", type=Path, required=True, help="directory for the PNG figures")
    parser.add_argument(
        "--credit-methods",
        nargs="+",
        help="the study's credit methods (its `credit` values: built-in names or import paths), whose statistics "
        "the training-curve figures show, headline ones first; default every built-in method",
    )
    parser.add_argument(
        "--benchmarks",
        nargs="*",
        default=[],
        help="the benchmark JSONL files (<name>.jsonl): a samples file of benchmark <name> must cover its items",
    )
    parser.add_argument(
        "--samples-per-item",
        type=int,
        help="the study's n_samples: every item of every samples file must hold this many (default: as many as the "
        "file's fullest item)",
    )
    args = parser.parse_args(argv)
    scores, counts = score_files(args.samples, benchmark_item_ids(args.benchmarks), args.samples_per_item)
    curves = load_training_curves(args.train_metrics)
    write_outputs(
        add_averages(scores), variance_table(counts), curves, args.out_dir, args.figures_dir, args.credit_methods
    )


if __name__ == "__main__":
    run_cli(main)
