"""Publishing a training run's outputs: its exports, its final model, its provenance and, last, its metrics log.

Every output is published whole (a staging directory or temporary file renamed into place) and sealed
(``pipeline.core.seal``), and a full disk is named with the space needed (``pipeline.core.disk_full``). The outputs
are published when the run completes; the working files they come from (``RUN_DIR/checkpoints/``) are not Snakemake
outputs, so a failed job's cleanup keeps them and a rerun only publishes again.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from pipeline.core.disk_full import output_space
from pipeline.core.io import InputError, export_model, publish_directory, publish_text, read_jsonl
from pipeline.core.layout import (
    EXPORTS_DIR,
    FINAL_CHECKPOINT,
    METRICS_FILE,
    PROVENANCE_FILE,
    export_label,
    working_dir,
    working_exports_dir,
    working_metrics_path,
)
from pipeline.core.provenance import write_provenance
from pipeline.runtime.disk_space import model_bytes
from pipeline.runtime.health import summary
from pipeline.runtime.settings import RuntimeSettings
from pipeline.training.resume import ResumableGRPOTrainer, checkpoint_path, checkpoint_problem


def publish_exports(run_dir: Path, steps: frozenset[int], final_step: int, volume: str | None = None) -> None:
    """Publish ``RUN_DIR/exports/step-N`` for each requested step up to ``final_step`` that is not there yet, from
    its working export (or, when a killed attempt did not make one, from its checkpoint), in the working directory
    under ``volume`` (layout.working_dir)."""
    for step in sorted(s for s in steps if s <= final_step):
        destination = run_dir / EXPORTS_DIR / export_label(step)
        if destination.is_dir():
            continue
        source = working_exports_dir(run_dir, volume) / export_label(step)
        if not source.is_dir():
            source = checkpoint_path(working_dir(run_dir, volume), step)
            if checkpoint_problem(source) is not None:
                raise InputError(f"--export-steps: step {step} has no export and no valid checkpoint to export from")
        export_model(source, destination)


def save_final(trainer: ResumableGRPOTrainer, final_dir: Path) -> None:
    """Save the trained model and tokenizer to ``final_dir`` atomically (every process takes part, as sharded
    optimizers need; the main process publishes)."""
    staging = final_dir.parent / f".{final_dir.name}.partial"
    trainer.check_finite_weights(str(final_dir))
    if trainer.accelerator.is_main_process and staging.exists():
        shutil.rmtree(staging)
    trainer.accelerator.wait_for_everyone()
    needed = model_bytes(trainer.accelerator.unwrap_model(trainer.model))
    with output_space(final_dir, needed, "the final model"):
        try:
            trainer.save_model(str(staging))
        except Exception:
            if trainer.accelerator.is_main_process:  # a staging directory left behind holds the space a rerun needs
                shutil.rmtree(staging, ignore_errors=True)
            raise
        trainer.accelerator.wait_for_everyone()
        if trainer.accelerator.is_main_process:
            publish_directory(staging, final_dir)
    trainer.accelerator.wait_for_everyone()


def publish_metrics(working: Path, published: Path) -> None:
    """Copy the complete working metrics log to the stage output ``published`` atomically, sealed."""
    publish_text(published, working.read_text(encoding="utf-8"))


def publish_outputs(
    trainer: ResumableGRPOTrainer,
    run_dir: Path,
    export_steps: frozenset[int],
    final_step: int,
    finished_checkpoint: Path | None,
    hub: list[dict[str, Any]] | None = None,
) -> None:
    """Publish the stage outputs: the exports, the final model (saved by the trainer, or linked from
    ``finished_checkpoint`` when an earlier attempt finished training), the provenance (with the health check's
    summary of the run, pipeline.runtime.health, and the ``hub`` commits the start model was loaded at) and, last,
    the metrics."""
    is_main = trainer.accelerator.is_main_process
    settings = RuntimeSettings.current()
    if is_main:
        publish_exports(run_dir, export_steps, final_step, settings.checkpoint_volume)
    if finished_checkpoint is None:
        save_final(trainer, run_dir / FINAL_CHECKPOINT)
    elif is_main:
        export_model(finished_checkpoint, run_dir / FINAL_CHECKPOINT)
    if is_main:
        working_metrics = working_metrics_path(run_dir, settings.checkpoint_volume)
        health = summary(read_jsonl(working_metrics), settings.health)
        write_provenance(run_dir / PROVENANCE_FILE, "train", runtime=settings.record(), health=health, hub=hub)
        publish_metrics(working_metrics, run_dir / METRICS_FILE)
