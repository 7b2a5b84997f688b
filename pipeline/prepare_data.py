"""Stage `prepare_data`: training rows (DeepMath-103K, generated arithmetic, GSM-Symbolic variants or a local JSONL
file) + data card.

    python -m pipeline.prepare_data --spec DATA_SPEC --out results/data/train.jsonl \\
        --card results/data/data_card.json [--decontaminate-against eval_data/A.jsonl ...]

DATA_SPEC: the study's ``data`` section (``pipeline.tasks.training_sources.DataSpec``, where each key is declared):
``source`` (generated, the default of a stage run by hand | deepmath | gsm_symbolic | jsonl), ``prompt_template``
(clean | upstream | bare; upstream reproduces the paper's U+0008 quirk, spec 5), and the chosen source's section:
``generated`` (ArithmeticSpec), ``deepmath`` (DeepMathSource; ``shuffle: datasets`` gives upstream's
``Dataset.shuffle(seed)`` order over every row, which refuses skipped rows and decontamination because they would
shift positions), ``gsm_symbolic`` (GsmSymbolicSpec: variants of the training templates, pipeline.tasks.gsm),
``jsonl`` (JsonlSource: rows with ``problem`` and ``answer``); ``decontaminate`` (Decontamination).

Output rows (ARCHITECTURE.md): ``{"id", "prompt": [{"role": "user", "content": ...}], "solution", "source"}``, and
``worked_solution`` (the warm-up's SFT target, ending in the boxed answer) for GSM-Symbolic rows;
the instruction is appended to the (last) user message, as upstream does for DeepMath's conversational prompt.

Answer policy: string answers are used stripped; integer and finite float answers are converted to strings
(27.0 -> "27"); missing, empty, boolean, null, list or object answers, and missing or empty problems, are skipped
and counted by reason in the card. Decontamination drops every training row that shares a word n-gram with a
benchmark problem (module ``word_ngrams``) and lists the dropped ids with the benchmarks they overlapped.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, get_args

import numpy as np
from tqdm import tqdm

from pipeline.core.disk_full import output_space
from pipeline.core.io import (
    InputError,
    atomic_write_json,
    jsonl_bytes,
    load_spec,
    publish_jsonl,
    read_jsonl,
    run_cli,
)
from pipeline.core.specs import dataclass_from_mapping
from pipeline.models.hub_cache import dataset_commit
from pipeline.tasks import gsm
from pipeline.tasks.arith import arithmetic_problems
from pipeline.tasks.benchmarks import (
    SkipRow,
    answer_text,
    arithmetic_spec,
    gsm_symbolic_settings,
    load_hub_rows,
)
from pipeline.tasks.prompts import build_prompt
from pipeline.tasks.training_sources import DataSpec, Decontamination, DeepMathSource, JsonlSource, Shuffle

SKIP_EXAMPLES = 20
# Words and single non-space symbols: "3+4=?" keeps its operators, so 3+4 and 3*4 differ.
TOKEN = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True)
class Record:
    """A validated training example before templating; ``problem`` is the text decontamination compares."""

    id: str
    messages: list[dict[str, Any]]
    problem: str
    solution: str
    worked_solution: str | None = None


def user_problem(messages: Any) -> str:
    """The content of the last user message of a conversational prompt; a malformed prompt is a SkipRow."""
    if not isinstance(messages, list) or not messages:
        raise SkipRow("prompt is not a non-empty list of messages")
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise SkipRow("prompt message without string content")
    users = [message["content"] for message in messages if message.get("role") == "user"]
    if not users or not users[-1].strip():
        raise SkipRow("prompt has no non-empty user message")
    return users[-1]


def plain_problem(row: dict[str, Any]) -> str:
    """A row's ``problem`` as a non-empty string; otherwise a SkipRow."""
    if "problem" not in row or row["problem"] is None:
        raise SkipRow("missing field 'problem'")
    if not isinstance(row["problem"], str):
        raise SkipRow(f"non-string problem ({type(row['problem']).__name__})")
    if not row["problem"].strip():
        raise SkipRow("empty problem")
    return row["problem"].strip()


