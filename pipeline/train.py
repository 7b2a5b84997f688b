"""Stage: one (model, method, seed) GRPO / GRAIL / OAR-G training run, resumable and preemption-safe.

    python -m pipeline.train --model PATH_OR_HUB_ID [--model-revision REV] --training-spec SPEC
        --method-spec SPEC --data train.jsonl --seed S --out RUN_DIR [--export-steps N ...]

The two specs are merged (METHOD_SPEC wins) into a ``GrailGRPOConfig``; besides its fields they may hold the
model-loading options ``dtype``, ``trust_remote_code`` (default false) and ``attn_implementation``.

Run layout: working files in ``RUN_DIR/checkpoints/``: ``checkpoint-<step>/`` (resume), ``metrics.jsonl`` (one line
per log, appended as training goes) and ``exports/step-<N>/`` (model + tokenizer of each export step); the outputs,
published when the run completes: ``RUN_DIR/exports/step-<N>/`` (hardlinks to the working exports),
``RUN_DIR/final/`` and ``RUN_DIR/metrics.jsonl`` (a copy of the working log). The working files are not Snakemake
outputs, so they survive the deletion of a failed job's outputs and a resumed run loses no step and no export.

Resume: a rerun finds the newest valid checkpoint in ``RUN_DIR/checkpoints`` (partial or corrupt ones are skipped
with a warning) and continues from it with the model, optimizer, scheduler, RNG states, data position, TRL's
micro-step counter and generation buffer restored, so an interrupted run follows the uninterrupted one.

Exit status: 0 done; 2 bad input; ``PREEMPTED_EXIT_CODE`` (75, EX_TEMPFAIL) after SIGTERM or SIGUSR1 (Slurm's
``--signal=USR1@<seconds>`` time-limit warning, or ``B:USR1`` forwarded by a batch script): the run saved a
checkpoint at the end of the current step and stopped, or, when the signal came before the first step (imports,
model loading), stopped at once with nothing to save; rerun or requeue it to resume.
"""

# The preemption handlers are installed before the slow third-party imports (see STARTUP_SIGNALS), hence E402.
# ruff: noqa: E402

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib.util
import json
import logging
import os
import re
import shutil
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pipeline.preemption import PREEMPTED_EXIT_CODE, PreemptionSignals

# Run as a stage, record the signals before importing torch, transformers and TRL (seconds): Slurm's warning
# arriving meanwhile would otherwise kill the job (status 138) instead of stopping it (status 75).
STARTUP_SIGNALS = PreemptionSignals().install() if __name__ == "__main__" else None

import torch
from datasets import Dataset
from safetensors import safe_open
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    ProgressCallback,
    TrainerCallback,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints
from trl.trainer.utils import RepeatSampler

from pipeline.io import (
    InputError,
    append_jsonl_durably,
    atomic_write_jsonl,
    atomic_write_text,
    load_spec,
    read_jsonl,
    run_cli,
)
from pipeline.progress import progress
from pipeline.rewards import trl_outcome_reward
from pipeline.tracking import TrackingConfig, environment, tensorboard_environment, wandb_run
from pipeline.trainer import GrailGRPOConfig, GrailGRPOTrainer

logger = logging.getLogger("pipeline.train")

