"""Stage: one (model, method, seed) GRPO / GRAIL / OAR-G training run, resumable and preemption-safe.

    python -m pipeline.train --model PATH_OR_HUB_ID [--model-revision REV] --training-spec SPEC
        --method-spec SPEC --data train.jsonl --seed S --out RUN_DIR [--export-steps N ...]

The two specs are merged (METHOD_SPEC wins) into a ``GrailGRPOConfig``; besides its fields they may hold the
model-loading options ``dtype``, ``trust_remote_code`` (default false) and ``attn_implementation``.

Run layout: ``RUN_DIR/checkpoints/checkpoint-<step>/`` (resume), ``RUN_DIR/metrics.jsonl`` (one line per log),
``RUN_DIR/exports/step-<N>/`` (model + tokenizer of each export step), ``RUN_DIR/final/`` (written last).

Resume: a rerun finds the newest valid checkpoint in ``RUN_DIR/checkpoints`` (partial or corrupt ones are skipped
with a warning) and continues from it with the model, optimizer, scheduler, RNG states, data position, TRL's
micro-step counter and generation buffer restored, so an interrupted run follows the uninterrupted one.

Exit status: 0 done; 2 bad input; ``PREEMPTED_EXIT_CODE`` (75, EX_TEMPFAIL) after SIGTERM or SIGUSR1 (Slurm's
``--signal=B:USR1@<seconds>`` warning): the run saved a checkpoint at the end of the current step and stopped;
rerun or requeue it to resume.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from datasets import Dataset
from safetensors import safe_open
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TrainerCallback,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints
from trl.trainer.utils import RepeatSampler

from pipeline.io import InputError, append_jsonl_durably, atomic_write_jsonl, load_spec, read_jsonl, run_cli
from pipeline.rewards import trl_outcome_reward
from pipeline.trainer import GrailGRPOConfig, GrailGRPOTrainer

logger = logging.getLogger("pipeline.train")

PREEMPTED_EXIT_CODE = 75  # sysexits.h EX_TEMPFAIL: "temporary failure, try again" (checkpoint saved, rerun resumes)
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

MODEL_LOADING_KEYS = frozenset({"dtype", "trust_remote_code", "attn_implementation"})
# Config fields this stage owns: a spec that sets them would break the run layout, resume or the exports.
RESERVED_KEYS = {
    "output_dir": "the run directory comes from --out",
    "seed": "the seed comes from --seed",
    "report_to": "metrics go to RUN_DIR/metrics.jsonl",
    "save_strategy": "checkpoints are saved every save_steps steps",
    "save_only_model": "resuming needs the optimizer, scheduler and RNG states in every checkpoint",
    "resume_from_checkpoint": "the run resumes from its own newest valid checkpoint",
}
ROW_FIELDS = {"id": str, "prompt": list, "solution": str, "source": str}
CHECKPOINT_PATTERN = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
# Checkpoint content that is training state, not part of an exported model.
TRAINING_STATE_FILES = re.compile(
    r"^(optimizer\.pt|scheduler\.pt|scaler\.pt|rng_state.*\.pth|trainer_state\.json|training_args\.bin"
    r"|generation_buffer.*\.pt|latest|zero_to_fp32\.py|README\.md)$"
)
TRAINER_STATE_FILE = "trainer_state.json"


# ----------------------------------------------------------------------------------------------- configuration


def merge_specs(training_spec: Any, method_spec: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """``{**training_spec, **method_spec}`` and, per key, the name of the spec its value came from."""
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for name, spec in (("training spec", training_spec), ("method spec", method_spec)):
        if spec is None:
            continue
        if not isinstance(spec, dict):
            raise InputError(f"{name}: expected a mapping of option names to values, got {type(spec).__name__}")
        merged.update(spec)
        origin.update(dict.fromkeys(spec, name))
    return merged, origin


def config_field_names() -> set[str]:
    """Constructor arguments of ``GrailGRPOConfig``."""
    return {field.name for field in dataclasses.fields(GrailGRPOConfig) if field.init}


def split_options(merged: dict[str, Any], origin: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split merged spec options into (config fields, model-loading options); refuse unknown or reserved keys."""
    fields = config_field_names()
    config_options: dict[str, Any] = {}
    loading_options: dict[str, Any] = {}
    for key, value in merged.items():
        if key in RESERVED_KEYS:
            raise InputError(f"{origin[key]}: key '{key}' may not be set ({RESERVED_KEYS[key]})")
        if key in MODEL_LOADING_KEYS:
            loading_options[key] = value
        elif key in fields:
            config_options[key] = value
        else:
            raise InputError(f"{origin[key]}: unknown key '{key}' (not a GrailGRPOConfig field or model option)")
    trust = loading_options.get("trust_remote_code", False)
    if not isinstance(trust, bool):
        raise InputError(f"{origin['trust_remote_code']}: 'trust_remote_code' must be true or false, got {trust!r}")
    return config_options, loading_options