def field_answer(row: dict[str, Any], field: str) -> str:
    """The gold of ``row[field]`` under the answer policy (module docstring)."""
    if field not in row or row[field] is None:
        raise SkipRow(f"missing field '{field}'")
    return answer_text(row[field])


def deepmath_record(row: dict[str, Any], index: int) -> Record:
    """A DeepMath row (``prompt`` conversational list + ``solution``) as a Record."""
    problem = user_problem(row.get("prompt"))
    return Record(f"deepmath-{index}", row["prompt"], problem, field_answer(row, "solution"))


def plain_record(row: dict[str, Any], index: int, prefix: str) -> Record:
    """A ``problem`` + ``answer`` row as a Record (a single user message); its own ``id`` when it has one."""
    problem = plain_problem(row)
    own_id = row.get("id")
    has_own_id = isinstance(own_id, str | int) and not isinstance(own_id, bool) and str(own_id).strip()
    identifier = str(own_id).strip() if has_own_id else f"{prefix}-{index}"
    messages = [{"role": "user", "content": problem}]
    return Record(identifier, messages, problem, field_answer(row, "answer"))


def validated_records(rows: list[dict[str, Any]], to_record: Any, desc: str) -> tuple[list[Record], list[dict]]:
    """Records of the usable rows and ``[{"row", "reason"}]`` of the skipped ones."""
    records, skipped = [], []
    for index, row in enumerate(tqdm(rows, desc=desc, unit="row")):
        try:
            records.append(to_record(row, index))
        except SkipRow as reason:
            skipped.append({"row": index, "reason": str(reason)})
    return records, skipped


def training_row(record: Record, template: str, source: str) -> dict[str, Any]:
    """The training schema: the record's messages with the instruction appended to the last user message."""
    last_user = max(i for i, message in enumerate(record.messages) if message.get("role") == "user")
    prompt = [{"role": message["role"], "content": message["content"]} for message in record.messages]
    prompt[last_user]["content"] = build_prompt(prompt[last_user]["content"], template)
    row = {"id": record.id, "prompt": prompt, "solution": record.solution, "source": source}
    if record.worked_solution is not None:
        row["worked_solution"] = record.worked_solution
    return row


def word_ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    """Lower-cased word/symbol n-grams of ``text``; a text shorter than n tokens is one gram (compared whole)."""
    tokens = TOKEN.findall(text.lower())
    if len(tokens) < n:
        return {tuple(tokens)} if tokens else set()
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def benchmark_ngrams(paths: list[str], n: int) -> dict[tuple[str, ...], set[str]]:
    """Every n-gram of every benchmark problem -> the names (file stems) of the benchmarks that contain it."""
    index: dict[tuple[str, ...], set[str]] = {}
    for path in paths:
        for number, row in enumerate(read_jsonl(path), start=1):
            if not isinstance(row.get("problem"), str):
                raise InputError(f"{path}:{number}: benchmark row without a string 'problem'")
            for gram in word_ngrams(row["problem"], n):
                index.setdefault(gram, set()).add(Path(path).stem)
    return index


def decontaminate(
    records: list[Record], index: dict[tuple[str, ...], set[str]], n: int
) -> tuple[list[Record], list[dict[str, Any]]]:
    """Records sharing no n-gram with a benchmark, and ``[{"id", "benchmarks"}]`` of the dropped ones."""
    kept, dropped = [], []
    for record in tqdm(records, desc="decontaminate", unit="row"):
        hits = set().union(*(index.get(gram, set()) for gram in word_ngrams(record.problem, n)))
        if hits:
            dropped.append({"id": record.id, "benchmarks": sorted(hits)})
        else:
            kept.append(record)
    return kept, dropped


def length_stats(values: list[int]) -> dict[str, float]:
    """min, mean, median, max of ``values`` (characters)."""
    return {
        "min": min(values),
        "mean": round(statistics.fmean(values), 2),
        "median": statistics.median(values),
        "max": max(values),
    }


