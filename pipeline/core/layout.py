"""Names and path templates of the results layout, shared by the Snakefile and the stages (no third-party imports:
the Snakefile imports this module).

Templates are relative to the study's ``results_dir`` and hold Snakemake-style wildcards: ``{model}``,
``{method}``, ``{seed}``, ``{checkpoint}``, ``{benchmark}``. ARCHITECTURE.md "Run layout" describes each path.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

BASELINE_METHOD = "base"  # the method name of a model's starting point in results/eval and the tables
START_CHECKPOINT = "start"  # the checkpoint label of that starting point (results/models/<model>/start)
FINAL_CHECKPOINT = "final"  # a run's final model (RUN_DIR/final), and its checkpoint label
EXPORT_PREFIX = "step-"  # RUN_DIR/exports/step-N, and the checkpoint label of training step N
METRICS_FILE = "metrics.jsonl"  # a run's training metrics (one line per logging step)
PROVENANCE_FILE = "provenance.json"  # a run's library versions (pipeline.core.provenance)
EXPORTS_DIR = "exports"
CHECKPOINTS_DIR = "checkpoints"  # the resumable working directory of a run (not a Snakemake output)

TRAIN_DATA = "data/train.jsonl"
DATA_CARD = "data/data_card.json"
AUDIT = "audit/{benchmark}.json"
SOURCE_MODEL = "models/{model}/source"  # a model built here from an installed package (rule prepare_model)
START_MODEL = "models/{model}/" + START_CHECKPOINT
RUN_DIR = "runs/{model}/{method}/seed{seed}"
SAMPLES = "eval/{model}/{method}/seed{seed}/{checkpoint}/{benchmark}.jsonl"
SAMPLES_PROVENANCE = "eval/{model}/{method}/seed{seed}/{checkpoint}/{benchmark}.provenance.json"
TABLES_DIR = "tables"
TABLE_FILES = ("scores.csv", "summary.csv", "summary.md", "summary.xlsx", "variance.csv", "variance.md")
# in TABLES_DIR: pipeline.stats.variance's components per (model, method, checkpoint, benchmark)
VARIANCE_TABLE = "variance.csv"
FIGURES_DIR = "figures"
SCORES_FIGURE = "scores_by_benchmark.png"
TRAINING_CURVES_FIGURE = "training_curves.png"
TRAINING_DIAGNOSTICS_FIGURE = "training_diagnostics.png"
SIGNIFICANCE = "stats/significance.json"
SIGNIFICANCE_MD = "stats/significance.md"
TOKEN_ANALYSIS = "token_analysis/{model}/{method}/seed{seed}"
CREDIT_PLACEMENT = "credit_placement/{model}"  # placement.json and placement.png (pipeline.credit_placement)
REPORT = "report.md"
CODE_CHANGES = "provenance/accepted_code_changes.jsonl"  # written by pipeline.why_rerun --accept


def export_label(step: int) -> str:
    """``step-N``: the checkpoint label, and the export directory's name, of training step N."""
    return f"{EXPORT_PREFIX}{int(step)}"


def checkpoint_label(checkpoint: int | str) -> str:
    """``final`` stays ``final``; a training step N becomes ``step-N``."""
    return FINAL_CHECKPOINT if checkpoint == FINAL_CHECKPOINT else export_label(int(checkpoint))


def label_step(label: str) -> int:
    """N of a ``step-N`` label."""
    return int(label.removeprefix(EXPORT_PREFIX))


def run_model_dir(run_dir: str, label: str) -> str:
    """The model of checkpoint ``label`` of a run: ``RUN_DIR/final`` or ``RUN_DIR/exports/step-N`` (a string, so
    that a storage provider's URL keeps its ``//``)."""
    if label == FINAL_CHECKPOINT:
        return posixpath.join(run_dir, FINAL_CHECKPOINT)
    return posixpath.join(run_dir, EXPORTS_DIR, label)


def samples_provenance(samples: Path) -> Path:
    """The library versions of an evaluation, beside its samples: ``<benchmark>.provenance.json``."""
    return samples.with_suffix(".provenance.json")


def working_dir(run_dir: Path, volume: str | None = None) -> Path:
    """A training run's resumable working directory (its checkpoints, working metrics and exports): ``RUN_DIR/
    checkpoints``, or, with a ``volume`` (the run-time setting ``checkpoint_volume``: a directory that outlives the
    job's own disk, such as a Kubernetes pod's PersistentVolumeClaim), the same path under the volume, so that the
    retry of an evicted job, in a fresh pod, finds the checkpoints."""
    if volume is None:
        return run_dir / CHECKPOINTS_DIR
    return Path(volume) / run_dir.relative_to(run_dir.anchor) / CHECKPOINTS_DIR


def working_metrics_path(run_dir: Path, volume: str | None = None) -> Path:
    """The metrics log appended during training; not a Snakemake output, so a failed job's cleanup keeps it."""
    return working_dir(run_dir, volume) / METRICS_FILE


def working_exports_dir(run_dir: Path, volume: str | None = None) -> Path:
    """Where each export step's model is saved during training; kept when a failed job's outputs are deleted and
    when its checkpoint is rotated away (``save_total_limit``)."""
    return working_dir(run_dir, volume) / EXPORTS_DIR
