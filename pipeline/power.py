"""Command: the planner. Can a study's design detect the effect it asks about, and what would it take?

    python -m pipeline.power --configfile configs/paper.yaml [--pilot RESULTS_DIR] [--methods A B] [--effect 0.036]

It prints, for the configured design and its alternatives (more seeds, more samples on the small benchmarks), the
power of the paper's test and of the seed-aware test, the smallest detectable effect and the GPU-hours each
costs (the bound; for the configured design also the expected GPU-hours of its calibration, ``--calibration``,
measured or not measured). The simulation, the variance model and its pilot estimates are
``pipeline.study.power_analysis``'s.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from pipeline.core.io import InputError, run_cli
from pipeline.study.calibration import CALIBRATION_FILE, load_calibration
from pipeline.study.cost import PlannedJob
from pipeline.study.load import load_study
from pipeline.study.pilot_variance import pilot_variance
from pipeline.study.plan import estimate, plan
from pipeline.study.power_analysis import (
    ALPHA,
    MAX_EFFECT,
    PAPER_EFFECT,
    TARGET_POWER,
    Assessment,
    Component,
    VarianceModel,
    alternatives,
    assess,
    compared_pair,
    configured_design,
    default_variance,
    design_gpu_hours,
)


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipeline.power", description=__doc__.splitlines()[0])
    parser.add_argument("--configfile", type=Path, required=True, help="the study config (configs/paper.yaml)")
    parser.add_argument("--pilot", type=Path, help="a finished study's results directory: measured components")
    parser.add_argument(
        "--methods", nargs=2, metavar=("A", "B"), help="the compared methods (default: grail grpo, else the first two)"
    )
    parser.add_argument("--effect", type=float, default=PAPER_EFFECT, help="the effect, a fraction (0.036)")
    parser.add_argument("--replications", type=int, default=2000, help="simulated studies per design")
    parser.add_argument("--seed-sd", type=float, help="override: seed sd of a run's accuracy, in points")
    parser.add_argument("--seed-correlation", type=float, help="override: a run's seed correlation across benchmarks")
    parser.add_argument("--seed", type=int, default=0, help="the simulation's seed")
    parser.add_argument("--no-cost", dest="cost", action="store_false", help="skip the plan and the GPU-hours")
    parser.add_argument(
        "--calibration", type=Path, help="python -m pipeline.calibrate's file (default: results_dir/calibration.json)"
    )
    return parser.parse_args(argv)


def variance_model(args: argparse.Namespace, compared: tuple[str, str]) -> VarianceModel:
    """The pilot's (for the ``compared`` methods) or the default components, with the command line's overrides."""
    variance = pilot_variance(args.pilot, compared) if args.pilot else default_variance()
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
    method_a, method_b = compared_pair(methods, args.methods)
    variance = variance_model(args, (method_a, method_b))
    jobs, study = None, None
    if args.cost:
        jobs, study = plan(None, args.configfile, []), load_study([args.configfile])
    print(
        f"{args.configfile}: {method_a} vs {method_b}, {configured.models} models x {len(configured.items)} "
        f"benchmarks ({', '.join(f'{name} {count}' for name, count in configured.items.items())} items), "
        f"{configured.seeds} seed(s), {next(iter(configured.samples.values()))} samples per item; "
        f"{args.replications} simulated studies per design"
    )
    fallbacks = variance.fallbacks()
    print(
        f"variance components (fallback to the default: {', '.join(fallbacks)}):"
        if fallbacks
        else "variance components:"
    )
    print("\n".join(variance.lines()))
    assessments = [
        assess(
            design,
            variance,
            args.effect,
            args.replications,
            args.seed,
            design_gpu_hours(jobs, configured, design, study) if jobs is not None else None,
        )
        for design in alternatives(configured)
    ]
    print()
    print("\n".join(table_lines(assessments, args.effect)))
    if jobs is not None:
        print(expected_line(args, jobs))


def expected_line(args: argparse.Namespace, jobs: list[PlannedJob]) -> str:
    """The configured design's expected GPU-hours beside its bound, and whether they are measured."""
    study = load_study([args.configfile])
    path = args.calibration or Path(study.results_dir) / CALIBRATION_FILE
    estimate_ = estimate(study, jobs, 1, load_calibration(path), path)
    expected = estimate_["expected"]
    statuses = ", ".join(f"{rule} {row['status']}" for rule, row in expected["rules"].items())
    hours = expected["gpu_hours"]
    return (
        f"configured design: GPU-h bound {estimate_['gpu_hours']:,.0f}; expected {hours['expected']:,.1f} "
        f"[{hours['low']:,.1f}-{hours['high']:,.1f}] over the measured jobs ({statuses}); {expected['source']}"
    )


if __name__ == "__main__":
    run_cli(main)
