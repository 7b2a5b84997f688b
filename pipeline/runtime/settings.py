"""Run-time settings: how a job runs, never what it computes. One route for all of them.

    settings = RuntimeSettings.current()    # in any process of a job: launcher, training ranks, evaluation

The settings (``RuntimeSettings``; config keys in parentheses):
- ``watchdog``: the stall watchdog's bounds (``watchdog.*``, pipeline.runtime.watchdog);
- ``health``: the training health check's thresholds (``health.*``, pipeline.runtime.health): they decide whether a
  run stops, never what a run that goes on computes;
- ``time_windows``: Slurm time-limit windows a training job may use (``time_windows``, pipeline.runtime.time_windows);
- ``ddp_timeout``: seconds a collective waits for the other ranks (``training.ddp_timeout``; None: transformers'
  default, 1800).
- ``checkpoint_volume``: the directory that holds training's working checkpoints (``checkpoint_volume``; None:
  the run directory), for executors whose jobs lose their own disk when they end (pipeline.core.layout.working_dir).

The route: the Snakefile puts the study's settings into the environment of every job (``RUNTIME_VARIABLE``, JSON;
a cluster job's Snakemake reads the config and sets it again), and every process of the job inherits it, so no
rule's command or params carry them: Snakemake records neither, a changed value reruns no job, and a run
resumed under other settings keeps its checkpoints (they are not part of a run's fingerprint). Each training run
and evaluation records the settings it ran with in its ``provenance.json``. A stage run on its own runs with the
defaults, or with the variable set by hand.

A new setting of this kind: a field here (with its default), its config key in configs/schema.yaml, its value in
``Study.runtime`` (pipeline.study.config), and the code that reads it calls ``RuntimeSettings.current()``
(docs/reruns.md, "Run-time settings").
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.io import InputError, canonical_json
from pipeline.core.specs import dataclass_from_mapping
from pipeline.runtime.health import HealthConfig
from pipeline.runtime.watchdog import WatchdogConfig

RUNTIME_VARIABLE = "GRAIL_RUNTIME"
# keys of the config's `training` section that are run-time settings, not part of a run's training spec
RUNTIME_TRAINING_KEYS = ("ddp_timeout",)


@dataclass(frozen=True)
class RuntimeSettings:
    """The run-time settings of a job (module docstring)."""

    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    time_windows: int = 1
    ddp_timeout: int | None = None
    checkpoint_volume: str | None = None

    def __post_init__(self) -> None:
        if self.time_windows < 1:
            raise InputError(f"{RUNTIME_VARIABLE}: time_windows must be at least 1, not {self.time_windows}")
        if self.ddp_timeout is not None and self.ddp_timeout < 1:
            raise InputError(f"{RUNTIME_VARIABLE}: ddp_timeout must be at least 1 second, not {self.ddp_timeout}")

    def record(self) -> dict[str, Any]:
        """The settings as plain JSON values (provenance, the environment)."""
        return dataclasses.asdict(self)

    @classmethod
    def current(cls, env: Mapping[str, str] | None = None) -> RuntimeSettings:
        """The settings this process runs with: ``RUNTIME_VARIABLE`` when set, else the defaults; an unknown key or a
        bad value raises InputError naming it."""
        text = (os.environ if env is None else env).get(RUNTIME_VARIABLE)
        if not text:
            return cls()
        try:
            mapping = json.loads(text)
        except json.JSONDecodeError as error:
            raise InputError(f"{RUNTIME_VARIABLE}: not JSON ({error})") from error
        if not isinstance(mapping, dict):
            raise InputError(f"{RUNTIME_VARIABLE}: expected a JSON object")
        return dataclass_from_mapping(cls, mapping, RUNTIME_VARIABLE)

    def export(self) -> None:
        """Set ``RUNTIME_VARIABLE`` for this process and every process it starts."""
        os.environ[RUNTIME_VARIABLE] = canonical_json(self.record())
