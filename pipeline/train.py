"""Stage: one (model, method, seed) GRPO / GRAIL / OAR-G training run, resumable and preemption-safe.

    python -m pipeline.train --model PATH_OR_HUB_ID [--model-revision REV] --training-spec SPEC
        --method-spec SPEC --data train.jsonl --seed S --out RUN_DIR [--export-steps N ...]

The two specs are merged (METHOD_SPEC wins) into a ``GrailGRPOConfig``; besides its fields they may hold the
model-loading options ``dtype``, ``trust_remote_code`` (default false) and ``attn_implementation``.

Run layout: working files in ``RUN_DIR/checkpoints/``: ``checkpoint-<step>/`` (resume), ``metrics.jsonl`` (one line
per log, appended as training goes) and ``exports/step-<N>/`` (model + tokenizer of each export step); the outputs,
published when the run completes: ``RUN_DIR/exports/step-<N>/`` (hardlinks to the working exports),
``RUN_DIR/final/``, ``RUN_DIR/provenance.json`` (library versions, pipeline.core.provenance) and ``RUN_DIR/metrics.jsonl``
(a copy of the working log). The working files are not Snakemake
outputs, so they survive the deletion of a failed job's outputs and a resumed run loses no step and no export. With
the run-time setting ``checkpoint_volume`` (a Kubernetes pod's PersistentVolumeClaim) they live at the run
directory's path under that volume instead (pipeline.core.layout.working_dir), so that the retry of an evicted pod
resumes.

Resume: a rerun finds the newest valid checkpoint in ``RUN_DIR/checkpoints`` (partial or corrupt ones are skipped
with a warning) and continues from it with the model, optimizer, scheduler, RNG states, data position, TRL's
micro-step counter and generation buffer restored, so an interrupted run follows the uninterrupted one. Only state
made by this run's settings is resumed (pipeline.training.run_state): working files whose fingerprint (specs, seed, data and
start model by content, process count, code, libraries with ``--fingerprint-libraries``) differs are set aside to
``RUN_DIR/set_aside/<time>/`` (``--stale-checkpoints delete``: deleted), named in the log, and training starts from
scratch. A larger ``max_steps`` continues a finished run only under a constant learning-rate schedule (docs/reruns.md).

One writer: ``RUN_DIR/train.lock`` is held while the run trains; a second writer exits 2 naming the holder.

Exit status: 0 done; 2 bad input; ``PREEMPTED_EXIT_CODE`` (75, EX_TEMPFAIL) after SIGTERM or SIGUSR1 (Slurm's
``--signal=USR1@<seconds>`` time-limit warning, or ``B:USR1`` forwarded by a batch script): the run saved a
checkpoint at the end of the current step and stopped, or, when the signal came before the first step (imports,
model loading), stopped at once with nothing to save; rerun or requeue it to resume. ``NONFINITE_EXIT_CODE`` (70,
EX_SOFTWARE): a non-finite loss, gradient norm or weight (pipeline.training.nan_guard) stopped the run before the optimizer
step or the save; the log names the step, the rank and the last finite checkpoint; a plain rerun would diverge again.
``SAVE_FAILED_EXIT_CODE`` (73, EX_CANTCREAT): a checkpoint did not fit on the disk (checked before each save) or its
write failed; the log names the path, the space needed or the error, and the space free; the staging directory is
removed, and a rerun once there is space resumes from the last complete checkpoint; the same status when the final
model or an export does not fit (pipeline.core.disk_full). ``STALL_EXIT_CODE`` (79): the
stall watchdog (pipeline.runtime.watchdog; its bounds are run-time settings, pipeline.runtime.settings) saw a step, or the gap after one, make no progress within its
bound; the log names the rank and the step and holds every thread's stack; a rerun resumes from the last checkpoint.
``COLLAPSE_EXIT_CODE`` (80): the training health check (pipeline.runtime.health, its thresholds the run-time settings'
``health``) found the run collapsed at a logged step: reward, entropy and gradient norm flat for ``flat_window``
logged steps, or the weights' L2 norm at ``weight_growth`` times the start model's; the log names the step, what
tripped and the last healthy checkpoint, and the checkpoints (and working exports) saved after the last healthy step
are set aside (``--stale-checkpoints delete``: deleted), so that no rerun resumes into the collapse; a plain rerun
resumes from the last healthy checkpoint and collapses again (a final status, as 70).
"""

