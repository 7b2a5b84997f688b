"""The settings of the training data's sources that ``python -m pipeline.prepare_data`` reads (``data.deepmath``,
``data.jsonl``, ``data.decontaminate``), declared once with their defaults: the stage builds them from its spec
(``pipeline.core.specs.dataclass_from_mapping``: an unknown key or a mistyped value is refused by name), the
planner's hub references read the DeepMath defaults from here, and a test holds configs/schema.yaml's defaults
to these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# python_random: random.Random(seed); datasets: upstream's Dataset.shuffle(seed) order over every row (spec 5)
Shuffle = Literal["python_random", "datasets"]


@dataclass(frozen=True)
class DeepMathSource:
    """``data.deepmath``: DeepMath-103K from the Hub, shuffled, optionally cut to its first ``max_rows``."""

    hub_id: str = "trl-lib/DeepMath-103K"
    # No published commit of trl-lib/DeepMath-103K was found; pin one in the config for a fixed study.
    revision: str = "main"
    split: str = "train"
    cache_dir: str | None = None
    max_rows: int | None = None
    shuffle_seed: int = 42  # upstream shuffles the training split with seed 42 (spec 5)
    shuffle: Shuffle = "python_random"


@dataclass(frozen=True)
class JsonlSource:
    """``data.jsonl``: a local JSONL file of rows with ``problem`` and ``answer`` (a stage run by hand)."""

    path: str
    max_rows: int | None = None
    shuffle_seed: int = 42


@dataclass(frozen=True)
class Decontamination:
    """``data.decontaminate``: drop training rows sharing a word n-gram with a benchmark problem."""

    enabled: bool = False
    ngram: int = 13
