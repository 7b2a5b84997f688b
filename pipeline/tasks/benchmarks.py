"""Benchmark sources and their normalization into rows ``{"id", "problem", "answer", "source"}``.

Each public source keeps the problem, the gold and the id under its own field names (spec 6.3,
docs/spec.md). A ``SourceFormat`` lists them in priority order; one set of functions then turns any
row into the common schema, so a local JSONL file in a source's format goes through the same code as the Hub:

    problem = context + "\\n" + question   (OlympiadBench's optional context) or the first problem field
    gold    = first present gold field, normalized by ``gold_text`` (gold format "clean", the default):
              list   -> elements joined by ", " (each with its enclosing $...$ stripped)
              str    -> last complete \\boxed{} when it holds one (Minerva's solution), enclosing $...$ stripped
              number -> integral floats without ".0" (AMC's 27.0 -> "27"), others as Python prints them
              or as upstream's scorer saw it (gold format "upstream", ``upstream_gold_text``, spec 6.2-6.4):
              str(value) (OlympiadBench's list -> "['$(3,0),(-3,1)$']", AMC's 27.0 -> "27.0"); Minerva's gold
              is the boxed answer of ``solution`` by upstream's extractor (``upstream_gold_fields``)
    id      = the source's own id field, or its ``composite_id_fields`` joined by ":" (CollegeMATH has no id)
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from pipeline.core.declared import refuse_out_of_range
from pipeline.core.io import InputError, jsonl_rows, load_spec
from pipeline.core.specs import dataclass_from_mapping
from pipeline.tasks.arith import ArithmeticSpec, Operation
from pipeline.tasks.boxed import last_boxed
from pipeline.tasks.gsm import GsmSymbolicSpec

DEFAULT_SUBSET_SEED = 42
GOLD_FORMATS = ("clean", "upstream")
# One math block around the whole text: "$x$" or "$$x$$", no "$" inside.
ENCLOSING_DOLLARS = re.compile(r"^\s*\$+([^$]*?)\$+\s*$", re.DOTALL)


class SkipRow(ValueError):
    """A data row that cannot be used (missing, empty or mistyped field); the message is the reason."""


Normalize = Callable[[dict[str, Any], int], dict[str, str]]  # (row, index) -> item, or SkipRow


@dataclass(frozen=True)
class SourceFormat:
    """Where a source lives on the Hub (its pinned defaults) and which fields hold what, in priority order."""

    hub_id: str | None
    split: str | None
    revision: str | None
    problem_fields: tuple[str, ...]
    gold_fields: tuple[str, ...]
    id_fields: tuple[str, ...] = ("id",)
    config: str | None = None
    context_field: str | None = None
    subset_size: int | None = None
    composite_id_fields: tuple[str, ...] = ()
    upstream_gold_fields: tuple[str, ...] | None = None
    rows: int | None = None  # rows of the pinned split (the cost estimate's items when there is no subset)

    def gold_fields_for(self, gold_format: str) -> tuple[str, ...]:
        """The gold fields in priority order for ``gold_format`` (clean or upstream)."""
        if gold_format == "upstream" and self.upstream_gold_fields is not None:
            return self.upstream_gold_fields
        return self.gold_fields


# Revisions: the MATH-500 and aime_2024 pins are the Hub commits other projects pin (found with the code search);
# no commit of the other repositories was found, so they track "main": pin them in the config for a fixed study.
SOURCE_FORMATS: dict[str, SourceFormat] = {
    "math500": SourceFormat(
        hub_id="HuggingFaceH4/MATH-500",
        rows=500,
        split="test",
        revision="6e4ed1a2a79af7d8630a6b768ec859cb5af4d3be",
        problem_fields=("problem",),
        gold_fields=("answer",),
        id_fields=("unique_id", "id"),
    ),
    "aime24": SourceFormat(
        hub_id="HuggingFaceH4/aime_2024",
        rows=30,
        split="train",  # the Hub repository's only split; all 30 rows are the held-out benchmark
        revision="2fe88a2f1091d5048c0f36abc874fb997b3dd99a",
        problem_fields=("problem",),
        gold_fields=("answer",),
    ),
    "amc23": SourceFormat(
        hub_id="math-ai/amc23",
        rows=40,
        split="test",
        revision="main",
        problem_fields=("problem", "question"),
        gold_fields=("answer",),
    ),
    "minerva": SourceFormat(
        hub_id="math-ai/minervamath",
        rows=272,
        split="test",
        revision="main",
        problem_fields=("problem", "question"),
        gold_fields=("answer", "solution"),
        id_fields=("idx", "id"),
        upstream_gold_fields=("solution", "answer"),  # upstream grades against the boxed answer of the solution
    ),
    "olympiadbench": SourceFormat(
        hub_id="Hothan/OlympiadBench",
        config="OE_TO_maths_en_COMP",
        split="train",
        revision="main",
        problem_fields=("question", "problem"),
        gold_fields=("final_answer", "answer"),
        context_field="context",
        subset_size=200,
    ),
    "collegemath": SourceFormat(
        hub_id="di-zhang-fdu/College_Math_Test",
        split="test",
        revision="main",
        problem_fields=("problem", "question"),
        gold_fields=("answer", "solution"),
        subset_size=200,
        composite_id_fields=("data_source", "question_number"),
    ),
    # Upstream's src/eval/eval_data files (Qwen2.5-Math evaluation format): every file has "problem"; the gold is
    # "final_answer" (OlympiadBench), "answer" (MATH, AIME, AMC, CollegeMATH) or the boxed "solution" (Minerva).
    "qwen_jsonl": SourceFormat(
        hub_id=None,
        split=None,
        revision=None,
        problem_fields=("problem", "question"),
        gold_fields=("final_answer", "answer", "solution"),
        id_fields=("id", "idx", "unique_id"),
    ),
}


def arithmetic_spec(spec: Any, where: str) -> ArithmeticSpec:
    """An ArithmeticSpec from a config mapping, checked against its declaration (keys, types, ranges) and for
    ``low <= high``."""
    if isinstance(spec, dict) and "operations" in spec:
        operations = spec["operations"]
        if not isinstance(operations, list) or not operations or not set(operations) <= set(get_args(Operation)):
            raise InputError(f"{where}.operations: expected a non-empty list of '+', '-', '*', got {operations!r}")
        spec = {**spec, "operations": tuple(operations)}
    result = dataclass_from_mapping(ArithmeticSpec, spec, where)
    refuse_out_of_range(result, where)
    if result.low > result.high:
        raise InputError(f"{where}: low {result.low} is above high {result.high}")
    return result


def gsm_symbolic_settings(spec: Any, where: str) -> dict[str, int]:
    """{count, seed} of a GSM-Symbolic spec, checked against its declaration (``GsmSymbolicSpec``: both required,
    their types and ranges)."""
    result = dataclass_from_mapping(GsmSymbolicSpec, spec, where)
    refuse_out_of_range(result, where)
    return dataclasses.asdict(result)


def strip_enclosing_dollars(text: str) -> str:
    """``"$x$"`` or ``"$$x$$"`` -> ``"x"``; text with a ``$`` inside the block, or none around it, unchanged."""
    match = ENCLOSING_DOLLARS.match(text)
    return (match.group(1) if match else text).strip()


def number_text(value: int | float) -> str:
    """An int, or a float without a spurious ".0" (27.0 -> "27", 2.5 -> "2.5"); NaN/Inf and bools are refused."""
    if isinstance(value, bool):
        raise SkipRow("non-string answer (bool)")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SkipRow(f"non-finite number answer ({value})")
        if value.is_integer():
            return str(int(value))
    return str(value)


def answer_text(value: Any) -> str:
    """A gold given as a string or a number, as a non-empty stripped string; anything else is a SkipRow."""
    if isinstance(value, str):
        text = value.strip()
    elif isinstance(value, int | float):
        text = number_text(value)
    else:
        raise SkipRow(f"non-string answer ({type(value).__name__})")
    if not text:
        raise SkipRow("empty answer")
    return text


def gold_text(value: Any) -> str:
    """The gold as the grader should see it (module docstring): list joined, boxed content, $ stripped."""
    if isinstance(value, list | tuple):
        if not value:
            raise SkipRow("empty answer list")
        return ", ".join(strip_enclosing_dollars(answer_text(element)) for element in value)
    text = answer_text(value)
    if "\\boxed" in text:
        boxed = last_boxed(text)
        if not boxed:
            raise SkipRow("solution has no complete, non-empty \\boxed{}")
        text = boxed
    gold = strip_enclosing_dollars(text)
    if not gold:
        raise SkipRow("empty answer")
    return gold


def upstream_gold_text(value: Any) -> str:
    """The gold as upstream's scorer grades it: ``str(value)``, or a boxed string's last box by upstream's
    extractor (it stops at the first unclosed box and keeps the content unstripped), as for Minerva's solution."""
    if isinstance(value, bool):
        raise SkipRow("non-string answer (bool)")
    text = str(value)
    if "\\boxed" in text:
        text = last_boxed(text, "upstream") or ""
    if not text.strip():
        raise SkipRow("empty answer")
    return text


