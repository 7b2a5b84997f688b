"""Resumable training: checkpoint validation, the resumable trainer and its sampler, the stage's callbacks.

A checkpoint is valid when its trainer state, weights (every shard, readable safetensors headers) and optimizer
state (``optimizer.pt``, or DeepSpeed's model states and every rank's optimizer shard) are there; ``newest_valid_checkpoint`` skips partial or corrupt ones with a warning. ``ResumableGRPOTrainer``
saves checkpoints atomically and with TRL's generation state and the run's fingerprint (pipeline.training.run_state), so a
resumed run follows the uninterrupted one.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import ProgressCallback, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints
from trl.trainer.utils import RepeatSampler

from pipeline.core.disk_full import free_bytes, gib, space_problem
from pipeline.core.io import append_jsonl_durably, atomic_write_jsonl, export_model, publish_directory, read_jsonl
from pipeline.core.layout import export_label
from pipeline.core.progress import progress
from pipeline.models.loading import weights_problem
from pipeline.runtime.disk_space import CheckpointSaveError, directory_bytes, first_checkpoint_bytes
from pipeline.runtime.health import HealthConfig, latest_trips
from pipeline.runtime.preemption import PreemptionSignals
from pipeline.runtime.watchdog import StallWatchdog, WatchdogConfig
from pipeline.training.collapse_guard import TrainingCollapse, weight_metrics, weight_norm
from pipeline.training.nan_guard import NonFiniteTraining, any_process, nonfinite_parameters, step_problem
from pipeline.training.run_state import write_fingerprint
from pipeline.training.trainer import GrailGRPOTrainer

logger = logging.getLogger(__name__)

CHECKPOINT_PATTERN = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
TRAINER_STATE_FILE = "trainer_state.json"
# DeepSpeed's checkpoint layout (deepspeed.runtime.engine): `latest` names the tag directory, global_stepN/
DEEPSPEED_LATEST = "latest"
DEEPSPEED_MODEL_STATES = "mp_rank_00_model_states.pt"
DEEPSPEED_OPTIMIZER_SHARD = "zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"


def checkpoint_path(checkpoints_dir: Path, step: int) -> Path:
    """``checkpoints_dir/checkpoint-<step>``, the directory name the HF Trainer gives the checkpoint of a step."""
    return checkpoints_dir / f"{PREFIX_CHECKPOINT_DIR}-{step}"


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
    if (checkpoint / "optimizer.pt").is_file():
        return None
    if not (checkpoint / DEEPSPEED_LATEST).is_file():
        return "optimizer state missing"
    return deepspeed_problem(checkpoint, ranks=max(len(list(checkpoint.glob("rng_state_*.pth"))), 1))


def deepspeed_problem(checkpoint: Path, ranks: int) -> str | None:
    """Whether DeepSpeed's state in a ZeRO checkpoint is incomplete: the directory its ``latest`` file names
    (``global_stepN``) must hold the model states and one optimizer shard per rank, ``ranks`` of them (the
    processes that saved it, one ``rng_state_<r>.pth`` each), since a resume loads every one of them."""
    try:
        tag = (checkpoint / DEEPSPEED_LATEST).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        return f"DeepSpeed's {DEEPSPEED_LATEST} unreadable ({error})"
    needed = [DEEPSPEED_MODEL_STATES, *(DEEPSPEED_OPTIMIZER_SHARD.format(rank=rank) for rank in range(ranks))]
    missing = [name for name in needed if not (checkpoint / tag / name).is_file()]
    return f"DeepSpeed state missing in {tag}/: {', '.join(missing)}" if missing else None


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


def loadable_device(device: torch.device) -> torch.device:
    """``device`` as ``torch.load``'s ``map_location``: an indexed CPU device (accelerate gives rank ``i`` of a
    multi-CPU run ``cpu:i``) is plain ``cpu``, the only CPU location torch.load can restore to."""
    return torch.device("cpu") if device.type == "cpu" else device


def _restore_to_indexed_cpu(storage: Any, location: str) -> Any:
    """torch.load deserializer for ``cpu:<i>`` locations: the storage as it is (it is already in CPU memory)."""
    return storage if location.startswith("cpu:") else None


# transformers loads a resumed run's optimizer state with map_location=args.device when there are several
# processes, and accelerate gives rank i of a multi-CPU run the device cpu:i, which torch.load cannot restore to
# ("don't know how to restore data location ... (tagged with cpu:0)"): teach it that cpu:i is CPU memory.
torch.serialization.register_package(100, lambda _: None, _restore_to_indexed_cpu)


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
    noise generator (a reseeded one would repeat the noise of the first steps). Each checkpoint also records the
    ``run_fingerprint`` of the settings that made it.

    The NaN guard (pipeline.training.nan_guard): a non-finite loss or gradient norm raises ``NonFiniteTraining`` before the
    optimizer step, and a checkpoint or final model is written only from finite weights. The collapse guard
    (pipeline.training.collapse_guard): each logged training step also logs the weights' norm and its growth over the
    start model's, and a trip of the health check (``health``) raises ``TrainingCollapse`` before the step's save.
    """

    def __init__(
        self,
        *args: Any,
        export_steps: frozenset[int],
        exports_dir: Path,
        run_fingerprint: dict[str, Any],
        health: HealthConfig | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.export_steps = export_steps
        self.exports_dir = exports_dir
        self.run_fingerprint = run_fingerprint
        self.health = health if health is not None else HealthConfig()
        # The model as constructed is the start model: a resumed run loads its checkpoint's weights in train().
        self.start_weight_norm = weight_norm(self.model)
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
        """Where this process keeps ``kind`` ("generation_buffer", "credit_generator") in ``checkpoint``."""
        return checkpoint / f"{kind}_rank{self.accelerator.process_index}.pt"

    def _get_grad_norm(self, model: Any, grad_norm: Any = None) -> Any:
        # The one point of a step after the backward passes (every micro-step's loss is summed into _tr_loss, with
        # logging_nan_inf_filter off) and before the optimizer step: a non-finite step stops here, weights intact.
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        problem = step_problem(self._tr_loss, grad_norm)
        if any_process(self.accelerator, problem is not None):
            raise NonFiniteTraining(self._nonfinite_message(self.state.global_step + 1, problem))
        return grad_norm

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        # A training step's row (the HF Trainer's has "loss"; the end-of-run summary has "train_loss") gets the
        # weights' norm; once it is logged (metrics.jsonl, log_history), the health check reads the rows so far.
        training = "loss" in logs
        if training:
            logs.update(weight_metrics(self.model, self.start_weight_norm))
        super().log(logs, start_time)
        if training:
            trips = latest_trips(self.state.log_history, self.health)
            if any_process(self.accelerator, bool(trips)):
                raise TrainingCollapse(self.state.global_step, trips)

    def check_finite_weights(self, what: str) -> None:
        """Raise ``NonFiniteTraining`` before ``what`` is written when any process's weights are not finite."""
        names = nonfinite_parameters(self.model)
        if any_process(self.accelerator, bool(names)):
            problem = (
                f"non-finite weights ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})" if names else None
            )
            raise NonFiniteTraining(self._nonfinite_message(self.state.global_step, problem, f"{what} not written"))

    def _nonfinite_message(self, step: int, problem: str | None, consequence: str = "training stopped") -> str:
        """The guard's error: step, rank, what (on this rank, or elsewhere), the last finite checkpoint."""
        newest = newest_valid_checkpoint(Path(self.args.output_dir))
        found = problem if problem is not None else "non-finite values on another rank"
        return (
            f"step {step}, rank {self.accelerator.process_index}: {found}; {consequence}. "
            f"Last finite checkpoint: {newest[1] if newest else 'none (the run would start from scratch)'}"
        )

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Save into ``checkpoints/.staging/checkpoint-<step>``, then rename it into place (atomic)."""
        run_dir = Path(self.args.output_dir)
        staging_root = run_dir / ".staging"
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        self.check_finite_weights(name)
        if self.accelerator.is_main_process and staging_root.exists():
            shutil.rmtree(staging_root)  # what a killed save left behind
        self.check_free_space(run_dir / name)  # after the leftover is gone: its space counts as free
        self.accelerator.wait_for_everyone()
        try:
            self._write_staged_checkpoint(model, trial, staging_root / name)
        except Exception as error:
            # A staging directory left behind would hold the space the next attempt needs.
            if self.accelerator.is_main_process:
                shutil.rmtree(staging_root, ignore_errors=True)
            raise CheckpointSaveError(
                f"{staging_root / name}: saving the checkpoint failed ({type(error).__name__}: {error}); "
                f"{gib(free_bytes(run_dir))} free at {run_dir}; the staging directory was removed"
            ) from error
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            write_fingerprint(staging_root / name, self.run_fingerprint)
            publish_directory(staging_root / name, run_dir / name)
            shutil.rmtree(staging_root)
            rotate_checkpoints(str(run_dir), save_total_limit=self.args.save_total_limit, use_mtime=False)
            if self.state.global_step in self.export_steps:
                export_model(run_dir / name, self.exports_dir / export_label(self.state.global_step))
        self.accelerator.wait_for_everyone()

    def _save(self, output_dir: str | None = None, state_dict: dict[str, Any] | None = None) -> None:
        # DeepSpeed hands the Trainer a state dict of separate copies, in which save_pretrained no longer sees the
        # tied embeddings: the saved model would carry its own lm_head.weight, unlike the source model.
        model = self.accelerator.unwrap_model(self.model)
        super()._save(output_dir, state_dict=None if state_dict is None else without_tied_copies(model, state_dict))

    def _write_staged_checkpoint(self, model: Any, trial: Any, staged: Path) -> None:
        """The Trainer's checkpoint, this process's generation buffer and credit noise state, into ``staged``."""
        self._staging_dir = staged.parent
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._staging_dir = None
        if self._buffered_inputs is not None:
            torch.save(self._buffered_inputs, self._process_state_file(staged, "generation_buffer"))
        if self._credit_generator is not None:
            torch.save(self._credit_generator.get_state(), self._process_state_file(staged, "credit_generator"))

    def check_free_space(self, checkpoint: Path) -> None:
        """Raise ``CheckpointSaveError`` on every process when ``checkpoint`` would not fit: the main process
        compares the size of the newest checkpoint (before the first, ``first_checkpoint_bytes``) to the free space."""
        problem = None
        if self.accelerator.is_main_process:
            newest = checkpoints_newest_first(checkpoint.parent)
            needed = directory_bytes(newest[0][1]) if newest else first_checkpoint_bytes(self.model, self.args.bf16)
            problem = space_problem(checkpoint, needed, free_bytes(checkpoint.parent))
        if any_process(self.accelerator, problem is not None):
            raise CheckpointSaveError(problem or f"{checkpoint}: not enough disk space (found by the main process)")

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        self._step = self.state.global_step * self.args.gradient_accumulation_steps
        buffer_file = self._process_state_file(Path(checkpoint), "generation_buffer")
        if buffer_file.is_file():
            self._buffered_inputs = torch.load(
                buffer_file, map_location=loadable_device(self.accelerator.device), weights_only=True
            )
        noise_file = self._process_state_file(Path(checkpoint), "credit_generator")
        if noise_file.is_file():
            self._credit_generator = torch.Generator(device=self.accelerator.device)
            self._credit_generator.set_state(torch.load(noise_file, map_location="cpu", weights_only=True))


def without_tied_copies(model: torch.nn.Module, state_dict: dict[str, Any]) -> dict[str, Any]:
    """``state_dict`` without the second and later names of a parameter the model shares between modules (tied
    embeddings: ``lm_head.weight`` is ``model.embed_tokens.weight``); ``named_parameters`` lists each shared
    parameter under its first name only."""
    first_names = {name for name, _ in model.named_parameters()}
    copies = {name for name, _ in model.named_parameters(remove_duplicate=False)} - first_names
    return {name: tensor for name, tensor in state_dict.items() if name not in copies}


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
    ``pipeline.core.progress``: one line per update when the job log is a file. A resumed run starts at its step."""

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
        return any_process(self.accelerator, self.signals.received is not None)

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


class StallWatchdogCallback(TrainerCallback):
    """The stall watchdog (pipeline.runtime.watchdog) over the training loop: armed at the start of training, a beat at the
    start and end of every optimizer step. A step spans everything the Trainer does for it (TRL's generation, with
    the colocated vLLM engine too, every micro-step's forward and backward, the optimizer step); the gap after it
    (logging, a checkpoint save) gets the same bound."""

    def __init__(self, config: WatchdogConfig) -> None:
        self.watchdog = StallWatchdog(config)

    def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        self.watchdog.start(f"training step {state.global_step + 1}")

    def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        self.watchdog.begin(f"training step {state.global_step + 1}")

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        self.watchdog.end(f"the gap after training step {state.global_step} (logging, checkpoint save)")

    def on_train_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        self.watchdog.stop()


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
