"""What a study is expected to cost, from a short measurement on the target hardware (``python -m pipeline.calibrate``).

The calibration (``{results_dir}/calibration.json``) holds, per (model, method), the seconds of a training step
(mean and spread over the measured steps) and the fixed cost of a training job (process start, model load, the
steps' warm-up, publishing), and per model the fixed cost of an evaluation job (process start, model load, engine
start) and, per benchmark, the seconds per generated token and the tokens per sequence of one evaluation batch.
Each measurement records the settings it was made with (``train_settings``, ``evaluate_settings``); a job whose
settings differ from its measurement's is "not measured".

The prediction of a job, in seconds, is a ``Range`` (low, expected, high):

- train: ``startup + S x t`` expected, ``startup + S x max(t - sd, 0)`` low and ``startup + S x (t + sd) x (1 + g) / 2``
  high, with S = max_steps, t and sd the mean and standard deviation of a step's seconds, and g the growth of the
  completions over the run (``growth_factor``): step time is taken proportional to completion length, and lengths
  grow linearly from the measured ones to g times them, so their mean over the run is (1 + g) / 2 times the measured;
- evaluate: ``startup + sum over the job's benchmarks of N_b x L_b x c_b`` expected and low (one batch measures no
  spread), with the generation term times g_b high for a trained checkpoint (its completions may have lengthened;
  the start model's were measured), N_b = items x n_samples, L_b the tokens per sequence and c_b the seconds per
  generated token. A job's benchmarks are its samples files: one under ``evaluation.job_per: benchmark``, all of its
  (run, checkpoint) under ``checkpoint``, which pay one start-up for all of them.

From the prediction: a proposed time limit per rule and model (``time_limit_minutes``: the longest high times the
study's ``calibration.time_limit_margin``) and the time windows a training job needs at a given limit
(``windows_needed``). From a training measurement's step and checkpoint-save seconds: how long before its time
limit the job's warning must come (``warning_lead``), which replaces the study's ``time_limit_warning_s``
(configs/paper.yaml: 600, the fallback for a job not measured; ``training_warning_lead``). A finished study's actual times against these
predictions: ``pipeline.study.actuals``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.io import InputError, canonical_json
from pipeline.core.layout import START_CHECKPOINT
from pipeline.study.config import Study
from pipeline.study.cost import EVALUATE_RULES

CALIBRATED_RULES = ("train", *EVALUATE_RULES)
# Under the study's results_dir (beside pipeline/core/layout.py's names, kept out of it: a change there reruns every
# training and evaluation, whose code digests cover that module)
CALIBRATION_FILE = "calibration.json"  # written by pipeline.calibrate; read by the preflight, the planner, the report
BENCHMARKS_DIR = "benchmarks"  # Snakemake's benchmark files: every job's actual wall time
NOT_MEASURED = "not measured"
# Slurm may send a --signal warning up to 60 s before the time it was asked for (sbatch(1): the resolution of its
# event handling), so a lead shorter than twice that could leave no step to finish; 65535 s is its largest.
WARNING_FLOOR_S = 120
SIGNAL_MAX_S = 65535
MEASURED = "measured"


@dataclass(frozen=True)
class Range:
    """Seconds (or hours): low, expected, high."""

    low: float
    expected: float
    high: float

    def __add__(self, other: Range) -> Range:
        return Range(self.low + other.low, self.expected + other.expected, self.high + other.high)

    def scaled(self, factor: float) -> Range:
        return Range(self.low * factor, self.expected * factor, self.high * factor)


ZERO = Range(0.0, 0.0, 0.0)


def growth_factor(length_growth: float, measured_tokens: float, max_tokens: int) -> float:
    """How much longer completions may get: ``min(length_growth, max_tokens / measured_tokens)``, at least 1 (no
    completion outgrows its token limit)."""
    if measured_tokens <= 0:
        return 1.0
    return max(1.0, min(length_growth, max_tokens / measured_tokens))


def train_seconds(startup_s: float, step_s: float, step_sd_s: float, steps: int, growth: float) -> Range:
    """A training job (module docstring): ``startup + S x max(t - sd, 0)``, ``startup + S x t``,
    ``startup + S x (t + sd) x (1 + g) / 2``."""
    return Range(
        startup_s + steps * max(step_s - step_sd_s, 0.0),
        startup_s + steps * step_s,
        startup_s + steps * (step_s + step_sd_s) * (1 + growth) / 2,
    )


def generation_seconds(sequences: int, tokens_per_sequence: float, seconds_per_token: float, growth: float) -> Range:
    """One benchmark's generation: ``N x L x c`` expected and low, times ``g`` high."""
    expected = sequences * tokens_per_sequence * seconds_per_token
    return Range(expected, expected, expected * growth)