# The preemption handlers are installed before the slow third-party imports (see STARTUP_SIGNALS), hence E402.
# ruff: noqa: E402

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pipeline.core.io import InputError, load_spec
from pipeline.core.specs import stage_spec
from pipeline.runtime.preemption import PreemptionSignals
from pipeline.training.tracking import TrackingConfig, environment, load_tracking, tensorboard_environment, wandb_run

# Run as a stage, record the signals before importing torch, transformers and TRL (seconds): Slurm's warning
# arriving meanwhile would otherwise kill the job (status 138) instead of stopping it (status 75).
STARTUP_SIGNALS = PreemptionSignals().install() if __name__ == "__main__" else None


def _hide_unimported(module: str) -> bool:
    """``sys.modules[module] = None`` unless it is imported already: ``importlib.util.find_spec(module)``, which the
    libraries' availability checks ask, then answers None; True when hidden."""
    if module in sys.modules:
        return False
    sys.modules[module] = None
    return True


def hide_vllm_unless_used(argv: list[str]) -> bool:
    """Hide an installed vLLM from a run whose specs do not turn ``use_vllm`` on; True when hidden.

    TRL imports vLLM whenever it is installed (``trl.generation.vllm_generation``), about 40 % of this stage's
    start-up CPU time, paid by every training job on a machine with vLLM; TRL's ``is_vllm_available`` asks
    ``find_spec``. A spec that cannot be read here is left, with vLLM visible, to the stage's own validation (which
    names the problem)."""
    spec = stage_spec(argv)
    return spec is not None and not spec.get("use_vllm") and _hide_unimported("vllm")