# Values the config classes accept beyond their annotations (their __post_init__ converts them): TRL maps
# scale_rewards True/False to "group"/"none"; transformers turns a bool or list of options for fsdp into its config.
ANNOTATION_WIDENINGS: dict[str, Any] = {"scale_rewards": bool, "fsdp": bool | list[str]}
# Model-loading options a spec may set besides the config fields, with their types.
MODEL_LOADING_OPTIONS: dict[str, Any] = {"dtype": str, "trust_remote_code": bool, "attn_implementation": str}
# Config fields this stage owns: a spec that sets them would break the run layout, resume or the exports.
RESERVED_KEYS = {
    "output_dir": "the run directory comes from --out",
    "seed": "the seed comes from --seed",
    "report_to": "trackers come from --tracking (the study config's `tracking` section)",
    "run_name": "the run's name comes from --run-name",
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
    r"|generation_buffer.*\.pt|oar_g_noise_generator.*\.pt|latest|zero_to_fp32\.py|README\.md)$"
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


def config_field_types() -> dict[str, Any]:
    """Accepted type of every constructor argument of ``GrailGRPOConfig``: its annotation (| its widening)."""
    annotations = typing.get_type_hints(GrailGRPOConfig)
    types_by_name = {field.name: annotations[field.name] for field in dataclasses.fields(GrailGRPOConfig) if field.init}
    for name, widening in ANNOTATION_WIDENINGS.items():
        types_by_name[name] = types_by_name[name] | widening
    return types_by_name


def annotation_accepts(annotation: Any, value: Any) -> bool:
    """Whether a spec value (as JSON/YAML parses it) fits a type annotation.

    A union accepts what any member accepts; int and float never accept a bool, float accepts an int; an enum
    accepts its members and their values; ``list[X]`` and ``dict[K, V]`` check their elements; Any accepts all.
    """
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(annotation_accepts(member, value) for member in arguments)
    if origin is typing.Literal:
        return any(type(value) is type(option) and value == option for option in arguments)
    if origin is list:
        (item_type,) = arguments
        return isinstance(value, list) and all(annotation_accepts(item_type, item) for item in value)
    if origin is dict:
        key_type, item_type = arguments
        return isinstance(value, dict) and all(
            annotation_accepts(key_type, key) and annotation_accepts(item_type, item) for key, item in value.items()
        )
    if origin is not None:  # another generic alias (tuple[...], ...): its container type
        return isinstance(value, origin)
    if annotation is type(None):
        return value is None
    if annotation in (int, float) and isinstance(value, bool):
        return False
    if annotation is float:
        return isinstance(value, int | float)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return isinstance(value, annotation) or value in {member.value for member in annotation}
    return isinstance(annotation, type) and isinstance(value, annotation)


def annotation_name(annotation: Any) -> str:
    """A type annotation as written in Python: ``int``, ``dict | str | None``, ``list[str]``."""
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "None"
    if origin in (typing.Union, types.UnionType):
        return " | ".join(annotation_name(member) for member in arguments)
    if origin is typing.Literal:
        return " | ".join(repr(option) for option in arguments)
    if origin is not None:
        return f"{annotation_name(origin)}[{', '.join(annotation_name(argument) for argument in arguments)}]"
    return getattr(annotation, "__name__", repr(annotation))


def split_options(merged: dict[str, Any], origin: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split merged spec options into (config fields, model-loading options); refuse unknown or reserved keys and
    values whose type does not fit the field's annotation."""
    field_types = config_field_types()
    config_options: dict[str, Any] = {}
    loading_options: dict[str, Any] = {}
    for key, value in merged.items():
        if key in RESERVED_KEYS:
            raise InputError(f"{origin[key]}: key '{key}' may not be set ({RESERVED_KEYS[key]})")
        if key in MODEL_LOADING_OPTIONS:
            expected, options = MODEL_LOADING_OPTIONS[key], loading_options
        elif key in field_types:
            expected, options = field_types[key], config_options
        else:
            raise InputError(f"{origin[key]}: unknown key '{key}' (not a GrailGRPOConfig field or model option)")
        if not annotation_accepts(expected, value):
            raise InputError(
                f"{origin[key]}: key '{key}' must be {annotation_name(expected)}, got {type(value).__name__} {value!r}"
            )
        options[key] = value
    return config_options, loading_options


def build_config(
    config_options: dict[str, Any], run_dir: Path, seed: int, tracking: TrackingConfig, run_name: str
) -> GrailGRPOConfig:
    """The trainer config: the spec options plus what this stage fixes (paths, seed, trackers, full checkpoints)."""
    try:
        return GrailGRPOConfig(
            **config_options,
            output_dir=str(run_dir / "checkpoints"),
            seed=seed,
            report_to=tracking.integrations(),
            run_name=run_name,
            save_strategy="steps",
            save_only_model=False,
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
    """Publish the model and tokenizer files of a checkpoint (or of an export) as ``destination``, hardlinked where
    possible."""
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
    is restored and each process's buffer is saved in, and loaded from, the checkpoint; so is the state of OAR-G's
    noise generator (a reseeded one would repeat the noise of the first steps).
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

    def _process_state_file(self, checkpoint: Path, kind: str) -> Path:
        """Where this process keeps ``kind`` ("generation_buffer", "oar_g_noise_generator") in ``checkpoint``."""
        return checkpoint / f"{kind}_rank{self.accelerator.process_index}.pt"

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
            torch.save(self._buffered_inputs, self._process_state_file(staging_root / name, "generation_buffer"))
        if self._oar_g_generator is not None:
            torch.save(
                self._oar_g_generator.get_state(),
                self._process_state_file(staging_root / name, "oar_g_noise_generator"),
            )
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
        buffer_file = self._process_state_file(Path(checkpoint), "generation_buffer")
        if buffer_file.is_file():
            self._buffered_inputs = torch.load(buffer_file, map_location=self.accelerator.device, weights_only=True)
        noise_file = self._process_state_file(Path(checkpoint), "oar_g_noise_generator")
        if noise_file.is_file():
            self._oar_g_generator = torch.Generator(device=self.accelerator.device)
            self._oar_g_generator.set_state(torch.load(noise_file, map_location="cpu", weights_only=True))


# ----------------------------------------------------------------------------------------------- callbacks


class MetricsCallback(TrainerCallback):
    """Append every log dict, with its ``step``, to ``metrics.jsonl`` durably (main process only)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
        if state.is_world_process_zero and logs:
            with open(self.path, "a", encoding="utf-8") as handle:
                append_jsonl_durably(handle, [{"step": state.global_step, **logs}])


class StepProgressCallback(ProgressCallback):
    """transformers' progress bar (steps done / total, rate, time left; log dicts printed between updates) drawn by
    ``pipeline.progress``: one line per update when the job log is a file. A resumed run starts at its step."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        if state.is_world_process_zero:
            self.training_bar = progress(desc="train", unit="step", total=state.max_steps, initial=state.global_step)
        self.current_step = state.global_step


class ExportAndPreemptionCallback(TrainerCallback):
    """Force a checkpoint at every export step; on a preemption signal save one and stop after this step."""

    def __init__(self, export_steps: frozenset[int], signals: PreemptionSignals) -> None:
        self.export_steps = export_steps
        self.signals = signals
        self.stopped_on_request = False
        self.accelerator: Any = None

    def stop_requested(self) -> bool:
        """Whether any process received a preemption signal (all processes must stop at the same step)."""
        requested = self.signals.received is not None
        if self.accelerator is None or self.accelerator.num_processes == 1:
            return requested
        flag = torch.tensor([float(requested)], device=self.accelerator.device)
        return bool(self.accelerator.reduce(flag, reduction="sum").item() > 0)

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        # The last step is checkpointed too, so that a job killed while saving final/ loses no training.
        if state.global_step in self.export_steps or state.global_step == state.max_steps:
            control.should_save = True
        if self.stop_requested():
            logger.warning(
                "received %s: saving a checkpoint at step %d and stopping",
                self.signals.received_name(),
                state.global_step,
            )
            control.should_save = True
            control.should_training_stop = True
            self.stopped_on_request = True


def working_metrics_path(run_dir: Path) -> Path:
    """The metrics log appended during training; not a Snakemake output, so a failed job's cleanup keeps it."""
    return run_dir / "checkpoints" / "metrics.jsonl"


def working_exports_dir(run_dir: Path) -> Path:
    """Where each export step's model is saved during training; kept when a failed job's outputs are deleted and
    when its checkpoint is rotated away (``save_total_limit``)."""
    return run_dir / "checkpoints" / "exports"


def keep_metrics_up_to(path: Path, step: int | None, *, training_done: bool = False) -> None:
    """Prepare the working metrics log for a run resuming at ``step`` (None: a fresh run, file emptied).

    Lines logged after the checkpoint, and end-of-run summaries (``train_runtime``) of interrupted attempts, are
    dropped: they will be logged again, so the file never holds a step twice. With ``training_done`` (the
    checkpoint is the last step; no attempt will train or log again) the summary logged at ``step`` is kept.
    """
    if step is None or not path.exists():
        path.unlink(missing_ok=True)
        return
    rows = read_jsonl(path, tolerate_torn_tail=True)
    atomic_write_jsonl(
        path,
        [
            row
            for row in rows
            if row.get("step", 0) <= step
            and ("train_runtime" not in row or (training_done and row.get("step") == step))
        ],
    )


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
    args = parser.parse_args(argv)
    args.run_name = args.run_name or "/".join(args.out.resolve().parts[-3:])
    args.tracking_dir = args.tracking_dir or args.out / "tracking"
    return args


def load_tracking(text: str) -> TrackingConfig:
    """``--tracking`` as a TrackingConfig; unknown keys or integrations are refused by name."""
    spec = load_spec(text)
    try:
        tracking = TrackingConfig(**spec)
        integrations = tracking.integrations()
    except (TypeError, ValueError) as error:
        raise InputError(f"--tracking: {error}") from None
    missing = [name for name in integrations if importlib.util.find_spec(name) is None]
    if missing:
        raise InputError(f"--tracking: report_to {missing} is not installed (pip install -e '.[tracking]')")
    return tracking


def check_export_steps(steps: list[int], max_steps: int) -> frozenset[int]:
    """Export steps must lie in 1..max_steps (a run with max_steps <= 0 has no known end: any positive step)."""
    for step in steps:
        if step < 1 or (max_steps > 0 and step > max_steps):
            raise InputError(f"--export-steps: step {step} is outside 1..max_steps ({max_steps})")
    return frozenset(steps)


def publish_exports(run_dir: Path, steps: frozenset[int], final_step: int) -> None:
    """Publish ``RUN_DIR/exports/step-N`` for each requested step up to ``final_step`` that is not there yet, from
    its working export (or, when a killed attempt did not make one, from its checkpoint)."""
    for step in sorted(s for s in steps if s <= final_step):
        destination = run_dir / "exports" / f"step-{step}"
        if destination.is_dir():
            continue
        source = working_exports_dir(run_dir) / f"step-{step}"
        if not source.is_dir():
            source = run_dir / "checkpoints" / f"{PREFIX_CHECKPOINT_DIR}-{step}"
            if checkpoint_problem(source) is not None:
                raise InputError(f"--export-steps: step {step} has no export and no valid checkpoint to export from")
        export_model(source, destination)


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


def publish_metrics(working: Path, published: Path) -> None:
    """Copy the complete working metrics log to the stage output ``published`` atomically."""
    atomic_write_text(published, working.read_text(encoding="utf-8"))


def publish_outputs(
    trainer: ResumableGRPOTrainer,
    run_dir: Path,
    export_steps: frozenset[int],
    final_step: int,
    finished_checkpoint: Path | None,
) -> None:
    """Publish the stage outputs: the exports, the final model (saved by the trainer, or linked from
    ``finished_checkpoint`` when an earlier attempt finished training) and, last, the metrics."""
    is_main = trainer.accelerator.is_main_process
    if is_main:
        publish_exports(run_dir, export_steps, final_step)
    if finished_checkpoint is None:
        save_final(trainer, run_dir / "final")
    elif is_main:
        export_model(finished_checkpoint, run_dir / "final")
    if is_main:
        publish_metrics(working_metrics_path(run_dir), run_dir / "metrics.jsonl")


def stop_before_training(received: str) -> None:
    """Exit with ``PREEMPTED_EXIT_CODE`` for a signal that came before the first step: nothing to checkpoint."""
    logger.warning("received %s before the first training step: stopping without a checkpoint", received)
    raise SystemExit(PREEMPTED_EXIT_CODE)


def build_trainer(
    args: argparse.Namespace, signals: PreemptionSignals, tracking: TrackingConfig
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
    config = build_config(config_options, args.out, args.seed, tracking, args.run_name)
    export_steps = check_export_steps(args.export_steps, config.max_steps)
    dataset = load_training_rows(args.data)
    check_model_reference(args.model)
    tokenizer = load_tokenizer(args.model, args.model_revision, loading_options.get("trust_remote_code", False))
    model = load_model(args.model, args.model_revision, loading_options)
    control = ExportAndPreemptionCallback(export_steps, signals)
    with environment(tensorboard_environment(tracking, args.run_name, args.tracking_dir)):
        trainer = ResumableGRPOTrainer(
            model=model,
            reward_funcs=[trl_outcome_reward],
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[MetricsCallback(working_metrics_path(args.out)), control],
            export_steps=export_steps,
            exports_dir=working_exports_dir(args.out),
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


def train_run(args: argparse.Namespace, signals: PreemptionSignals) -> None:
    """Train (or resume) the run; stop with ``PREEMPTED_EXIT_CODE`` at the first step boundary after a signal."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if signals.received is not None:  # during the imports: stop before the slow validation and loading
        stop_before_training(signals.received_name())
    tracking = load_tracking(args.tracking)
    trainer, control = build_trainer(args, signals, tracking)
    if control.stop_requested():  # during validation or model loading
        stop_before_training(signals.received_name())
    with wandb_run(tracking, args.run_name, args.tracking_dir, trainer.accelerator.is_main_process):
        train_and_publish(args, trainer, control)


def train_and_publish(
    args: argparse.Namespace, trainer: ResumableGRPOTrainer, control: ExportAndPreemptionCallback
) -> None:
    """Resume from the newest valid checkpoint (or start), train to max_steps, publish the outputs."""
    run_dir: Path = args.out
    checkpoints_dir = run_dir / "checkpoints"
    resume = newest_valid_checkpoint(checkpoints_dir)
    # The Trainer resumed at max_steps would train one step more (it checks the limit after a step), so a run
    # whose newest checkpoint is its last step (killed while publishing) only publishes.
    training_done = resume is not None and 0 < trainer.args.max_steps <= resume[0]
    if trainer.accelerator.is_main_process:
        checkpoints_dir.mkdir(parents=True, exist_ok=True)
        keep_metrics_up_to(working_metrics_path(run_dir), resume[0] if resume else None, training_done=training_done)
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
    publish_outputs(trainer, run_dir, control.export_steps, final_step, resume[1] if training_done else None)


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
