"""Live experiment tracking through transformers' own ``report_to`` integrations (TensorBoard, Weights & Biases).

The study config's ``tracking`` section (``TrackingConfig``) reaches the training stage as ``--tracking`` (JSON);
the stage adds the run's name (``<model>/<method>/seed<s>``) and the tracking directory. Every log dict the trainer
writes to ``metrics.jsonl`` (TRL's keys, ``grail/...``, ``oar_g/...``) also goes to the selected integrations:

- tensorboard: event files in ``<dir>/tensorboard/<model>/<method>/seed<s>/`` (transformers names the keys
  ``train/<key>``): ``tensorboard --logdir <results>/tracking/tensorboard`` shows one run per (model, method, seed).
- wandb: a run named ``<model>/<method>/seed<s>`` in ``project``, grouped by ``study``, files under
  ``<dir>/wandb/``. Its id is derived from (study, run name), so a resumed (requeued) job continues the same run.
  ``WANDB_MODE=offline`` keeps it local (``wandb sync <dir>/wandb/offline-run-*`` uploads it later); the API key
  is read by wandb from the environment only (``WANDB_API_KEY``) and never passed through this code.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.declared import refuse_out_of_range, setting
from pipeline.core.io import InputError, load_spec

INTEGRATIONS = ("tensorboard", "wandb")
NO_TRACKING = "none"


@dataclass(frozen=True)
class TrackingConfig:
    """Live training curves through transformers' report_to (metrics.jsonl is written either way); runs are named
    <model>/<method>/seed<s>, grouped by `study`.

    The ``tracking`` section of the study config, declared here once (``pipeline.core.declared``)."""

    report_to: str | list[str] = setting(
        NO_TRACKING,
        "the trackers: none, one, or a list",
        json={
            "anyOf": [
                {"enum": [NO_TRACKING, *INTEGRATIONS]},
                {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"enum": list(INTEGRATIONS)}},
            ]
        },
    )
    project: str = setting("grail", "the W&B project", non_empty=True)
    study: str = setting("default", "the W&B group of this study's runs", shared="name")

    def __post_init__(self) -> None:
        refuse_out_of_range(self, "tracking")

    def integrations(self) -> list[str]:
        """The selected integrations, in transformers' ``report_to`` form (``[]`` for none)."""
        selected = [self.report_to] if isinstance(self.report_to, str) else list(self.report_to)
        unknown = sorted(set(selected) - {*INTEGRATIONS, NO_TRACKING})
        if unknown:
            raise ValueError(
                f"report_to: unknown integration(s) {unknown} (choose from {[NO_TRACKING, *INTEGRATIONS]})"
            )
        return [name for name in selected if name != NO_TRACKING]


def run_name(model: str, method: str, seed: int | str) -> str:
    """The name a run has in every tracker: ``<model>/<method>/seed<s>``."""
    return f"{model}/{method}/seed{seed}"


def wandb_run_id(study: str, name: str) -> str:
    """A W&B run id fixed by (study, run name): a requeued job resumes the same run. W&B ids allow [a-z0-9_-]."""
    readable = re.sub(r"[^a-z0-9_-]+", "-", f"{study}-{name}".lower()).strip("-")[:48]
    return f"{readable}-{hashlib.sha256(f'{study}/{name}'.encode()).hexdigest()[:8]}"


def tensorboard_dir(tracking_dir: Path, name: str) -> Path:
    """Where a run's TensorBoard event files go."""
    return tracking_dir / "tensorboard" / name


@contextmanager
def environment(variables: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of the block, then restore the previous values."""
    previous = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def tensorboard_environment(config: TrackingConfig, name: str, tracking_dir: Path) -> dict[str, str]:
    """Environment for building the trainer: transformers' TensorBoardCallback reads its directory from
    ``TENSORBOARD_LOGGING_DIR`` when it is created."""
    if "tensorboard" not in config.integrations():
        return {}
    return {"TENSORBOARD_LOGGING_DIR": str(tensorboard_dir(tracking_dir, name))}


@contextmanager
def wandb_run(config: TrackingConfig, name: str, tracking_dir: Path, is_main_process: bool) -> Iterator[None]:
    """The block in which the trainer trains: with wandb selected, the main process starts the W&B run with its
    name, group (the study) and id; transformers' WandbCallback then logs into this run instead of starting one."""
    if "wandb" not in config.integrations() or not is_main_process:
        yield
        return
    import wandb

    tracking_dir.mkdir(parents=True, exist_ok=True)
    run: Any = wandb.init(
        project=config.project,
        group=config.study,
        name=name,
        id=wandb_run_id(config.study, name),
        resume="allow",
        dir=str(tracking_dir),
    )
    try:
        yield
    finally:
        run.finish()


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