def hide_wandb_unless_reported(argv: list[str]) -> bool:
    """Hide an installed Weights & Biases from a run whose ``--tracking`` does not report to it; True when hidden.

    TRL imports wandb whenever it is installed (``trl.extras.profiling``, ``trl.trainer.grpo_trainer``), about 0.9 s
    of this stage's start-up CPU time, and each of its uses asks for ``"wandb"`` in ``report_to`` first. Hidden as
    vLLM is (``hide_vllm_unless_used``); a ``--tracking`` that cannot be read leaves it visible, to the stage's own
    validation."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--tracking", default="{}")
    known, _ = parser.parse_known_args(argv)
    try:
        reported = load_tracking(known.tracking).integrations()
    except InputError:
        return False
    return "wandb" not in reported and _hide_unimported("wandb")


if __name__ == "__main__":
    hide_vllm_unless_used(sys.argv[1:])
    hide_wandb_unless_reported(sys.argv[1:])

import torch
from datasets import Dataset
from transformers import ProgressCallback

from pipeline.core import gpu_determinism, kernels
from pipeline.core.exit_codes import (
    COLLAPSE_EXIT_CODE,
    NONFINITE_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    SAVE_FAILED_EXIT_CODE,
)
from pipeline.core.file_digest import file_digest, model_identity
from pipeline.core.io import read_jsonl, run_cli
from pipeline.core.layout import (
    EXPORTS_DIR,
    FINAL_CHECKPOINT,
    METRICS_FILE,
    PROVENANCE_FILE,
    working_dir,
    working_exports_dir,
    working_metrics_path,
)
from pipeline.core.provenance import library_versions
from pipeline.core.source_digest import module_digests
from pipeline.credit.method import credit_module
from pipeline.models.loading import check_model_reference, load_model, load_tokenizer, model_hub_records
from pipeline.runtime.disk_space import CheckpointSaveError
from pipeline.runtime.settings import RUNTIME_TRAINING_KEYS, RUNTIME_VARIABLE, RuntimeSettings
from pipeline.tasks.rewards import trl_reward_function
from pipeline.training.collapse_guard import TrainingCollapse
from pipeline.training.grpo_config import GrailGRPOConfig, merge_specs, split_options
from pipeline.training.nan_guard import NonFiniteTraining
from pipeline.training.publish import publish_outputs
from pipeline.training.resume import (
    ExportAndPreemptionCallback,
    MetricsCallback,
    ResumableGRPOTrainer,
    StallWatchdogCallback,
    StepProgressCallback,
    keep_metrics_up_to,
    newest_valid_checkpoint,
)
from pipeline.training.run_state import (
    STALE_CHECKPOINT_ACTIONS,
    continuable,
    fingerprint_components,
    fingerprint_record,
    prepare_working_dir,
    run_lock,
    set_aside_after,
)

logger = logging.getLogger("pipeline.train")

ROW_FIELDS = {"id": str, "prompt": list, "solution": str, "source": str}


# ----------------------------------------------------------------------------------------------- configuration


def runs_deepspeed(env: Mapping[str, str]) -> bool:
    """Whether this process was started under DeepSpeed (``accelerate launch`` with a DeepSpeed config sets
    ``ACCELERATE_USE_DEEPSPEED=true`` for every process)."""
    return env.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"


def process_group_options(env: Mapping[str, str], cuda: bool) -> dict[str, str]:
    """``ddp_backend: gloo`` for DeepSpeed on CPU processes, else nothing. Unnamed, accelerate's PartialState
    counts one process on a machine without CUDA while DeepSpeed's engine counts them all, and the engine refuses
    the batch the Trainer sized for one (docs/cluster.md)."""
    return {"ddp_backend": "gloo"} if runs_deepspeed(env) and not cuda else {}


def free_port() -> int:
    """A TCP port the operating system reports free on this machine (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def single_process_rendezvous(env: Mapping[str, str], pick_port: Callable[[], int] = free_port) -> dict[str, str]:
    """``MASTER_PORT`` for a run that no launcher started (no ``WORLD_SIZE``) and that names none, else nothing.
    TRL's colocated vLLM opens a one-process group even then, on the first of a few fixed ports it finds free
    (trl/trainer/utils.py ``_find_free_port``: 29500, 23456, ...): two such runs starting together on one machine
    (Snakemake's `--cores 2`, a node shared by two jobs) both pick 29500 and one dies with EADDRINUSE. A port the
    operating system chose is another for each run."""
    if "WORLD_SIZE" in env or env.get("MASTER_PORT"):
        return {}
    return {"MASTER_PORT": str(pick_port())}


def build_config(
    config_options: dict[str, Any],
    run_dir: Path,
    seed: int,
    tracking: TrackingConfig,
    run_name: str,
    runtime: RuntimeSettings,
) -> GrailGRPOConfig:
    """The trainer config: the spec options plus what this stage fixes (paths, seed, full checkpoints, non-finite
    losses kept in the loss the NaN guard checks), the run-time ``ddp_timeout`` when one is set, and, for DeepSpeed
    on CPU processes, the gloo backend unless the spec names one."""
    for key in RUNTIME_TRAINING_KEYS:
        if key in config_options:
            raise InputError(f"training/method spec: {key} is a run-time setting ({RUNTIME_VARIABLE}), not a spec key")
    collective = {} if runtime.ddp_timeout is None else {"ddp_timeout": runtime.ddp_timeout}
    try:
        return GrailGRPOConfig(
            **{**process_group_options(os.environ, torch.cuda.is_available()), **config_options, **collective},
            output_dir=str(working_dir(run_dir, runtime.checkpoint_volume)),
            seed=seed,
            report_to=tracking.integrations(),
            run_name=run_name,
            save_strategy="steps",
            save_only_model=False,
            logging_nan_inf_filter=False,
        )
    except (TypeError, ValueError) as error:
        raise InputError(f"training/method spec: {error}") from None


# ----------------------------------------------------------------------------------------------- inputs


def check_row(row: dict[str, Any], where: str) -> None:
    """Training-row schema of ARCHITECTURE.md: id, prompt (user messages), solution (non-blank), source."""
    for field, kind in ROW_FIELDS.items():
        if field not in row:
            raise InputError(f"{where}: field '{field}' missing")
        if not isinstance(row[field], kind):
            raise InputError(f"{where}: field '{field}' must be a {kind.__name__}, got {type(row[field]).__name__}")
    if not row["solution"].strip():
        # No completion can match an empty gold: the row could never earn a reward.
        raise InputError(
            f"{where}: field 'solution' is empty (prepare_data skips such rows: this file is not its output)"
        )
    messages = row["prompt"]
    if not messages or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages
    ):
        raise InputError(f"{where}: field 'prompt' must be a non-empty list of {{role, content}} string messages")


