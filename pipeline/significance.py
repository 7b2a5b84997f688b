"""Stage `significance`: Wilcoxon signed-rank tests between methods, paired bootstrap CIs per benchmark, seed-aware
comparisons between trained methods, Holm.

    python -m pipeline.significance --scores SCORES.csv --out OUT.json [--samples FILE...] [--markdown OUT.md]
                                    [--checkpoint final] [--metrics acc@3 pass@3] [--resamples 10000] [--seed 0]

The tests, their formulas and their output rows are ``pipeline.stats.paired_tests``'s; the Markdown summary's
words are ``pipeline.stats.wording``'s.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from pipeline.core.io import InputError, atomic_write_json, atomic_write_text, run_cli
from pipeline.core.layout import BASELINE_METHOD, FINAL_CHECKPOINT
from pipeline.stats.paired_tests import (
    add_holm,
    default_metrics,
    item_comparisons,
    read_runs,
    read_scores,
    wilcoxon_comparisons,
)
from pipeline.stats.seed_aware import seed_aware_rows
from pipeline.stats.wording import markdown_report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scores", type=Path, required=True, help="scores.csv of the aggregate stage")
    parser.add_argument("--out", type=Path, required=True, help="JSON list of test results")
    parser.add_argument("--samples", nargs="*", default=[], help="per-sample files for the paired bootstrap")
    parser.add_argument("--markdown", type=Path, help="optional Markdown summary")
    parser.add_argument("--checkpoint", default=FINAL_CHECKPOINT, help="checkpoint compared (default: final)")
    parser.add_argument("--metrics", nargs="+", help="metrics tested (default: acc@n and pass@n)")
    parser.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples")
    parser.add_argument("--confidence", type=float, default=0.95, help="bootstrap interval level")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    args = parser.parse_args(argv)
    if args.resamples < 1 or not 0 < args.confidence < 1:
        raise InputError("--resamples must be >= 1 and --confidence in (0, 1)")
    scores = read_scores(args.scores, args.checkpoint)
    metrics = args.metrics or default_metrics(scores)
    unknown = sorted(set(metrics) - set(scores["metric"]))
    if unknown:
        raise InputError(f"{args.scores}: no scores for metric(s) {', '.join(unknown)}")
    rows = wilcoxon_comparisons(scores, metrics)
    if args.samples:
        runs = read_runs(args.samples, args.checkpoint)
        rows += item_comparisons(runs, args.resamples, args.confidence, args.seed)
        trained = sorted({method for by_method in runs.values() for method in by_method} - {BASELINE_METHOD})
        pairs = list(itertools.combinations(trained, 2))
        rows += seed_aware_rows(runs, pairs, args.resamples, args.confidence, args.seed)
    add_holm(rows)
    atomic_write_json(args.out, rows)
    if args.markdown:
        atomic_write_text(args.markdown, markdown_report(rows, args.checkpoint))


if __name__ == "__main__":
    run_cli(main)
