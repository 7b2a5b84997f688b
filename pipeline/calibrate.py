"""Command: measure what a study's jobs cost on this hardware, so that the preflight, the planner and the report
can say what the study is expected to cost, not only what it may cost at the time limits.

    python -m pipeline.calibrate --configfile configs/paper.yaml [--out PATH] [--steps N] [--cores N]

Run it where the jobs run (on a cluster: inside an allocation of the training rule's shape). It first builds what
the measurements read (the training data, the benchmark files, the start models: the study's own rules, through
Snakemake with ``--cores``), then, with the study's settings and on the jobs' kernel path and thread count:

- training: per (model, method) whose cost settings differ (``pipeline.study.calibration.train_settings``), the
  real training job (``pipeline.launch`` -> ``pipeline.train``, the study's processes and engine) for
  ``calibration.train_steps`` steps (``--steps``) with a log line every step, into a scratch directory that is then
  removed. TRL's ``step_time`` of each step after the first gives the seconds a step (mean and standard deviation);
  the job's wall time less the steps at that mean is its fixed cost (process start, model load, the first step's
  warm-up, publishing); TRL's ``completions/mean_length`` the completions' length; the checkpoint saved at its
  last step, how long a save takes (``checkpoint_save_seconds``: with the step time, how long before the time
  limit the job's warning must come, ``pipeline.study.calibration.warning_lead``);
- evaluation: per model, one child process (``--evaluation-probe``) that loads the model and its backend as the
  evaluate stage does (the start model: the one that exists before training), then generates and grades the first
  batch of every benchmark. Its start-up is the time from the child's launch to a ready backend; each batch gives
  seconds per generated token and tokens per sequence.

Each measurement also records ``other_cores``: how many of this process's CPUs other processes kept busy meanwhile
(``cpu_competition``). A measurement is one job's worth of work, timed once; a batch that shares its CPUs with
something else runs slow, and the prediction with it (a SmolLM2 evaluation probe ran 47 s on a busy machine, 36-39 s
on an idle one), so ``calibrate`` says which measurements had company.

It writes the calibration (``{results_dir}/calibration.json``, or ``--out``) atomically: the measurements with the
settings each was made with, the hardware, the time, the code (commit) and config files. The prediction from it is
``pipeline.study.calibration``'s (docs/cluster.md, "Calibrating the cost").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from pipeline.core import kernels, layout
from pipeline.core.io import InputError, atomic_write_json, canonical_json, read_jsonl, run_cli
from pipeline.core.progress import progress
from pipeline.core.provenance import code_version, hardware
from pipeline.core.repo import REPO_DIR
from pipeline.study.calibration import CALIBRATION_FILE, evaluate_settings, spread, train_settings
from pipeline.study.config import Study
from pipeline.study.load import load_study

TRAIN_TIMEOUT_S = 6 * 3600
# Other processes' share of the measurement's CPUs above which calibrate warns (an idle machine: about 0.01)
COMPETITION_WARNING_CORES = 0.25


def start_model(study: Study, model: str) -> list[str]:
    """``--model ...`` of a model's starting point, as the Snakefile's rules pass it: the warmed-up or prepared
    model built in the study, else its hub id or path (with its revision)."""
    spec = study.models[model]
    if spec.warmup is not None:
        return ["--model", f"{study.results_dir}/{layout.START_MODEL}".format(model=model)]
    if spec.source is not None:
        return ["--model", f"{study.results_dir}/{layout.SOURCE_MODEL}".format(model=model)]
    return ["--model", spec.path] + (["--model-revision", spec.revision] if spec.revision else [])


def prerequisites(study: Study) -> list[str]:
    """The files the measurements read: the training data, every benchmark file, every start model built here."""
    built = [start_model(study, model)[1] for model in study.models if study.models[model].path is None]
    benchmarks = [f"{study.eval_data_dir}/{name}.jsonl" for name in study.benchmarks]
    return [f"{study.results_dir}/{layout.TRAIN_DATA}", *benchmarks, *built]


def build_prerequisites(study: Study, configfiles: list[Path], cores: int) -> None:
    """The prerequisites that do not exist yet, through the study's own rules (Snakemake)."""
    missing = [path for path in prerequisites(study) if not Path(path).exists()]
    if not missing:
        return
    command = [sys.executable, "-m", "snakemake", *missing, "--snakefile", str(REPO_DIR / "Snakefile")]
    command += ["--cores", str(cores), "--configfile", *map(str, configfiles)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise InputError(f"building the calibration's inputs failed ({shlex.join(command)}):\n{result.stderr[-3000:]}")


def job_environment(study: Study, rule: str, model: str) -> dict[str, str]:
    """This process's environment (the study's kernel path and run-time settings) with the job's thread count, as
    Snakemake gives a job of ``rule``."""
    threads = str(study.resources(rule, model).cpus)
    return {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}


def measure_training(study: Study, model: str, method: str, steps: int, scratch: Path) -> dict[str, Any]:
    """One short real training job of (model, method): seconds a step (mean, sd, each), fixed cost, lengths."""
    training = {**study.training_spec(model), "max_steps": steps, "logging_steps": 1}
    resources = study.resources("train", model)
    out = scratch / f"{model}-{method}"
    command = [sys.executable, "-m", "pipeline.launch", "--gpus", str(resources.gpus), "--nodes", str(resources.nodes)]
    command += ["--engine", study.training_engine, "--", "pipeline.train", *start_model(study, model)]
    command += [
        "--training-spec",
        canonical_json(training),
        "--method-spec",
        canonical_json(study.methods[method].spec),
    ]
    command += ["--data", f"{study.results_dir}/{layout.TRAIN_DATA}", "--seed", str(study.seeds[0]), "--out", str(out)]
    started = time.monotonic()
    result = subprocess.run(
        command, capture_output=True, text=True, env=job_environment(study, "train", model), timeout=TRAIN_TIMEOUT_S
    )
    wall = time.monotonic() - started
    if result.returncode != 0:
        raise InputError(f"the calibration's training of {model}/{method} failed:\n{result.stderr[-3000:]}")
    rows = [row for row in read_jsonl(out / layout.METRICS_FILE) if "step_time" in row]
    save_s = checkpoint_save_seconds(out / layout.CHECKPOINTS_DIR)
    shutil.rmtree(out, ignore_errors=True)
    if len(rows) < 2:
        raise InputError(f"{model}/{method}: the calibration run logged {len(rows)} steps with a step_time (need 2)")
    step_times = [float(row["step_time"]) for row in rows]
    step_s, step_sd_s = spread(step_times[1:])
    lengths = [float(row["completions/mean_length"]) for row in rows]
    return {
        "steps": len(step_times),
        "step_times_s": step_times,
        "step_s": step_s,
        "step_sd_s": step_sd_s,
        "wall_s": wall,
        "startup_s": max(wall - len(step_times) * step_s, 0.0),
        "completion_tokens": sum(lengths) / len(lengths),
        **({"save_s": save_s} if save_s is not None else {}),
    }


def checkpoint_save_seconds(checkpoints: Path) -> float | None:
    """How long the run's last checkpoint (the training stage saves one at its last step) took to write: from its
    first file to its last, by their modification times (transformers writes the model's config first and
    ``trainer_state.json`` last, the weights and DeepSpeed's or the optimizer's states between); None without one."""
    saved = [path for path in checkpoints.glob("checkpoint-*") if path.name.removeprefix("checkpoint-").isdigit()]
    if not saved:
        return None
    last = max(saved, key=lambda path: int(path.name.removeprefix("checkpoint-")))
    times = [path.stat().st_mtime for path in last.rglob("*") if path.is_file()]
    return max(times) - min(times) if times else None


def measure_evaluation(study: Study, model: str, scratch: Path) -> dict[str, Any]:
    """The evaluation probe of ``model`` in a child process of its own, so that its start-up is a job's: it is given
    what the evaluate stage is given (model, spec, benchmark files, seed), not the study to load."""
    out = scratch / f"evaluate-{model}.json"
    arguments = start_model(study, model)
    probe = {
        "model": arguments[1],
        "revision": arguments[3] if len(arguments) > 2 else None,
        "spec": study.evaluation.spec,
        "benchmarks": {name: f"{study.eval_data_dir}/{name}.jsonl" for name in study.benchmarks},
        "seed": study.seeds[0],
        "out": str(out),
        "launched_at": time.time(),
    }
    command = [sys.executable, "-m", "pipeline.calibrate", "--evaluation-probe", canonical_json(probe)]
    result = subprocess.run(command, capture_output=True, text=True, env=job_environment(study, "evaluate", model))
    if result.returncode != 0:
        raise InputError(f"the calibration's evaluation of {model} failed:\n{result.stderr[-3000:]}")
    return json.loads(out.read_text())


def evaluation_probe(probe: dict[str, Any]) -> None:
    """In the child: the backend loaded as the evaluate stage loads it, then the first batch of every benchmark;
    the start-up is the time from the parent's launch (``launched_at``) to a ready backend."""
    from pipeline.evaluation.backends import detect_backend, make_backend
    from pipeline.evaluation.eval_spec import parse_eval_spec
    from pipeline.evaluation.sampling import batches, generate_rows, load_benchmark, plan_units
    from pipeline.evaluation.vllm_backend import vllm_device_type
    from pipeline.models.loading import load_tokenizer, resolve_model
    from pipeline.tasks.generation import chat_prompt_ids
    from pipeline.tasks.prompts import build_prompt

    spec = parse_eval_spec(probe["spec"])
    backend_name = detect_backend(spec.backend)
    if backend_name == "vllm" and vllm_device_type() == "cpu":  # as the evaluate stage: vLLM's CPU kernels unpinned
        kernels.run_natively("pipeline.calibrate", sys.argv[1:], "vLLM's CPU kernels are built for this machine")
    path = resolve_model(probe["model"], probe["revision"])
    tokenizer = load_tokenizer(path)
    backend = make_backend(backend_name, path, tokenizer, spec, probe["seed"])
    startup = time.time() - probe["launched_at"]
    measured = {}
    try:
        for name, benchmark in probe["benchmarks"].items():
            items = load_benchmark(benchmark)
            batch = batches(plan_units(items, spec.n_samples, probe["seed"]), spec.batch_size)[0]
            prompts = {
                unit.item_index: chat_prompt_ids(
                    tokenizer, build_prompt(items[unit.item_index].problem, spec.prompt_template), spec.enable_thinking
                )
                for unit in batch
            }
            started = time.monotonic()
            rows = generate_rows(batch, items, prompts, backend, spec, backend_name)
            seconds = time.monotonic() - started
            tokens = sum(row["num_tokens"] for row in rows)
            measured[name] = {
                "sequences": len(rows),
                "tokens": tokens,
                "seconds": seconds,
                "seconds_per_token": seconds / max(tokens, 1),
                "tokens_per_sequence": tokens / len(rows),
            }
    finally:
        if hasattr(backend, "close"):
            backend.close()
    atomic_write_json(Path(probe["out"]), {"backend": backend_name, "startup_s": startup, "benchmarks": measured})


@dataclass(frozen=True)
class CpuCounters:
    """CPU time counters at one moment: the busy seconds of the CPUs this process may run on (every CPU state but
    idle, iowait and steal), and this process's own seconds with those of its waited-for children."""

    busy_s: float
    own_s: float
    at_s: float

    @classmethod
    def read(cls, cpus: frozenset[int]) -> CpuCounters:
        per_cpu = psutil.cpu_times(percpu=True)
        busy = sum(t.user + t.nice + t.system + t.irq + t.softirq for cpu, t in enumerate(per_cpu) if cpu in cpus)
        own = sum(
            usage.ru_utime + usage.ru_stime
            for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
        )
        return cls(busy, own, time.monotonic())


def other_cores(before: CpuCounters, after: CpuCounters) -> float:
    """Cores other processes kept busy between two readings: (busy seconds - own seconds) / wall seconds, at least 0.
    Own seconds count a child once it has been waited for, as every measurement's child has by its end."""
    wall = after.at_s - before.at_s
    foreign = (after.busy_s - before.busy_s) - (after.own_s - before.own_s)
    return max(0.0, foreign / wall) if wall > 0 else 0.0


@contextmanager
def cpu_competition(found: dict[str, float]) -> Iterator[None]:
    """Sets ``found["other_cores"]`` to ``other_cores`` over the block, on the CPUs this process may run on."""
    cpus = frozenset(os.sched_getaffinity(0))
    before = CpuCounters.read(cpus)
    yield
    found["other_cores"] = round(other_cores(before, CpuCounters.read(cpus)), 3)


def competition_warning(name: str, cores: float, cpus: int) -> str | None:
    """The warning for a measurement that shared its CPUs (``COMPETITION_WARNING_CORES``), else None."""
    if cores <= COMPETITION_WARNING_CORES:
        return None
    return (
        f"calibrate: while measuring {name}, other processes kept {cores:.2f} of its {cpus} CPUs busy: that "
        "measurement may run slow and the prediction high; calibrate again on an otherwise idle machine or allocation"
    )


def training_groups(study: Study) -> dict[str, list[tuple[str, str]]]:
    """(model, method) pairs grouped by what a step costs (``train_settings``): one measurement per group."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for model in study.models:
        for method in study.methods:
            groups.setdefault(train_settings(study, model, method), []).append((model, method))
    return groups


def calibrate(study: Study, configfiles: list[Path], steps: int, out: Path) -> dict[str, Any]:
    """Every measurement (module docstring), written to ``out``; returns the record."""
    groups = training_groups(study)
    record: dict[str, Any] = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "hardware": hardware(),
        "code": dataclasses.asdict(code_version()),
        "config_files": [str(path) for path in configfiles],
        "train_steps": steps,
        "train": {},
        "evaluate": {},
    }
    work = [("train", members) for members in groups.values()] + [("evaluate", model) for model in study.models]
    scratch = Path(tempfile.mkdtemp(prefix="calibration-", dir=study.results_dir))
    cpu_count = len(os.sched_getaffinity(0))
    try:
        with progress(desc="calibrate", unit="measurement", total=len(work)) as bar:
            for kind, what in work:
                name = f"train {'/'.join(what[0])}" if kind == "train" else f"evaluate {what}"
                bar.set_postfix_str(name)
                competition: dict[str, float] = {}
                with cpu_competition(competition):
                    if kind == "train":
                        measured = measure_training(study, *what[0], steps, scratch)
                    else:
                        measured = measure_evaluation(study, what, scratch)
                measured = {**measured, **competition}
                if kind == "train":
                    for model, method in what:
                        settings = train_settings(study, model, method)
                        record["train"][f"{model}/{method}"] = {**measured, "settings": settings}
                else:
                    record["evaluate"][what] = {**measured, "settings": evaluate_settings(study, what)}
                if warning := competition_warning(name, competition["other_cores"], cpu_count):
                    bar.write(warning, file=sys.stderr)
                bar.update(1)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    atomic_write_json(out, record)
    return record


def summary_lines(record: dict[str, Any]) -> list[str]:
    lines = []
    for key, row in record["train"].items():
        lines.append(
            f"train {key}: {row['step_s']:.3f} s a step (sd {row['step_sd_s']:.3f}, {row['steps'] - 1} steps after "
            f"the first), fixed {row['startup_s']:.1f} s, completions {row['completion_tokens']:.1f} tokens, "
            f"a checkpoint save {row.get('save_s', float('nan')):.1f} s; other processes {row['other_cores']:.2f} cores"
        )
    for model, row in record["evaluate"].items():
        rates = ", ".join(
            f"{name} {1000 * batch['seconds_per_token']:.2f} ms/token x {batch['tokens_per_sequence']:.1f} tokens"
            for name, batch in row["benchmarks"].items()
        )
        lines.append(
            f"evaluate {model} ({row['backend']}): start-up {row['startup_s']:.1f} s; {rates}; "
            f"other processes {row['other_cores']:.2f} cores"
        )
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipeline.calibrate", description=__doc__.splitlines()[0])
    parser.add_argument("--configfile", type=Path, nargs="+", help="the study's config files")
    parser.add_argument("--out", type=Path, help=f"the calibration file (default: results_dir/{CALIBRATION_FILE})")
    parser.add_argument(
        "--steps", type=int, help="training steps per (model, method) (default: calibration.train_steps)"
    )
    parser.add_argument("--cores", type=int, default=2, help="cores for building the inputs (Snakemake --cores)")
    # the child process of the evaluation measurement (measure_evaluation): what it measures, as JSON
    parser.add_argument("--evaluation-probe", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.configfile and not args.evaluation_probe:
        parser.error("the following arguments are required: --configfile")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.evaluation_probe:  # the kernel path and run-time settings come with the environment
        evaluation_probe(json.loads(args.evaluation_probe))
        return
    study = load_study(args.configfile)
    kernels.configure(study.kernel_pin)
    study.runtime.export()
    steps = args.steps or study.calibration.train_steps
    if steps < 2:
        raise InputError("--steps: at least 2 (the first step is warm-up)")
    out = args.out or Path(study.results_dir) / CALIBRATION_FILE
    build_prerequisites(study, args.configfile, args.cores)
    record = calibrate(study, args.configfile, steps, out)
    print("\n".join(summary_lines(record)))
    print(f"calibration written to {out}")


if __name__ == "__main__":
    run_cli(main)