def time_limit_minutes(high_s: float, margin: float) -> int:
    """A proposed time limit: ``ceil(high x margin / 60)`` minutes, at least 1."""
    return max(1, math.ceil(high_s * margin / 60))


def windows_needed(high_s: float, limit_min: float, warning_lead_s: float) -> int:
    """Time windows a job of ``high_s`` seconds needs at a limit of ``limit_min`` minutes whose warning comes
    ``warning_lead_s`` before its end (each window ends at the warning): ``ceil(high / (limit - lead))``."""
    usable = limit_min * 60 - warning_lead_s
    if usable <= 0:
        raise InputError(f"a time limit of {limit_min} min leaves no time before its {warning_lead_s:.0f} s warning")
    return max(1, math.ceil(high_s / usable))


def warning_lead_s(slurm_extra: str | None) -> float:
    """Seconds before the limit that Slurm's ``--signal=[B:]SIG@N`` warns (0 without one)."""
    match = re.search(r"--signal=\S*@(\d+)", slurm_extra or "")
    return float(match.group(1)) if match else 0.0


def spread(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation of ``values`` (sd 0 for a single value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((value - mean) ** 2 for value in values) / (len(values) - 1))


# ----------------------------------------------------------------------------------------- what a measurement is of


def train_settings(study: Study, model: str, method: str) -> str:
    """What a training step's cost depends on, as canonical JSON: the model, GRPOConfig's settings with the method's
    credit, and the job's processes (max_steps and the run-time settings left out: the prediction scales with the
    steps)."""
    training = {k: v for k, v in study.effective_training(model, method).items() if k != "max_steps"}
    resources = study.resources("train", model)
    return canonical_json(
        {
            "model": study.config["models"][model],
            "training": training,
            "method": study.methods[method].spec,
            "gpus": resources.gpus,
            "nodes": resources.nodes,
            "engine": study.training_engine,
        }
    )


def evaluate_settings(study: Study, model: str) -> str:
    """What an evaluation's cost depends on, as canonical JSON: the model, the evaluation spec and the job's GPUs."""
    resources = study.resources("evaluate", model)
    return canonical_json(
        {"model": study.config["models"][model], "evaluation": study.evaluation.spec, "gpus": resources.gpus}
    )


def check_calibration(record: Mapping[str, Any], path: Path) -> Mapping[str, Any]:
    """A calibration file's record, with the keys the prediction reads; InputError naming the file and key."""
    for key in ("train", "evaluate", "hardware", "measured_at"):
        if key not in record:
            raise InputError(f"{path}: not a calibration (python -m pipeline.calibrate): no key '{key}'")
    return record


# ----------------------------------------------------------------------------------------------------- prediction


@dataclass(frozen=True)
class Prediction:
    """One job's predicted seconds (None: not measured) and the GPUs it holds."""

    seconds: Range | None
    gpus: int


def measured_training(
    study: Study, calibration: Mapping[str, Any] | None, wildcards: Mapping[str, str]
) -> tuple[Mapping[str, Any], float] | None:
    """A training job's measurement and the growth of its completions over the run (``growth_factor``); None when
    its (model, method) was not measured as configured."""
    model, method = wildcards["model"], wildcards["method"]
    measured = (calibration or {}).get("train", {}).get(f"{model}/{method}")
    if measured is None or measured["settings"] != train_settings(study, model, method):
        return None
    training = study.effective_training(model, method)
    growth = growth_factor(
        study.calibration.length_growth, measured["completion_tokens"], int(training["max_completion_length"])
    )
    return measured, growth


def predict_train(study: Study, calibration: Mapping[str, Any] | None, wildcards: Mapping[str, str]) -> Range | None:
    """A training job's seconds (module docstring); None when its (model, method) was not measured as configured."""
    if (found := measured_training(study, calibration, wildcards)) is None:
        return None
    measured, growth = found
    steps = int(study.effective_training(wildcards["model"], wildcards["method"])["max_steps"])
    return train_seconds(measured["startup_s"], measured["step_s"], measured["step_sd_s"], steps, growth)


def warning_lead(study: Study, calibration: Mapping[str, Any] | None, wildcards: Mapping[str, str]) -> int | None:
    """Seconds before its time limit that a training job's warning (SIGUSR1) must come: the step under
    way when it lands runs to its end, then a checkpoint is saved, so ``margin x (the slowest step + the save)``
    (the slowest step ``(t + sd) x g``, as the high prediction's last steps; the margin ``calibration.
    time_limit_margin``), at least ``WARNING_FLOOR_S``. None when the job was not measured as configured, or by a
    calibration without the save's time: the study's ``time_limit_warning_s`` stands."""
    found = measured_training(study, calibration, wildcards)
    if found is None or "save_s" not in found[0]:
        return None
    measured, growth = found
    slowest_step = (measured["step_s"] + measured["step_sd_s"]) * growth
    lead = math.ceil(study.calibration.time_limit_margin * (slowest_step + measured["save_s"]))
    return min(max(lead, WARNING_FLOOR_S), SIGNAL_MAX_S)


def training_warning_lead(study: Study, calibration: Mapping[str, Any] | None, wildcards: Mapping[str, str]) -> int:
    """Seconds before its time limit that a training job is warned (the launcher's ``--time-limit-warning``): the
    calibrated ``warning_lead`` where the run was measured, else the study's ``time_limit_warning_s``; 0 (no
    warning) when the study asks for none."""
    asked = study.resources("train", wildcards["model"]).time_limit_warning_s
    if not asked:
        return 0
    return warning_lead(study, calibration, wildcards) or asked


def predict_evaluate(
    study: Study,
    calibration: Mapping[str, Any] | None,
    wildcards: Mapping[str, str],
    benchmarks: Sequence[str],
    items: Mapping[str, int | None],
) -> Range | None:
    """An evaluation job's seconds on its ``benchmarks`` (module docstring); None when its model, or a benchmark, was
    not measured as configured or a benchmark's item count is unknown."""
    measured = (calibration or {}).get("evaluate", {}).get(wildcards["model"])
    if measured is None or measured["settings"] != evaluate_settings(study, wildcards["model"]):
        return None
    spec = study.evaluation.spec
    total = Range(measured["startup_s"], measured["startup_s"], measured["startup_s"])
    for benchmark in benchmarks:
        batch = measured["benchmarks"].get(benchmark)
        if batch is None or items.get(benchmark) is None:
            return None
        growth = 1.0
        if wildcards["checkpoint"] != START_CHECKPOINT:
            growth = growth_factor(
                study.calibration.length_growth, batch["tokens_per_sequence"], spec["max_new_tokens"]
            )
        sequences = items[benchmark] * spec["n_samples"]
        total += generation_seconds(sequences, batch["tokens_per_sequence"], batch["seconds_per_token"], growth)
    return total


def predict_job(
    study: Study,
    calibration: Mapping[str, Any] | None,
    rule: str,
    wildcards: Mapping[str, str],
    benchmarks: Sequence[str],
    items: Mapping[str, int | None],
) -> Range | None:
    """A job's predicted seconds (an evaluate job's on its ``benchmarks``: one per samples file); None for a rule the
    calibration does not cover or a job it did not measure."""
    if rule == "train":
        return predict_train(study, calibration, wildcards)
    if rule in EVALUATE_RULES:
        return predict_evaluate(study, calibration, wildcards, benchmarks, items)
    return None


@dataclass(frozen=True)
class RulePrediction:
    """One rule's jobs summed: how many were measured, job-hours and GPU-hours (low, expected, high) over the
    measured jobs, and per model the proposed time limit (minutes) and the longest high prediction (seconds)."""

    jobs: int
    measured_jobs: int
    hours: Range
    gpu_hours: Range
    proposed_limit_min: dict[str, int]
    longest_high_s: dict[str, float]

    @property
    def status(self) -> str:
        if self.measured_jobs == 0:
            return NOT_MEASURED
        if self.measured_jobs < self.jobs:
            return f"partly measured ({self.measured_jobs} of {self.jobs} jobs)"
        return MEASURED

    def record(self) -> dict[str, Any]:
        """The JSON form (preflight --json)."""
        return {
            "status": self.status,
            "jobs": self.jobs,
            "measured_jobs": self.measured_jobs,
            "hours": vars(self.hours),
            "gpu_hours": vars(self.gpu_hours),
            "proposed_limit_min": self.proposed_limit_min,
        }


def summarize(
    predicted: Iterable[tuple[str, Mapping[str, str], int, Range | None]], margin: float
) -> dict[str, RulePrediction]:
    """Per calibrated rule, from (rule, wildcards, GPUs of the job, predicted seconds or None) of every job:
    job-hours = sum of seconds / 3600, GPU-hours = sum of GPUs x seconds / 3600 (measured jobs only), and the
    proposed limit per model (``time_limit_minutes`` of its longest high)."""
    rows: dict[str, dict[str, Any]] = {}
    for rule, wildcards, gpus, seconds in predicted:
        if rule not in CALIBRATED_RULES:
            continue
        row = rows.setdefault(rule, {"jobs": 0, "measured": 0, "hours": ZERO, "gpu_hours": ZERO, "longest": {}})
        row["jobs"] += 1
        if seconds is None:
            continue
        row["measured"] += 1
        row["hours"] += seconds.scaled(1 / 3600)
        row["gpu_hours"] += seconds.scaled(gpus / 3600)
        model = wildcards.get("model", "")
        row["longest"][model] = max(row["longest"].get(model, 0.0), seconds.high)
    return {
        rule: RulePrediction(
            jobs=row["jobs"],
            measured_jobs=row["measured"],
            hours=row["hours"],
            gpu_hours=row["gpu_hours"],
            proposed_limit_min={m: time_limit_minutes(high, margin) for m, high in row["longest"].items()},
            longest_high_s=row["longest"],
        )
        for rule, row in rows.items()
    }


# ----------------------------------------------------------------------------------------------------- the actuals


def load_calibration(path: Path) -> dict[str, Any] | None:
    """The calibration record at ``path``; None when there is none; InputError naming a file that is not one."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise InputError(f"{path}: not JSON ({error}); rerun python -m pipeline.calibrate") from error
    return dict(check_calibration(record, path))


def calibration_source(calibration: Mapping[str, Any] | None, path: Path) -> str:
    """One line saying where the expected figures come from."""
    if calibration is None:
        return f"{NOT_MEASURED}: no calibration at {path} (python -m pipeline.calibrate --configfile CONFIG)"
    hardware = calibration["hardware"]
    where = f"{hardware['cpu']}, {hardware['cpus']} CPUs" + (
        f", GPUs {', '.join(hardware['gpus'])}" if hardware["gpus"] else ""
    )
    return f"{MEASURED}: {path}, {calibration['measured_at']} on {where}"