def first_present(row: dict[str, Any], fields: tuple[str, ...], what: str) -> tuple[str, Any]:
    """(field, value) of the first of ``fields`` present in ``row`` with a value that is not None."""
    for field in fields:
        if row.get(field) is not None:
            return field, row[field]
    raise SkipRow(f"missing {what} field (one of {', '.join(fields)})")


def problem_text(row: dict[str, Any], source: SourceFormat) -> str:
    """The question (after its context, when the source has one) as a non-empty string."""
    field, value = first_present(row, source.problem_fields, "problem")
    if not isinstance(value, str):
        raise SkipRow(f"field '{field}' is not a string ({type(value).__name__})")
    if not value.strip():
        raise SkipRow(f"empty field '{field}'")
    context = row.get(source.context_field) if source.context_field else None
    if isinstance(context, str) and context.strip():
        return f"{context.strip()}\n{value.strip()}"
    return value.strip()


def item_id(row: dict[str, Any], index: int, source: SourceFormat) -> str:
    """The row's own id (first of the source's id fields, or its composite id fields joined by ":") as a string,
    else its position in the split."""
    parts = [row.get(field) for field in source.composite_id_fields]
    if parts and all(isinstance(part, str) and part.strip() for part in parts):
        return ":".join(part.strip() for part in parts)
    for field in source.id_fields:
        value = row.get(field)
        if isinstance(value, str | int) and not isinstance(value, bool) and str(value).strip():
            return str(value).strip()
    return str(index)


