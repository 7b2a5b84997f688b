"""Benchmark normalizers, gold audit, subsets and the prepare_benchmarks CLI on fixtures in each source's format."""

from __future__ import annotations

import functools
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.io import InputError
from pipeline.prepare_benchmarks import prepare_benchmark
from pipeline.tasks.arith import ArithmeticSpec, arithmetic_problems
from pipeline.tasks.benchmarks import (
    SOURCE_FORMATS,
    SkipRow,
    gold_text,
    load_hub_rows,
    normalize_rows,
    select_subset,
    strip_enclosing_dollars,
)

FIXTURES = Path(__file__).parent / "fixtures"
HUB = FIXTURES / "hub"
QWEN = FIXTURES / "qwen"
REPO = Path(__file__).resolve().parents[2]


def hub_spec(kind: str, directory: str, tmp_path: Path, **extra: object) -> dict:
    """A BENCH_SPEC loading a fixture directory through datasets.load_dataset (the Hub code path)."""
    return {"kind": kind, "hub_id": str(HUB / directory), "config": None, "cache_dir": str(tmp_path / "hf"), **extra}


def by_id(items: list[dict]) -> dict[str, dict]:
    return {item["id"]: item for item in items}


# --- gold normalization, known answers -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "gold"),
    [
        (27.0, "27"),  # AMC float gold
        (2.5, "2.5"),
        (7, "7"),
        ("$\\frac{4}{3}$", "\\frac{4}{3}"),  # CollegeMATH $-wrapped
        ("$$x+1$$", "x+1"),
        ("$-\\csc x+$ $\\cot x$", "$-\\csc x+$ $\\cot x$"),  # two math blocks: not one wrapper, kept
        ("$Q(50)=47.5$ (pounds)", "$Q(50)=47.5$ (pounds)"),
        (["$\\frac{10}{3}$"], "\\frac{10}{3}"),  # OlympiadBench single answer
        (["$3$", "$5$"], "3, 5"),  # OlympiadBench multi-answer
        (["$(3,0),(-3,1)$"], "(3,0),(-3,1)"),
        ("The energy is $\\boxed{7.2e-27}$ J.", "7.2e-27"),  # Minerva solution-like answer
        ("$x=\\boxed{\\frac{1}{\\sqrt{2}}}$ and \\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{\\sqrt{2}}{2}"),  # last box
    ],
)
def test_gold_text_known_answers(raw: object, gold: str) -> None:
    assert gold_text(raw) == gold


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (True, "bool"),
        (None, "NoneType"),
        ({"a": 1}, "dict"),
        ([], "empty answer list"),
        ("   ", "empty answer"),
        ("$ $", "empty answer"),
        (float("nan"), "non-finite"),
        ("The answer is \\boxed{5", "no complete"),
    ],
)
def test_gold_text_refuses_unusable_golds(raw: object, reason: str) -> None:
    with pytest.raises(SkipRow, match=reason):
        gold_text(raw)


@given(st.text(alphabet=st.characters(blacklist_characters="$"), min_size=1).filter(str.strip))
def test_strip_enclosing_dollars_inverts_wrapping(body: str) -> None:
    assert strip_enclosing_dollars(f"${body}$") == body.strip()
    assert strip_enclosing_dollars(body) == body.strip()


# --- each public source, through datasets.load_dataset on a local directory -------------------------------------


def test_math500_fields_and_skipped_row(tmp_path: Path) -> None:
    items, audit = prepare_benchmark("math500", hub_spec("math500", "math500", tmp_path))
    items = by_id(items)
    assert set(items) == {"test/precalculus/807.json", "test/prealgebra/1.json", "test/prealgebra/2.json"}
    assert items["test/precalculus/807.json"]["answer"] == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert items["test/prealgebra/1.json"]["problem"] == "What is $1+2$?"
    assert audit["skipped"] == [{"row": 3, "reason": "empty field 'problem'"}]
    assert audit["source"]["split"] == "test" and audit["source"]["rows"] == 4


