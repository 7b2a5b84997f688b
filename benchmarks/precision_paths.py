"""A study's CPU time per rule and training step ratios under each precision and kernel path, side by side in one run.

    python benchmarks/precision_paths.py [--configfile FILE ...] [--until RULE] [--variants NAME ...] [--json PATH]

Each variant runs the study (by default the CI study, tests/pipeline/configs/ci.yaml, up to its training jobs) from
scratch in its own directory, one after another on the same machine:

    float32-pinned   the tiny model in float32 on the kernel pin (MKL's COMPATIBLE branch, torch and oneDNN at AVX2)
    float32-native   the tiny model in float32 on the machine's native kernels (kernel_pin: false)
    float64-native   the tiny model in float64 on the native kernels (docs/fidelity.md, "One kernel path")

It prints, per variant, the CPU seconds of each rule (the sum of its jobs' Snakemake ``benchmark:`` files) and the
median training step time of each method with its ratio to GRPO's (``step_time`` of the runs' metrics.jsonl), and
writes them with ``--json``. Run it on an idle machine for absolute numbers; under load the ratios are indicative.
``--configfile configs/default.yaml --until train`` measures the default study's training (about an hour for the
three variants on 2 cores).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CI_CONFIG = [REPO / "tests/pipeline/configs/ci.yaml"]
VARIANTS = {
    "float32-pinned": {"dtype": "float32", "kernel_pin": True},
    "float32-native": {"dtype": "float32", "kernel_pin": False},
    "float64-native": {"dtype": "float64", "kernel_pin": False},
}


def overlay(directory: Path, configfiles: list[Path], variant: dict) -> Path:
    """A config file that sets the variant's precision on every tiny model of the study and its kernel pin."""
    import yaml

    models: dict = {}
    for path in configfiles:
        models.update(yaml.safe_load(path.read_text()).get("models", {}))
    tiny = {name: {"warmup": {"dtype": variant["dtype"]}} for name, model in models.items() if "source" not in model}
    path = directory / "variant.yaml"
    path.write_text(yaml.safe_dump({"models": tiny, "kernel_pin": variant["kernel_pin"]}))
    return path


def run_variant(directory: Path, configfiles: list[Path], until: str, variant: dict, cores: int) -> float:
    """Run the study in ``directory`` under ``variant``; returns its wall seconds."""
    extra = overlay(directory, configfiles, variant)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    environment.pop("GRAIL_KERNEL_PIN", None)  # the study's kernel_pin decides
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(directory)]
    command += ["--cores", str(cores), "--configfile", *map(str, configfiles), str(extra), "--until", until]
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, env=environment)
    if result.returncode != 0:
        sys.exit(f"{directory.name}: the study failed:\n{result.stderr[-3000:]}")
    return time.monotonic() - started


def cpu_seconds_per_rule(directory: Path) -> dict[str, float]:
    """The ``cpu_time`` of every job's benchmark file, summed per rule (results/benchmarks/<rule>/...)."""
    totals: dict[str, float] = {}
    root = directory / "results" / "benchmarks"
    for path in sorted(root.rglob("*.tsv")):
        rule = path.relative_to(root).parts[0].removesuffix(".tsv")
        with path.open() as handle:
            for row in csv.DictReader(handle, delimiter="\t"):
                totals[rule] = totals.get(rule, 0.0) + float(row["cpu_time"])
    return totals


def step_times(directory: Path) -> dict[str, float]:
    """Median training step time (s) of each method, over its runs' logged steps."""
    per_method: dict[str, list[float]] = {}
    for path in sorted((directory / "results" / "runs").glob("*/*/*/metrics.jsonl")):
        method = path.parts[-3]
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if "step_time" in row:
                per_method.setdefault(method, []).append(row["step_time"])
    return {method: statistics.median(times) for method, times in per_method.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configfile", type=Path, nargs="+", default=CI_CONFIG, help="the study (default: CI study)")
    parser.add_argument("--until", default="train", help="run the study up to this rule (default: train)")
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="write {variant: {wall_s, cpu_s, steps, ratios}}")
    args = parser.parse_args(argv)
    configfiles = [path.resolve() for path in args.configfile]
    load = os.getloadavg()[0]
    report: dict = {"load_before": load, "configfiles": list(map(str, configfiles)), "until": args.until}
    with tempfile.TemporaryDirectory(prefix="precision-paths-") as scratch:
        for name in args.variants:
            directory = Path(scratch) / name
            directory.mkdir()
            wall = run_variant(directory, configfiles, args.until, VARIANTS[name], args.cores)
            cpu, steps = cpu_seconds_per_rule(directory), step_times(directory)
            ratios = {m: t / steps["grpo"] for m, t in steps.items() if m != "grpo"} if "grpo" in steps else {}
            report[name] = {"wall_s": wall, "cpu_s": cpu, "step_time_s": steps, "ratio_to_grpo": ratios}
            print(f"{name}: {wall:.0f} s wall, load {os.getloadavg()[0]:.1f}")
            print("  cpu s per rule: " + ", ".join(f"{rule} {seconds:.1f}" for rule, seconds in sorted(cpu.items())))
            print(
                "  step s (ratio to GRPO): "
                + ", ".join(f"{m} {t:.3f} ({ratios.get(m, 1):.2f})" for m, t in steps.items())
            )
    report["load_after"] = os.getloadavg()[0]
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