def load_training_rows(path: Path) -> Dataset:
    """The training JSONL as a ``datasets.Dataset``; a malformed row raises InputError naming file and line."""
    rows = read_jsonl(path)
    lines = path.read_text(encoding="utf-8").split("\n")
    line_numbers = [number for number, line in enumerate(lines, start=1) if line.strip()]
    for row, number in zip(rows, line_numbers, strict=True):
        check_row(row, f"{path}:{number}")
    if not rows:
        raise InputError(f"{path}: no training rows")
    return Dataset.from_list(rows)


# ----------------------------------------------------------------------------------------------- stage


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipeline.train", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="local model directory or hub id")
    parser.add_argument("--model-revision", default=None, help="hub revision (branch, tag or commit)")
    parser.add_argument("--training-spec", required=True, help="GRPOConfig fields: inline JSON or a JSON/YAML file")
    parser.add_argument("--method-spec", required=True, help="GrailGRPOConfig fields (win over the training spec)")
    parser.add_argument("--data", required=True, type=Path, help="training rows (JSONL)")
    parser.add_argument("--seed", required=True, type=int)
    parser.add_argument("--out", required=True, type=Path, help="run directory")
    parser.add_argument("--export-steps", nargs="*", type=int, default=[], help="steps whose model to export")
    parser.add_argument("--tracking", default="{}", help="TrackingConfig fields (report_to, project, study): JSON")
    parser.add_argument("--run-name", help="the run's name in the trackers (default: the last 3 parts of --out)")
    parser.add_argument("--tracking-dir", type=Path, help="tracker files (default: RUN_DIR/tracking)")
    parser.add_argument(
        "--stale-checkpoints",
        choices=STALE_CHECKPOINT_ACTIONS,
        default="set_aside",
        help="what to do with working files made under other settings (default: move them to RUN_DIR/set_aside)",
    )
    parser.add_argument(
        "--fingerprint-libraries",
        action="store_true",
        help="the library versions are part of the run's fingerprint (config library_changes: rerun)",
    )
    args = parser.parse_args(argv)
    args.run_name = args.run_name or "/".join(args.out.resolve().parts[-3:])
    args.tracking_dir = args.tracking_dir or args.out / "tracking"
    return args


def check_export_steps(steps: list[int], max_steps: int) -> frozenset[int]:
    """Export steps must lie in 1..max_steps (a run with max_steps <= 0 has no known end: any positive step)."""
    for step in steps:
        if step < 1 or (max_steps > 0 and step > max_steps):
            raise InputError(f"--export-steps: step {step} is outside 1..max_steps ({max_steps})")
    return frozenset(steps)


def stop_before_training(received: str) -> None:
    """Exit with ``PREEMPTED_EXIT_CODE`` for a signal that came before the first step: nothing to checkpoint."""
    logger.warning("received %s before the first training step: stopping without a checkpoint", received)
    raise SystemExit(PREEMPTED_EXIT_CODE)


def run_fingerprint(args: argparse.Namespace, merged: dict[str, Any], config: GrailGRPOConfig) -> dict[str, Any]:
    """The fingerprint record of this run (pipeline.training.run_state): what decides its trajectory."""
    schedule = {
        "lr_scheduler_type": getattr(config.lr_scheduler_type, "value", config.lr_scheduler_type),
        "warmup_ratio": getattr(config, "warmup_ratio", None),
        **{key: getattr(config, key) for key in ("warmup_steps", "save_steps", "logging_steps")},
    }
    components = fingerprint_components(
        merged,
        continues=continuable(schedule),
        seed=args.seed,
        processes=int(os.environ.get("WORLD_SIZE", "1")),  # set by the launcher for every process of a run
        deepspeed=runs_deepspeed(os.environ),  # its checkpoints (sharded optimizer) do not resume under DDP
        data_digest=file_digest(args.data),
        model=model_identity(args.model, args.model_revision),
        code=module_digests("pipeline.train", "pipeline.launch", credit_module(config.credit)),
        libraries=library_versions() if args.fingerprint_libraries else None,
        kernel_path=kernels.kernel_path(),
        gpu_determinism=gpu_determinism.requested(),
    )
    return fingerprint_record(components)


