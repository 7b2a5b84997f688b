"""The training data's settings that ``python -m pipeline.prepare_data`` reads (``data``: its own keys, and the
sources ``data.deepmath``, ``data.jsonl``, ``data.decontaminate``), declared once with their defaults: the stage
builds them from its spec (``pipeline.core.specs.dataclass_from_mapping``: an unknown key, a missing required one
or a mistyped value is refused by name), the planner's hub references read the DeepMath defaults from here, and
``python -m tools.schema`` writes configs/schema.yaml's entries from them. ``data.generated`` is
``pipeline.tasks.arith.ArithmeticSpec``, ``data.gsm_symbolic`` ``pipeline.tasks.gsm.GsmSymbolicSpec``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

from pipeline.core.declared import Range, refuse_out_of_range, setting
from pipeline.tasks.prompts import PromptTemplate

# jsonl: a local file, for a stage run by hand (a planned study's data come from the other three)
TrainingSource = Literal["generated", "deepmath", "gsm_symbolic", "jsonl"]
STUDY_SOURCES = tuple(source for source in get_args(TrainingSource) if source != "jsonl")
# a field holding one source's own mapping (data.generated, ...): the stage builds it from that source's declaration
# when the source is chosen, and the schema gives it an entry of its own, not one of DataSpec's setting lines
SOURCE_SECTION = {"section": True}
# python_random: random.Random(seed); datasets: upstream's Dataset.shuffle(seed) order over every row (spec 5)
Shuffle = Literal["python_random", "datasets"]


@dataclass(frozen=True)
class DeepMathSource:
    """DeepMath-103K from the Hub: the training split, shuffled, optionally cut to its first max_rows.

    ``data.deepmath``, declared here once (``pipeline.core.declared``)."""

    # read only under data.source deepmath: a study of another source gets no deepmath key filled in
    filled_by_default: ClassVar[bool] = False

    # No published commit of trl-lib/DeepMath-103K was found; pin one in the config for a fixed study.
    hub_id: str = setting("trl-lib/DeepMath-103K", "the dataset's Hub id", non_empty=True)
    revision: str = setting(
        "main", "the dataset's revision (pin a commit: python -m pipeline.pin_revisions)", non_empty=True
    )
    split: str = setting("train", "the split the training rows come from", non_empty=True)
    cache_dir: str | None = setting(None, "the datasets cache (null: the library's default under HF_HOME)")
    max_rows: int | None = setting(None, "keep the first rows after shuffling (null: all)", Range(minimum=1))
    # upstream shuffles the training split with seed 42 (spec 5)
    shuffle_seed: int = setting(42, "the seed of the shuffle", Range(minimum=0))
    shuffle: Shuffle = setting(
        "python_random",
        "python_random: random.Random(seed); datasets: upstream's Dataset.shuffle(seed) order (numpy default_rng "
        "permutation) over every row, no row dropped",
    )

    def __post_init__(self) -> None:
        refuse_out_of_range(self, "data.deepmath")


@dataclass(frozen=True)
class JsonlSource:
    """``data.jsonl``: a local JSONL file of rows with ``problem`` and ``answer`` (a stage run by hand)."""

    path: str
    max_rows: int | None = None
    shuffle_seed: int = 42


@dataclass(frozen=True)
class Decontamination:
    """Drop training rows that share a word n-gram with a benchmark problem (the data card lists them).

    ``data.decontaminate``, declared here once (``pipeline.core.declared``)."""

    enabled: bool = setting(
        False, "drop training rows that share an n-gram with any benchmark's problems (the data card lists them)"
    )
    ngram: int = setting(13, "the n-gram length in words", Range(minimum=1))

    def __post_init__(self) -> None:
        refuse_out_of_range(self, "data.decontaminate")


@dataclass(frozen=True)
class DataSpec:
    """The training data (``data``, the prepare_data stage's DATA_SPEC): where the rows come from and the prompt
    they are asked in.

    Its own keys are declared here once (``python -m tools.schema`` writes them into the schema's ``data`` entry,
    whose per-source rules stay beside them); each source's keys are their own section's."""

    # a study must name its source (the schema's `required`); a stage run by hand gets generated arithmetic
    source: TrainingSource = setting(
        "generated",
        "where the training rows come from: generated arithmetic (`generated`), DeepMath-103K from the Hub "
        "(`deepmath`), or GSM-Symbolic variants from the installed package (`gsm_symbolic`)",
        json={"enum": list(STUDY_SOURCES)},
        schema_default=False,
    )
    prompt_template: PromptTemplate = setting("clean", "the prompt's wording", shared="prompt_template")
    generated: dict[str, Any] | None = field(default=None, metadata=SOURCE_SECTION)
    gsm_symbolic: dict[str, Any] | None = field(default=None, metadata=SOURCE_SECTION)
    deepmath: dict[str, Any] | None = field(default=None, metadata=SOURCE_SECTION)
    jsonl: dict[str, Any] | None = field(default=None, metadata=SOURCE_SECTION)
    decontaminate: dict[str, Any] | None = field(default=None, metadata=SOURCE_SECTION)