def test_gold_audit_counts_the_known_bad_gold(tmp_path: Path) -> None:
    _, audit = prepare_benchmark("math500", hub_spec("math500", "math500", tmp_path))
    assert audit["items"] == 3
    empty = [{"id": "test/prealgebra/2.json", "answer": "\\text{}"}]
    assert audit["modes"]["clean"] == {"failures": empty, "failure_count": 1}
    assert audit["modes"]["upstream"] == {"failures": empty, "failure_count": 1}
    assert audit["clean_only"] == []


def test_aime24_train_split_and_ids(tmp_path: Path) -> None:
    items, audit = prepare_benchmark("aime24", hub_spec("aime24", "aime_2024", tmp_path))
    assert [(item["id"], item["answer"]) for item in items] == [("60", "204"), ("84", "033")]
    assert audit["source"]["split"] == "train" and audit["modes"]["clean"]["failure_count"] == 0


def test_amc23_float_golds(tmp_path: Path) -> None:
    items, _ = prepare_benchmark("amc23", hub_spec("amc23", "amc23", tmp_path))
    assert [item["answer"] for item in items] == ["27", "2.5"]
    assert items[0]["problem"].startswith("Cities $A$ and $B$")


def test_minerva_answer_field_and_boxed_fallback(tmp_path: Path) -> None:
    items, audit = prepare_benchmark("minerva", hub_spec("minerva", "minervamath", tmp_path))
    assert [(item["id"], item["answer"]) for item in items] == [("0", "0.49"), ("1", "7.2e-27")]
    assert audit["skipped"] == [{"row": 2, "reason": "missing answer field (one of answer, solution)"}]


def test_olympiadbench_lists_context_and_subset_default(tmp_path: Path) -> None:
    items, audit = prepare_benchmark("olympiadbench", hub_spec("olympiadbench", "olympiadbench", tmp_path))
    items = by_id(items)
    assert items["1606"]["answer"] == "\\frac{10}{3}"
    assert items["1607"]["answer"] == "(3,0),(-3,1)"
    assert items["1608"]["answer"] == "3, 5"
    assert items["1608"]["problem"] == "Let $T=5$.\nFind all $n$ with $n^2=T+4$ or $n=5$."
    assert items["1610"]["problem"] == "Compute $2^{10}$."  # empty context adds nothing
    assert audit["skipped"] == [{"row": 3, "reason": "empty answer list"}]
    assert audit["subset"] is None  # 4 usable items < the default 200: all kept
    assert SOURCE_FORMATS["olympiadbench"].subset_size == 200


def test_collegemath_golds_and_recorded_subset(tmp_path: Path) -> None:
    ids_file = tmp_path / "subsets" / "collegemath_ids.json"
    spec = hub_spec("collegemath", "collegemath", tmp_path, subset_size=3, subset_seed=7, subset_ids_file=str(ids_file))
    first, audit = prepare_benchmark("collegemath", spec)
    assert audit["subset"]["mode"] == "drawn" and len(first) == 3
    recorded = json.loads(ids_file.read_text())
    assert recorded["ids"] == [item["id"] for item in first] and recorded["seed"] == 7
    # A second run with another seed still uses the recorded ids.
    again, audit = prepare_benchmark("collegemath", spec | {"subset_seed": 999})
    assert again == first and audit["subset"]["mode"] == "recorded"


def test_collegemath_answers_lose_their_dollars(tmp_path: Path) -> None:
    items, _ = prepare_benchmark("collegemath", hub_spec("collegemath", "collegemath", tmp_path))
    assert [item["answer"] for item in items[:4]] == ["\\frac{4}{3}", "-13", "1", "-1-6 i"]
    # no id field: data_source and question_number name an item
    assert items[0]["id"] == "college_math.Beginning_and_Intermediate_Algebra:exercise.0.2.0"


def test_recorded_ids_missing_from_data_are_refused(tmp_path: Path) -> None:
    ids_file = tmp_path / "ids.json"
    ids_file.write_text(json.dumps(["college_math.Beginning_and_Intermediate_Algebra:exercise.0.2.0", "99"]))
    spec = hub_spec("collegemath", "collegemath", tmp_path, subset_ids_file=str(ids_file))
    with pytest.raises(InputError, match=r"ids.json: ids not found in the benchmark data: 99"):
        prepare_benchmark("collegemath", spec)