def build_trainer(
    args: argparse.Namespace, signals: PreemptionSignals, tracking: TrackingConfig, stall: StallWatchdogCallback
) -> tuple[ResumableGRPOTrainer, ExportAndPreemptionCallback]:
    """Validate every input (specs, export steps, rows, tokenizer, model) and assemble the trainer."""
    specs = {}
    for name, text in (("training spec", args.training_spec), ("method spec", args.method_spec)):
        try:
            specs[name] = load_spec(text)
        except InputError as error:
            raise InputError(f"{name}: {error}") from None
    merged, origin = merge_specs(specs["training spec"], specs["method spec"])
    config_options, loading_options = split_options(merged, origin)
    runtime = RuntimeSettings.current()
    volume = runtime.checkpoint_volume
    config = build_config(config_options, args.out, args.seed, tracking, args.run_name, runtime)
    export_steps = check_export_steps(args.export_steps, config.max_steps)
    dataset = load_training_rows(args.data)
    check_model_reference(args.model)
    tokenizer = load_tokenizer(
        args.model, revision=args.model_revision, trust_remote_code=loading_options.get("trust_remote_code", False)
    )
    model = load_model(args.model, revision=args.model_revision, **loading_options)
    control = ExportAndPreemptionCallback(export_steps, signals)
    with environment(tensorboard_environment(tracking, args.run_name, args.tracking_dir)):
        trainer = ResumableGRPOTrainer(
            model=model,
            reward_funcs=[trl_reward_function(config.reward_grading)],
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[MetricsCallback(working_metrics_path(args.out, volume)), control, stall],
            export_steps=export_steps,
            exports_dir=working_exports_dir(args.out, volume),
            run_fingerprint=run_fingerprint(args, merged, config),
            health=runtime.health,
        )
    control.accelerator = trainer.accelerator
    if trainer.pop_callback(ProgressCallback) is not None:  # absent with disable_tqdm
        trainer.add_callback(StepProgressCallback())
    return trainer, control


def main(argv: list[str] | None = None) -> None:
    # Preemption signals are recorded from here on (from before the imports when run as a stage), never fatal.
    signals = STARTUP_SIGNALS if STARTUP_SIGNALS is not None else PreemptionSignals().install()
    try:
        train_run(parse_args(argv), signals)
    finally:
        if signals is not STARTUP_SIGNALS:  # called in-process: give the caller its handlers back
            signals.restore()
    if signals is STARTUP_SIGNALS:  # the run is complete and published: only the interpreter's shutdown is left
        signals.ignore_from_now()