def build_config(config_options: dict[str, Any], run_dir: Path, seed: int) -> GrailGRPOConfig:
    """The trainer config: the spec options plus what this stage fixes (paths, seed, full checkpoints)."""
    try:
        return GrailGRPOConfig(
            **config_options,
            output_dir=str(run_dir / "checkpoints"),
            seed=seed,
            report_to="none",
            save_strategy="steps",
            save_only_model=False,
        )
    except (TypeError, ValueError) as error:
        raise InputError(f"training/method spec: {error}") from None


# ----------------------------------------------------------------------------------------------- inputs


def check_row(row: dict[str, Any], where: str) -> None:
    """Training-row schema of ARCHITECTURE.md: id, prompt (user messages), solution, source."""
    for field, kind in ROW_FIELDS.items():
        if field not in row:
            raise InputError(f"{where}: field '{field}' missing")
        if not isinstance(row[field], kind):
            raise InputError(f"{where}: field '{field}' must be a {kind.__name__}, got {type(row[field]).__name__}")
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


def check_model_reference(model: str) -> None:
    """Refuse a local model path that does not exist (anything but a hub id ``name`` / ``org/name`` is a path)."""
    looks_like_hub_id = re.fullmatch(r"[\w-][\w.-]*(/[\w.-]+)?", model) is not None
    if not looks_like_hub_id and not Path(model).expanduser().is_dir():
        raise InputError(f"{model}: model directory not found")