# --- subsets ---------------------------------------------------------------------------------------------------


@given(st.integers(0, 30), st.integers(0, 40), st.integers(0, 2**32))
def test_subset_is_deterministic_ordered_and_sized(count: int, size: int, seed: int) -> None:
    items = [{"id": str(i)} for i in range(count)]
    chosen = select_subset(items, size, seed)
    assert chosen == select_subset(items, size, seed)
    assert len(chosen) == min(size, count)
    positions = [int(item["id"]) for item in chosen]
    assert positions == sorted(set(positions))


def test_subset_known_draw() -> None:
    items = [{"id": str(i)} for i in range(10)]
    # Independent of our code: random.Random(3).sample(range(10), 4), sorted.
    expected = sorted(random.Random(3).sample(range(10), 4))
    assert [int(item["id"]) for item in select_subset(items, 4, 3)] == expected


# --- upstream's Qwen2.5-Math-format files ----------------------------------------------------------------------


def test_qwen_jsonl_minerva_takes_the_last_box_of_the_solution() -> None:
    items, audit = prepare_benchmark("minerva", {"kind": "qwen_jsonl", "path": str(QWEN / "minerva-math.jsonl")})
    assert [item["answer"] for item in items] == ["7.2e-27", "\\frac{\\sqrt{2}}{2}"]
    assert audit["skipped"] == [{"row": 2, "reason": "field 'solution' has no \\boxed{} answer"}]


def test_qwen_jsonl_olympiadbench_and_amc() -> None:
    olympiad, _ = prepare_benchmark("ob", {"kind": "qwen_jsonl", "path": str(QWEN / "olympiadbench_200.jsonl")})
    assert [(item["id"], item["answer"]) for item in olympiad] == [("2231", "(3,0),(-3,1)"), ("2232", "108")]
    amc, _ = prepare_benchmark("amc", {"kind": "amc23", "path": str(QWEN / "amc23_test.jsonl")})
    assert [(item["id"], item["answer"], item["source"]) for item in amc] == [
        ("0", "27", str(QWEN / "amc23_test.jsonl")),
        ("3", "2.5", str(QWEN / "amc23_test.jsonl")),
    ]


def test_generated_benchmark_matches_arith() -> None:
    items, audit = prepare_benchmark("heldout", {"kind": "generated", "generated": {"count": 4, "seed": 5}})
    assert [item["id"] for item in items] == [f"heldout-5-{i}" for i in range(4)]
    for item in items:
        a, b = item["problem"].removesuffix("=?").split("+")
        assert item["answer"] == str(int(a) + int(b))
    assert audit["modes"]["clean"]["failure_count"] == 0


def test_generated_chains_have_terms_operands_and_their_left_to_right_value() -> None:
    spec = {"count": 60, "seed": 7, "low": 0, "high": 4, "operations": ["+", "-", "*"], "terms": 4}
    items, audit = prepare_benchmark("chain", {"kind": "generated", "generated": spec})
    evaluate = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y}
    for item in items:
        body = item["problem"].removesuffix("=?")
        (operation,) = set(body) - set("0123456789")  # one operation per problem
        operands = [int(x) for x in body.split(operation)]
        assert len(operands) == 4 and all(0 <= x <= 4 for x in operands), item
        assert item["answer"] == str(functools.reduce(evaluate[operation], operands)), item
    assert {item["problem"][1] for item in items} == {"+", "-", "*"}
    assert audit["modes"]["clean"]["failure_count"] == 0
    # two terms draw exactly the problems the two-operand generator always drew
    two = arithmetic_problems(ArithmeticSpec(count=3, seed=0))
    assert [row["problem"] for row in two] == ["6+6=?", "4+8=?", "6+4=?"]


# --- bad inputs ------------------------------------------------------------------------------------------------