def datasets_permutation(n: int, seed: int) -> list[int]:
    """The row order of ``datasets``' ``Dataset.shuffle(seed=seed)`` on n rows: ``default_rng(seed).permutation(n)``.

    Written out (rather than building an Arrow table to call it) so that no copy of the rows is made; the test
    suite checks it against ``Dataset.shuffle`` itself.
    """
    return np.random.default_rng(seed).permutation(n).tolist()


def shuffled_prefix(
    records: list[Record], seed: Any, max_rows: Any, where: str, shuffle: str = "python_random"
) -> list[Record]:
    """``records`` shuffled by ``random.Random(seed)`` (python_random) or in the order of ``datasets``'
    ``Dataset.shuffle(seed)`` (datasets, upstream's), then cut to ``max_rows`` (None keeps all)."""
    for key, value in (("shuffle_seed", seed), ("max_rows", max_rows)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise InputError(f"{where}.{key}: expected a non-negative integer, got {value!r}")
    if shuffle not in get_args(Shuffle):
        raise InputError(f"{where}.shuffle: expected one of {', '.join(get_args(Shuffle))}, got {shuffle!r}")
    if shuffle == "datasets":
        order = [records[index] for index in datasets_permutation(len(records), seed)]
    else:
        order = list(records)
        random.Random(seed).shuffle(order)
    return order if max_rows is None else order[:max_rows]


def refuse_position_shifts(skipped: list[dict[str, Any]], decontaminating: bool, where: str) -> None:
    """Upstream's order permutes every row of the split and its sampler draws by position: a dropped row would
    shift every later prompt, so skipped rows and decontamination are refused under ``shuffle: datasets``."""
    if skipped:
        first = skipped[0]
        raise InputError(
            f"{where}.shuffle: 'datasets' reproduces upstream's order only over every row, but {len(skipped)} "
            f"row(s) cannot be used (first: row {first['row']}, {first['reason']})"
        )
    if decontaminating:
        raise InputError(
            f"{where}.shuffle: 'datasets' reproduces upstream's order only over every row; "
            "data.decontaminate.enabled would drop rows"
        )


def load_records(spec: DataSpec) -> tuple[list[Record], list[dict], dict[str, Any], dict[str, Any]]:
    """Records, skipped rows, the card's provenance entries and the (seed, max_rows) to apply, per source."""
    source = spec.source
    if source == "generated":
        arithmetic = arithmetic_spec(spec.generated, "data.generated")
        rows = arithmetic_problems(arithmetic, id_prefix="train")
        records, skipped = validated_records(rows, lambda row, i: plain_record(row, i, "train"), "generated")
        return records, skipped, {"generated": asdict(arithmetic)}, {"shuffle_seed": None, "max_rows": None}
    if source == "gsm_symbolic":
        settings = gsm_symbolic_settings(spec.gsm_symbolic, "data.gsm_symbolic")
        records = [
            Record(p.id, [{"role": "user", "content": p.question}], p.question, p.answer, p.worked_solution)
            for p in gsm.variants(settings["count"], settings["seed"], "training", "gsm_symbolic")
        ]
        provenance = {"gsm_symbolic": settings | {"templates": "training", "package": gsm.package_version()}}
        return records, [], provenance, {"shuffle_seed": None, "max_rows": None}
    if source == "deepmath":
        deepmath = dataclass_from_mapping(DeepMathSource, spec.deepmath, "data.deepmath")
        rows = load_hub_rows(
            deepmath.hub_id, config=None, split=deepmath.split, revision=deepmath.revision, cache_dir=deepmath.cache_dir
        )
        records, skipped = validated_records(rows, deepmath_record, "deepmath")
        provenance = {"hub_id": deepmath.hub_id, "revision": deepmath.revision, "split": deepmath.split}
        provenance["commit"] = dataset_commit(deepmath.hub_id, deepmath.revision, deepmath.cache_dir)
        order = {"shuffle_seed": deepmath.shuffle_seed, "max_rows": deepmath.max_rows, "shuffle": deepmath.shuffle}
        return records, skipped, provenance, order
    if source == "jsonl":
        jsonl = dataclass_from_mapping(JsonlSource, spec.jsonl, "data.jsonl")
        prefix = Path(jsonl.path).stem
        records, skipped = validated_records(
            read_jsonl(jsonl.path), lambda row, i: plain_record(row, i, prefix), jsonl.path
        )
        return records, skipped, {"path": jsonl.path}, {"shuffle_seed": jsonl.shuffle_seed, "max_rows": jsonl.max_rows}
    raise AssertionError(f"data.source {source!r} passed DataSpec's check but has no loader")


def decontamination_settings(spec: DataSpec, against: list[str]) -> dict[str, Any]:
    """{enabled, ngram}: decontamination runs when benchmark files are given; enabling it without them is refused."""
    settings = dataclass_from_mapping(Decontamination, spec.decontaminate, "data.decontaminate")
    ngram = settings.ngram
    if settings.enabled and not against:
        raise InputError("data.decontaminate.enabled is true but no --decontaminate-against files were given")
    return {"enabled": bool(against), "ngram": ngram}


def prepare_data(spec: Any, against: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Training rows and the data card for DATA_SPEC ``spec``, decontaminated against ``against``."""
    data = dataclass_from_mapping(DataSpec, spec, "data")
    source, template = data.source, data.prompt_template
    contamination = decontamination_settings(data, against)
    records, skipped, provenance, order = load_records(data)
    if order.get("shuffle") == "datasets":
        refuse_position_shifts(skipped, contamination["enabled"], f"data.{source}")
    rows_read = len(records) + len(skipped)
    dropped: list[dict[str, Any]] = []
    if contamination["enabled"]:
        index = benchmark_ngrams(against, contamination["ngram"])
        records, dropped = decontaminate(records, index, contamination["ngram"])
    if order["shuffle_seed"] is not None:
        shuffle = order.get("shuffle", "python_random")
        records = shuffled_prefix(records, order["shuffle_seed"], order["max_rows"], f"data.{source}", shuffle)
    if not records:
        raise InputError(f"data: no usable training rows ({len(skipped)} skipped, {len(dropped)} decontaminated)")
    rows = [training_row(record, template, source) for record in records]
    card = {
        "source": source,
        **provenance,
        "prompt_template": template,
        "rows_read": rows_read,
        "rows_written": len(rows),
        **order,
        "answer_policy": "strings stripped; int and finite float answers converted (27.0 -> '27'); "
        "missing, empty, boolean, null, list and object answers skipped",
        "skipped": {
            "count": len(skipped),
            "by_reason": dict(Counter(entry["reason"] for entry in skipped)),
            "examples": skipped[:SKIP_EXAMPLES],
        },
        "decontamination": contamination
        | {
            "against": list(against),
            "dropped_count": len(dropped),
            "dropped_by_benchmark": dict(Counter(name for entry in dropped for name in entry["benchmarks"])),
            "dropped": dropped,
        },
        "lengths_chars": {
            "prompt": length_stats([sum(len(message["content"]) for message in row["prompt"]) for row in rows]),
            "solution": length_stats([len(row["solution"]) for row in rows]),
        },
    }
    return rows, card


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", required=True, help="DATA_SPEC: inline JSON or a JSON/YAML file")
    parser.add_argument("--out", required=True, help="output training JSONL")
    parser.add_argument("--card", required=True, help="output data card JSON")
    parser.add_argument("--decontaminate-against", nargs="*", default=[], help="benchmark JSONL files")
    args = parser.parse_args(argv)
    rows, card = prepare_data(load_spec(args.spec), args.decontaminate_against)
    with output_space(Path(args.out), lambda: jsonl_bytes(rows), "the training data"):
        publish_jsonl(args.out, rows)
    atomic_write_json(args.card, card)


if __name__ == "__main__":
    run_cli(main)