def train_run(args: argparse.Namespace, signals: PreemptionSignals) -> None:
    """Train (or resume) the run; stop with ``PREEMPTED_EXIT_CODE`` at the first step boundary after a signal."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if signals.received is not None:  # during the imports: stop before the slow validation and loading
        stop_before_training(signals.received_name())
    tracking = load_tracking(args.tracking)
    stall = StallWatchdogCallback(RuntimeSettings.current().watchdog)
    gpu_determinism.apply()  # before the model, the process group and a colocated vLLM engine start
    os.environ.update(single_process_rendezvous(os.environ))
    trainer, control = build_trainer(args, signals, tracking, stall)
    if control.stop_requested():  # during validation or model loading
        stop_before_training(signals.received_name())
    # The first process of a run holds its lock while anything in the run directory changes (bad input is refused
    # before: it leaves no trace there); the launcher stops the other processes when it exits.
    lock = run_lock(args.out) if os.environ.get("RANK", "0") == "0" else contextlib.nullcontext()
    with lock, wandb_run(tracking, args.run_name, args.tracking_dir, trainer.accelerator.is_main_process):
        try:
            train_and_publish(args, trainer, control)
        except NonFiniteTraining as error:
            logger.error("non-finite training: %s", error)
            raise SystemExit(NONFINITE_EXIT_CODE) from None
        except TrainingCollapse as error:
            logger.error("collapsed training: %s", collapse_message(args, trainer, error))
            raise SystemExit(COLLAPSE_EXIT_CODE) from None
        except CheckpointSaveError as error:
            logger.error("checkpoint not saved: %s", error)
            raise SystemExit(SAVE_FAILED_EXIT_CODE) from None
        finally:
            stall.watchdog.stop()  # also when training raised (an in-process caller lives on)


def collapse_message(args: argparse.Namespace, trainer: ResumableGRPOTrainer, error: TrainingCollapse) -> str:
    """Set aside the checkpoints saved after the last healthy step (main process; every process waits), then the
    log line: the step, the rank, what tripped, the last healthy checkpoint and where the collapsed ones went."""
    checkpoints_dir = working_dir(args.out, RuntimeSettings.current().checkpoint_volume)
    healthy_step = min((trip.healthy_through for trip in error.trips), default=None)
    moved: list[str] = []
    where = None
    if trainer.accelerator.is_main_process and healthy_step is not None:
        reasons = [f"collapsed training: {error}"]
        details = {"health": [trip.record() for trip in error.trips], "healthy_through": healthy_step}
        moved, where = set_aside_after(checkpoints_dir, healthy_step, reasons, details, args.stale_checkpoints)
    trainer.accelerator.wait_for_everyone()
    newest = newest_valid_checkpoint(checkpoints_dir)
    if healthy_step is not None and newest is not None and newest[0] > healthy_step:
        newest = None  # only another process tripped: the main process set nothing aside
    last = newest[1] if newest else "none (a rerun starts from scratch)"
    gone = ""
    if moved:
        gone = f"; made after step {healthy_step}, {', '.join(moved)} " + (
            f"set aside to {where}" if where else "deleted (--stale-checkpoints delete)"
        )
    return f"rank {trainer.accelerator.process_index}: {error}; training stopped. Last healthy checkpoint: {last}{gone}"


def train_and_publish(
    args: argparse.Namespace, trainer: ResumableGRPOTrainer, control: ExportAndPreemptionCallback
) -> None:
    """Resume from the newest valid checkpoint (or start), train to max_steps, publish the outputs."""
    run_dir: Path = args.out
    volume = RuntimeSettings.current().checkpoint_volume
    checkpoints_dir = working_dir(run_dir, volume)
    if trainer.accelerator.is_main_process:
        published = [
            run_dir / FINAL_CHECKPOINT,
            run_dir / EXPORTS_DIR,
            run_dir / METRICS_FILE,
            run_dir / PROVENANCE_FILE,
        ]
        prepare_working_dir(
            checkpoints_dir, trainer.run_fingerprint, trainer.args.max_steps, args.stale_checkpoints, published
        )
    trainer.accelerator.wait_for_everyone()
    resume = newest_valid_checkpoint(checkpoints_dir)
    # The Trainer resumed at max_steps would train one step more (it checks the limit after a step), so a run
    # whose newest checkpoint is its last step (killed while publishing) only publishes.
    training_done = resume is not None and 0 < trainer.args.max_steps <= resume[0]
    if trainer.accelerator.is_main_process:
        keep_metrics_up_to(
            working_metrics_path(run_dir, volume), resume[0] if resume else None, training_done=training_done
        )
    trainer.accelerator.wait_for_everyone()
    if training_done:
        logger.info("training finished at %s (step %d): publishing its outputs", resume[1], resume[0])
        final_step = resume[0]
    else:
        if resume:
            logger.info("resuming from %s (step %d)", resume[1], resume[0])
        trainer.train(resume_from_checkpoint=str(resume[1]) if resume else None)
        if control.stopped_on_request and trainer.state.global_step < trainer.state.max_steps:
            logger.warning("stopped at step %d on request; rerun to resume", trainer.state.global_step)
            raise SystemExit(PREEMPTED_EXIT_CODE)
        final_step = trainer.state.global_step
    # A signal after the last step no longer interrupts: what is left is quick and completes the run.
    finished = resume[1] if training_done else None
    hub = model_hub_records(args.model, args.model_revision)
    publish_outputs(trainer, run_dir, control.export_steps, final_step, finished, hub)


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