def test_corrupt_line_names_file_and_line() -> None:
    with pytest.raises(InputError, match=r"corrupt\.jsonl:2: not valid JSON"):
        prepare_benchmark("bad", {"kind": "qwen_jsonl", "path": str(QWEN / "corrupt.jsonl")})


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"kind": "gsm9k"}, r"benchmarks\.x\.kind: expected 'math500' .* got str 'gsm9k'"),
        ({"kind": "math500", "revsion": "main"}, r"benchmarks\.x: unknown key\(s\) \['revsion'\]"),
        ({"kind": "qwen_jsonl"}, r"benchmarks\.x: kind 'qwen_jsonl' reads a local file: set 'path'"),
        ({"kind": "generated", "generated": {"count": "ten"}}, r"benchmarks\.x\.generated\.count"),
        ({"kind": "generated", "generated": {"operations": ["/"]}}, r"benchmarks\.x\.generated\.operations"),
        (
            {"kind": "generated", "generated": {"terms": 1}},
            r"benchmarks\.x\.generated\.terms: invalid value 1 \(must be >= 2\)",
        ),
        ({"kind": "generated", "subset_size": -1}, r"benchmarks\.x\.subset_size"),
        (["math500"], r"benchmarks\.x: expected a mapping"),
    ],
)
def test_bad_specs_name_the_key(spec: object, message: str) -> None:
    with pytest.raises(InputError, match=message):
        prepare_benchmark("x", spec)


def test_repeated_ids_are_refused() -> None:
    rows = [{"id": 1, "problem": "a", "answer": "1"}, {"id": 1, "problem": "b", "answer": "2"}]
    with pytest.raises(InputError, match=r"file\.jsonl:2: duplicate id .1. \(first at file\.jsonl:1\)"):
        normalize_rows(rows, SOURCE_FORMATS["qwen_jsonl"], "file.jsonl")


def test_unloadable_hub_dataset_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"cannot load .*no-such-dir .*revision main"):
        load_hub_rows(str(tmp_path / "no-such-dir"), config=None, split="test", revision="main", cache_dir=None)


# --- CLI -------------------------------------------------------------------------------------------------------


def run_stage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.prepare_benchmarks", *args], cwd=REPO, capture_output=True, text=True
    )


def test_cli_writes_schema_rows_and_audit(tmp_path: Path) -> None:
    out, audit = tmp_path / "eval" / "amc.jsonl", tmp_path / "audit" / "amc.json"
    spec = json.dumps({"kind": "qwen_jsonl", "path": str(QWEN / "amc23_test.jsonl")})
    result = run_stage("--name", "amc", "--spec", spec, "--out", str(out), "--audit", str(audit))
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [set(row) for row in rows] == [{"id", "problem", "answer", "source"}] * 2
    record = json.loads(audit.read_text())
    assert (record["benchmark"], record["items"], record["modes"]["clean"]["failure_count"]) == ("amc", 2, 0)


def test_cli_bad_input_exits_2_with_the_message(tmp_path: Path) -> None:
    spec = json.dumps({"kind": "qwen_jsonl", "path": str(QWEN / "corrupt.jsonl")})
    out = tmp_path / "bad.jsonl"
    result = run_stage("--name", "bad", "--spec", spec, "--out", str(out), "--audit", str(tmp_path / "a.json"))
    assert result.returncode == 2
    assert "corrupt.jsonl:2: not valid JSON" in result.stderr
    assert not out.exists()


def test_every_bad_line_of_a_local_file_is_named_at_once(tmp_path: Path) -> None:
    """The stage's refusal names each line that is no JSON and each repeated id (with its first line) together."""
    path = tmp_path / "mine.jsonl"
    rows = ['{"id": "a", "problem": "1+1", "answer": "2"}', "[1]", '{"id": "a", "problem": "2+2", "answer": "4"}']
    path.write_text("\n".join([*rows, "{torn"]), encoding="utf-8")
    with pytest.raises(InputError) as refused:
        prepare_benchmark("mine", {"kind": "qwen_jsonl", "path": str(path)})
    assert str(refused.value).splitlines() == [
        f"{path}:2: expected a JSON object, got list",
        f"{path}:3: duplicate id 'a' (first at {path}:1)",
        f"{path}:4: not valid JSON (Expecting property name enclosed in double quotes)",
    ]