def normalize_row(
    row: dict[str, Any], index: int, source: SourceFormat, label: str, gold_format: str = "clean"
) -> dict[str, str]:
    """One source row -> ``{"id", "problem", "answer", "source"}``; raises SkipRow with the reason."""
    problem = problem_text(row, source)
    field, gold = first_present(row, source.gold_fields_for(gold_format), "answer")
    # A worked solution is a gold only through its box (upstream extracts the last \boxed{} of Minerva's solution).
    if field == "solution" and "\\boxed" not in str(gold):
        raise SkipRow("field 'solution' has no \\boxed{} answer")
    answer = upstream_gold_text(gold) if gold_format == "upstream" else gold_text(gold)
    return {"id": item_id(row, index, source), "problem": problem, "answer": answer, "source": label}


@dataclass(frozen=True)
class RowCheck:
    """What ``check_rows`` found: the usable items, the rows it skipped as ``(place, index, reason)``, and the
    problems that refuse the whole file as ``(place, reason)``."""

    label: str
    items: list[dict[str, str]]
    skipped: list[tuple[int, int, str]]
    problems: list[tuple[int, str]]

    def messages(self, *, strict: bool = False) -> list[str]:
        """Every problem as ``"LABEL:PLACE: reason"`` in file order; ``strict``: the skipped rows too."""
        found = self.problems + ([(place, reason) for place, _, reason in self.skipped] if strict else [])
        return [f"{self.label}:{place}: {reason}" for place, reason in sorted(found)]


def check_rows(rows: Iterable[tuple[int, dict[str, Any] | str]], label: str, normalize: Normalize) -> RowCheck:
    """Every row of ``rows`` (``(place, row)``: a file's line number, ``jsonl_rows``, or a split's row number; a
    string row is a line that did not parse) through ``normalize(row, index)``, ``index`` counting the rows that
    parsed from 0 (an id-less row's id). A SkipRow is a skipped row; a line that did not parse and an id that an
    earlier row has are problems, every one: the stages and the plan-time input check (pipeline.study.inputs)
    share it.
    """
    items: list[dict[str, str]] = []
    skipped: list[tuple[int, int, str]] = []
    problems: list[tuple[int, str]] = []
    first_place: dict[str, int] = {}
    index = 0
    for place, row in rows:
        if isinstance(row, str):
            problems.append((place, row))
            continue
        try:
            item = normalize(row, index)
        except SkipRow as reason:
            skipped.append((place, index, str(reason)))
        else:
            if item["id"] in first_place:
                problems.append((place, f"duplicate id {item['id']!r} (first at {label}:{first_place[item['id']]})"))
            else:
                first_place[item["id"]] = place
                items.append(item)
        index += 1
    return RowCheck(label, items, skipped, problems)