def load_tokenizer(model: str, revision: str | None, trust_remote_code: bool) -> PreTrainedTokenizerBase:
    """Tokenizer with left padding (prompts are left-padded for generation) and a pad token (else unk, else eos)."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(model, revision=revision, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        raise InputError(f"{model}: could not load a tokenizer ({error})") from None
    if not tokenizer.chat_template:
        raise InputError(f"{model}: the tokenizer has no chat template (training prompts are conversational)")
    tokenizer.padding_side = "left"
    tokenizer.truncation_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.unk_token if tokenizer.unk_token is not None else tokenizer.eos_token
    return tokenizer


def is_causal_lm_config(config: Any) -> bool:
    """Whether a model config describes a causal LM: its saved architectures (or its type) are causal-LM classes."""
    auto_map = getattr(config, "auto_map", None) or {}
    if "AutoModelForCausalLM" in auto_map:
        return True
    causal_classes = set()
    for names in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        causal_classes.update([names] if isinstance(names, str) else names)
    architectures = getattr(config, "architectures", None)
    if architectures:
        return any(name in causal_classes for name in architectures)
    return config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def load_model(model: str, revision: str | None, options: dict[str, Any]) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_pretrained`` with the spec's dtype / attention / remote-code options."""
    trust_remote_code = options.get("trust_remote_code", False)
    try:
        config = AutoConfig.from_pretrained(model, revision=revision, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        raise InputError(f"{model}: could not load a model config ({error})") from None
    if not is_causal_lm_config(config):
        architectures = ", ".join(getattr(config, "architectures", None) or [config.model_type])
        raise InputError(f"{model}: not a causal language model ({architectures})")
    kwargs = {key: options[key] for key in ("dtype", "attn_implementation") if key in options}
    try:
        return AutoModelForCausalLM.from_pretrained(
            model, revision=revision, trust_remote_code=trust_remote_code, **kwargs
        )
    except (OSError, ValueError) as error:
        raise InputError(f"{model}: could not load the model ({error})") from None


# ----------------------------------------------------------------------------------------------- checkpoints


def checkpoint_problem(checkpoint: Path) -> str | None:
    """Why ``checkpoint`` cannot be resumed from (missing or unreadable state or weights), or None if it can."""
    state_file = checkpoint / TRAINER_STATE_FILE
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{TRAINER_STATE_FILE} missing"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return f"{TRAINER_STATE_FILE} unreadable ({error})"
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
        return f"{TRAINER_STATE_FILE} has no integer global_step"
    weights = [checkpoint / name for name in WEIGHT_FILES if (checkpoint / name).is_file()]
    if not weights:
        return "model weights missing"
    for path in weights:
        if problem := weights_problem(path):
            return problem
    has_optimizer = (checkpoint / "optimizer.pt").is_file() or any(checkpoint.glob("global_step*"))
    return None if has_optimizer else "optimizer state missing"


def weights_problem(path: Path) -> str | None:
    """Whether a weights file (or every shard of an index) exists and, for safetensors, has a readable header."""
    if path.name.endswith(".index.json"):
        try:
            shards = set(json.loads(path.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            return f"{path.name} unreadable ({error})"
        missing = sorted(shard for shard in shards if not (path.parent / shard).is_file())
        if missing:
            return f"weight shards missing: {', '.join(missing)}"
        problems = (weights_problem(path.parent / shard) for shard in sorted(shards))
        return next((problem for problem in problems if problem), None)
    if path.suffix == ".safetensors":
        try:
            with safe_open(path, framework="pt") as handle:
                handle.keys()
        except Exception as error:  # safetensors raises its own error types for truncated or garbled files
            return f"{path.name} unreadable ({error})"
    return None


def checkpoints_newest_first(checkpoints_dir: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``checkpoint-<step>`` directory, newest first."""
    if not checkpoints_dir.is_dir():
        return []
    found = [
        (int(match.group(1)), path)
        for path in checkpoints_dir.iterdir()
        if path.is_dir() and (match := CHECKPOINT_PATTERN.match(path.name))
    ]
    return sorted(found, reverse=True)


def newest_valid_checkpoint(checkpoints_dir: Path) -> tuple[int, Path] | None:
    """The newest checkpoint that can be resumed from; invalid newer ones are skipped with a warning."""
    for step, path in checkpoints_newest_first(checkpoints_dir):
        problem = checkpoint_problem(path)
        if problem is None:
            return step, path
        logger.warning("skipping checkpoint %s: %s", path, problem)
    return None


def fsync_tree(root: Path) -> None:
    """fsync every file under ``root`` and the directories themselves, so a rename publishes durable content."""
    for directory, _, files in os.walk(root):
        for name in files:
            with open(Path(directory) / name, "rb") as handle:
                os.fsync(handle.fileno())
        fsync_directory(Path(directory))


def fsync_directory(directory: Path) -> None:
    """fsync a directory entry (makes renames inside it durable)."""
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def publish_directory(staging: Path, target: Path) -> None:
    """Make the complete directory ``staging`` durable and rename it onto ``target`` (replacing it)."""
    fsync_tree(staging)
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)
    fsync_directory(target.parent)


def export_model(checkpoint: Path, destination: Path) -> None:
    """Publish a checkpoint's model and tokenizer files (hardlinked where possible) as ``destination``."""
    staging = destination.parent / f".{destination.name}.partial"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    for source in sorted(checkpoint.iterdir()):
        if source.is_file() and not TRAINING_STATE_FILES.match(source.name):
            try:
                os.link(source, staging / source.name)
            except OSError:  # another filesystem, or no hardlinks there
                shutil.copy2(source, staging / source.name)
    publish_directory(staging, destination)


# ----------------------------------------------------------------------------------------------- trainer


class EpochRepeatSampler(RepeatSampler):
    """TRL's RepeatSampler whose epoch-``e`` order does not depend on how many epochs this process iterated.

    RepeatSampler draws one permutation per ``__iter__`` from a generator seeded once, so a resumed process would
    replay epoch 0's order in epoch e. ``set_epoch(e)`` (called by the Trainer every epoch) reseeds and draws e
    permutations first: the order is then exactly the uninterrupted sampler's.
    """

    def set_epoch(self, epoch: int) -> None:
        if not self.shuffle or self.seed is None:
            return
        self.generator.manual_seed(self.seed)
        for _ in range(epoch):
            torch.randperm(self.num_samples, generator=self.generator)


class ResumableGRPOTrainer(GrailGRPOTrainer):
    """``GrailGRPOTrainer`` whose checkpoints are atomic and carry TRL's generation state.

    TRL keeps two things outside the HF checkpoint: the micro-step counter ``_step`` (it decides when to generate
    and which slice of the generation buffer a micro-step uses) and the buffer itself. Without them a resumed run
    regenerates at once and trains on misaligned slices. Here ``_step = global_step * gradient_accumulation_steps``
    is restored and each process's buffer is saved in, and loaded from, the checkpoint.
    """

    def __init__(self, *args: Any, export_steps: frozenset[int], exports_dir: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.export_steps = export_steps
        self.exports_dir = exports_dir
        self._staging_dir: Path | None = None

    def _get_train_sampler(self, dataset: Dataset | None = None) -> EpochRepeatSampler:
        sampler = super()._get_train_sampler(dataset)
        return EpochRepeatSampler(
            data_source=sampler.data_source,
            mini_repeat_count=sampler.mini_repeat_count,
            batch_size=sampler.batch_size,
            repeat_count=sampler.repeat_count,
            shuffle=sampler.shuffle,
            seed=sampler.seed,
        )

    def _get_output_dir(self, trial: Any) -> str:
        # While a checkpoint is being saved, the Trainer writes it under the staging directory.
        return str(self._staging_dir) if self._staging_dir is not None else super()._get_output_dir(trial)

    def _buffer_file(self, checkpoint: Path) -> Path:
        return checkpoint / f"generation_buffer_rank{self.accelerator.process_index}.pt"

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Save into ``checkpoints/.staging/checkpoint-<step>``, then rename it into place (atomic)."""
        run_dir = Path(self.args.output_dir)
        staging_root = run_dir / ".staging"
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self.accelerator.is_main_process and staging_root.exists():
            shutil.rmtree(staging_root)  # what a killed save left behind
        self.accelerator.wait_for_everyone()
        self._staging_dir = staging_root
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._staging_dir = None
        if self._buffered_inputs is not None:
            torch.save(self._buffered_inputs, self._buffer_file(staging_root / name))
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            publish_directory(staging_root / name, run_dir / name)
            shutil.rmtree(staging_root)
            rotate_checkpoints(str(run_dir), save_total_limit=self.args.save_total_limit, use_mtime=False)
            if self.state.global_step in self.export_steps:
                export_model(run_dir / name, self.exports_dir / f"step-{self.state.global_step}")
        self.accelerator.wait_for_everyone()

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        self._step = self.state.global_step * self.args.gradient_accumulation_steps
        buffer_file = self._buffer_file(Path(checkpoint))
        if buffer_file.is_file():
            self._buffered_inputs = torch.load(buffer_file, map_location=self.accelerator.device, weights_only=True)


# ----------------------------------------------------------------------------------------------- callbacks


class MetricsCallback(TrainerCallback):
    """Append every log dict, with its ``step``, to ``metrics.jsonl`` durably (main process only)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
        if state.is_world_process_zero and logs:
            with open(self.path, "a", encoding="utf-8") as handle:
                append_jsonl_durably(handle, [{"step": state.global_step, **logs}])


class ExportAndPreemptionCallback(TrainerCallback):
    """Force a checkpoint at every export step; on a preemption signal save one and stop after this step."""

    def __init__(self, export_steps: frozenset[int]) -> None:
        self.export_steps = export_steps
        self.signal_received: int | None = None
        self.accelerator: Any = None

    def request_stop(self, signum: int, _frame: FrameType | None) -> None:
        """Signal handler: only remember the request (logging here could deadlock); the current step finishes."""
        self.signal_received = signum

    def stop_requested(self) -> bool:
        """Whether any process received a preemption signal (all processes must stop at the same step)."""
        requested = self.signal_received is not None
        if self.accelerator is None or self.accelerator.num_processes == 1:
            return requested
        flag = torch.tensor([float(requested)], device=self.accelerator.device)
        return bool(self.accelerator.reduce(flag, reduction="sum").item() > 0)

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        # The last step is checkpointed too, so that a job killed while saving final/ loses no training.
        if state.global_step in self.export_steps or state.global_step == state.max_steps:
            control.should_save = True
        if self.stop_requested():
            received = signal.Signals(self.signal_received).name if self.signal_received else "a signal elsewhere"
            logger.warning("received %s: saving a checkpoint at step %d and stopping", received, state.global_step)
            control.should_save = True
            control.should_training_stop = True


def keep_metrics_up_to(path: Path, step: int | None) -> None:
    """Prepare ``metrics.jsonl`` for a run resuming at ``step`` (None: a fresh run, file emptied).

    Lines logged after the checkpoint, and end-of-run summaries (``train_runtime``) of interrupted attempts, are
    dropped: they will be logged again, so the file never holds a step twice.
    """
    if step is None or not path.exists():
        path.unlink(missing_ok=True)
        return
    rows = read_jsonl(path, tolerate_torn_tail=True)
    atomic_write_jsonl(path, [row for row in rows if row.get("step", 0) <= step and "train_runtime" not in row])


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
    return parser.parse_args(argv)


def check_export_steps(steps: list[int], max_steps: int) -> frozenset[int]:
    """Export steps must lie in 1..max_steps (a run with max_steps <= 0 has no known end: any positive step)."""
    for step in steps:
        if step < 1 or (max_steps > 0 and step > max_steps):
            raise InputError(f"--export-steps: step {step} is outside 1..max_steps ({max_steps})")
    return frozenset(steps)


def export_missing(checkpoints_dir: Path, exports_dir: Path, steps: frozenset[int], final_step: int) -> None:
    """Export the requested steps (up to ``final_step``) that a previous attempt did not export yet."""
    for step in sorted(s for s in steps if s <= final_step):
        destination = exports_dir / f"step-{step}"
        if destination.is_dir():
            continue
        checkpoint = checkpoints_dir / f"{PREFIX_CHECKPOINT_DIR}-{step}"
        if checkpoint_problem(checkpoint) is not None:
            raise InputError(f"--export-steps: step {step} has no export and no valid checkpoint to export from")
        export_model(checkpoint, destination)


def save_final(trainer: ResumableGRPOTrainer, final_dir: Path) -> None:
    """Save the trained model and tokenizer to ``final_dir`` atomically (every process takes part, as sharded
    optimizers need; the main process publishes)."""
    staging = final_dir.parent / f".{final_dir.name}.partial"
    if trainer.accelerator.is_main_process and staging.exists():
        shutil.rmtree(staging)
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(staging))
    trainer.accelerator.wait_for_everyone()
    if trainer.accelerator.is_main_process:
        publish_directory(staging, final_dir)
    trainer.accelerator.wait_for_everyone()


@dataclasses.dataclass
class SignalHandlers:
    """Install handlers for ``PREEMPTION_SIGNALS`` on entry and restore the previous ones on exit."""

    callback: ExportAndPreemptionCallback
    previous: dict[int, Any] = dataclasses.field(default_factory=dict)

    def __enter__(self) -> SignalHandlers:
        for signum in PREEMPTION_SIGNALS:
            self.previous[signum] = signal.signal(signum, self.callback.request_stop)
        return self

    def __exit__(self, *_: Any) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def build_trainer(args: argparse.Namespace) -> tuple[ResumableGRPOTrainer, ExportAndPreemptionCallback]:
    """Validate every input (specs, export steps, rows, tokenizer, model) and assemble the trainer."""
    specs = {}
    for name, text in (("training spec", args.training_spec), ("method spec", args.method_spec)):
        try:
            specs[name] = load_spec(text)
        except InputError as error:
            raise InputError(f"{name}: {error}") from None
    merged, origin = merge_specs(specs["training spec"], specs["method spec"])
    config_options, loading_options = split_options(merged, origin)
    config = build_config(config_options, args.out, args.seed)
    export_steps = check_export_steps(args.export_steps, config.max_steps)
    dataset = load_training_rows(args.data)
    check_model_reference(args.model)
    tokenizer = load_tokenizer(args.model, args.model_revision, loading_options.get("trust_remote_code", False))
    model = load_model(args.model, args.model_revision, loading_options)
    control = ExportAndPreemptionCallback(export_steps)
    trainer = ResumableGRPOTrainer(
        model=model,
        reward_funcs=[trl_outcome_reward],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[MetricsCallback(args.out / "metrics.jsonl"), control],
        export_steps=export_steps,
        exports_dir=args.out / "exports",
    )
    control.accelerator = trainer.accelerator
    return trainer, control


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    run_dir: Path = args.out
    trainer, control = build_trainer(args)
    checkpoints_dir = run_dir / "checkpoints"
    resume = newest_valid_checkpoint(checkpoints_dir)
    if trainer.accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        keep_metrics_up_to(run_dir / "metrics.jsonl", resume[0] if resume else None)
    trainer.accelerator.wait_for_everyone()
    if resume:
        logger.info("resuming from %s (step %d)", resume[1], resume[0])
    with SignalHandlers(control):
        trainer.train(resume_from_checkpoint=str(resume[1]) if resume else None)
        if control.signal_received is not None and trainer.state.global_step < trainer.state.max_steps:
            logger.warning("stopped at step %d on request; rerun to resume", trainer.state.global_step)
            raise SystemExit(PREEMPTED_EXIT_CODE)
        # A signal after the last step no longer interrupts: what is left is quick and completes the run.
        if trainer.accelerator.is_main_process:
            export_missing(checkpoints_dir, run_dir / "exports", control.export_steps, trainer.state.global_step)
        save_final(trainer, run_dir / "final")


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