def check_file(path: str, source: SourceFormat, gold_format: str) -> RowCheck:
    """``check_rows`` of a local JSONL file in ``source``'s format, streamed line by line (places: line numbers)."""
    return check_rows(jsonl_rows(path), path, source_normalizer(source, path, gold_format))


def source_normalizer(source: SourceFormat, label: str, gold_format: str) -> Normalize:
    """``normalize_row`` of one source and gold format, as ``check_rows`` calls it."""
    if gold_format not in GOLD_FORMATS:
        raise InputError(f"{label}: gold must be one of {', '.join(GOLD_FORMATS)}, got {gold_format!r}")
    return lambda row, index: normalize_row(row, index, source, label, gold_format)


def usable_rows(check: RowCheck) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
    """The items and the skipped rows ``[{"row": index, "reason": str}]`` (the audit's) of a ``check_rows`` that
    found no problem; otherwise one InputError naming every problem."""
    if check.problems:
        raise InputError("\n".join(check.messages()))
    return check.items, [{"row": index, "reason": reason} for _, index, reason in check.skipped]


def normalize_rows(
    rows: list[dict[str, Any]], source: SourceFormat, label: str, gold_format: str = "clean"
) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
    """``usable_rows`` of a split's rows (places: row numbers from 1); a repeated id is refused."""
    return usable_rows(check_rows(enumerate(rows, start=1), label, source_normalizer(source, label, gold_format)))


def load_hub_rows(
    hub_id: str, *, config: str | None, split: str, revision: str | None, cache_dir: str | None
) -> list[dict[str, Any]]:
    """Rows of a Hub dataset (or a local dataset directory) through ``datasets.load_dataset``.

    Offline mode (HF_DATASETS_OFFLINE=1) and the cache are ``datasets``' own: a pinned revision already in the
    cache loads without the network. Any loading failure becomes an InputError naming the dataset.
    """
    import datasets

    try:
        dataset = datasets.load_dataset(hub_id, config, split=split, revision=revision, cache_dir=cache_dir)
    except Exception as error:
        where = f"{hub_id}" + (f" (config {config})" if config else "") + f" split {split} revision {revision}"
        raise InputError(
            f"cannot load {where}: {type(error).__name__}: {error}. Offline runs need the revision in the "
            "datasets cache (cache_dir / HF_DATASETS_CACHE); or give a local JSONL file as 'path'"
        ) from None
    return [dict(row) for row in dataset]


def select_subset(items: list[dict[str, str]], size: int, seed: int) -> list[dict[str, str]]:
    """``size`` items drawn without replacement by ``random.Random(seed)``, kept in their original order."""
    if size >= len(items):
        return list(items)
    chosen = sorted(random.Random(seed).sample(range(len(items)), size))
    return [items[index] for index in chosen]


def items_with_ids(items: list[dict[str, str]], ids: list[str], ids_file: str | Path) -> list[dict[str, str]]:
    """The items named by a recorded ids file, in the file's order; an id not in the data is refused."""
    by_id = {item["id"]: item for item in items}
    missing = [item for item in ids if item not in by_id]
    if missing:
        raise InputError(f"{ids_file}: ids not found in the benchmark data: {', '.join(missing[:5])}")
    return [by_id[item] for item in ids]


def read_subset_ids(path: Path) -> list[str]:
    """Ids of a recorded subset file: a JSON list, or an object with an ``ids`` list."""
    recorded = load_spec(str(path))
    ids = recorded.get("ids") if isinstance(recorded, dict) else recorded
    if not isinstance(ids, list) or not ids:
        raise InputError(f"{path}: expected a non-empty list of ids (or an object with 'ids')")
    return [str(item) for item in ids]
