"""Upstream's benchmark items and golds: the recorded subsets in eval_data/subsets/ select exactly upstream's
items, in upstream's order, through the Hub path; the ``upstream`` gold format reproduces upstream's golds."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from pipeline.prepare_benchmarks import prepare_benchmark
from pipeline.tasks.benchmarks import SOURCE_FORMATS, normalize_rows

REPO = Path(__file__).resolve().parents[2]
SUBSETS = REPO / "eval_data" / "subsets"
UPSTREAM_COMMIT = "749aa4c42d83123d4a792d268be3e3f7419a3d59"
RECORDED = {
    "olympiadbench": SUBSETS / "olympiadbench_upstream_ids.json",
    "collegemath": SUBSETS / "collegemath_upstream_ids.json",
}


def recorded_ids(benchmark: str) -> list[str]:
    return json.loads(RECORDED[benchmark].read_text())["ids"]


def olympiad_row(identifier: str) -> dict:
    return {"id": int(identifier), "context": None, "question": f"Question {identifier}?", "final_answer": ["7"]}


def college_row(identifier: str) -> dict:
    data_source, question_number = identifier.split(":")
    return {"data_source": data_source, "question_number": question_number, "question": "Q?", "answer": "$7$"}


def write_hub_split(directory: Path, split: str, rows: list[dict]) -> Path:
    directory.mkdir(parents=True)
    (directory / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return directory


@pytest.mark.parametrize("bench", sorted(RECORDED))
def test_recorded_subset_names_its_upstream_source(bench):
    record = json.loads(RECORDED[bench].read_text())
    assert record["benchmark"] == bench
    assert record["source"]["repo"] == "declare-lab/grail"
    assert record["source"]["commit"] == UPSTREAM_COMMIT
    assert record["source"]["path"].startswith("src/eval/eval_data/")
    assert len(record["ids"]) == 200 == len(set(record["ids"]))


def test_recorded_ids_are_upstreams_file_order():
    # First and last items of upstream's files at 749aa4c (olympiadbench_200.jsonl, college_math_200.jsonl).
    olympiad = recorded_ids("olympiadbench")
    assert olympiad[:3] == ["2910", "3021", "2678"] and olympiad[-1] == "2351"
    college = recorded_ids("collegemath")
    assert college[0] == "college_math.Matrix_Theory_and_Linear_Algebra:exercise.4.9.2"
    assert college[-1] == "college_math.PRECALCULUS:exercise.10.7.40"


@pytest.mark.parametrize(
    ("bench", "split", "to_row", "extra"),
    [
        ("olympiadbench", "train", olympiad_row, [str(n) for n in range(1000, 1300)]),
        (
            "collegemath",
            "test",
            college_row,
            [f"college_math.Calculus:exercise.99.{n}" for n in range(300)],
        ),
    ],
)
def test_hub_path_selects_exactly_upstreams_items_in_upstreams_order(bench, split, to_row, extra, tmp_path):
    """A Hub-shaped dataset holding upstream's items among 300 others, in a shuffled order."""
    wanted = recorded_ids(bench)
    identifiers = wanted + extra
    random.Random(0).shuffle(identifiers)
    hub = write_hub_split(tmp_path / "hub", split, [to_row(identifier) for identifier in identifiers])
    spec = {
        "kind": bench,
        "hub_id": str(hub),
        "config": None,
        "cache_dir": str(tmp_path / "hf"),
        "subset_ids_file": str(RECORDED[bench]),
    }
    items, audit = prepare_benchmark(bench, spec)
    assert [item["id"] for item in items] == wanted
    assert audit["subset"]["mode"] == "recorded"


OLYMPIAD = SOURCE_FORMATS["olympiadbench"]


@pytest.mark.parametrize(
    ("final_answer", "clean", "upstream"),
    [
        (["$(3,0),(-3,1)$"], "(3,0),(-3,1)", "['$(3,0),(-3,1)$']"),
        (["108"], "108", "['108']"),
        (["$3$", "$5$"], "3, 5", "['$3$', '$5$']"),
    ],
)
def test_olympiadbench_gold_formats(final_answer, clean, upstream):
    row = {"id": 1, "question": "Q?", "final_answer": final_answer}
    assert normalize_rows([row], OLYMPIAD, "ob", "clean")[0][0]["answer"] == clean
    assert normalize_rows([row], OLYMPIAD, "ob", "upstream")[0][0]["answer"] == upstream


def test_minerva_upstream_gold_is_the_boxed_answer_of_the_solution():
    row = {"idx": 3, "problem": "Q?", "answer": "4.5e33", "solution": "So $E=\\boxed{4.5e33}$ erg."}
    minerva = SOURCE_FORMATS["minerva"]
    assert normalize_rows([row], minerva, "m", "clean")[0][0]["answer"] == "4.5e33"
    row["answer"] = "a different answer field"
    assert normalize_rows([row], minerva, "m", "upstream")[0][0]["answer"] == "4.5e33"


def test_minerva_upstream_gold_uses_upstreams_extractor():
    # upstream's extractor stops at the first unclosed box: the later box is never reached
    row = {"idx": 3, "problem": "Q?", "solution": "\\boxed{1} then \\boxed{2 and \\boxed{3}"}
    items, _ = normalize_rows([row], SOURCE_FORMATS["minerva"], "m", "upstream")
    assert items[0]["answer"] == "1"


def test_amc_upstream_gold_keeps_pythons_float_text():
    row = {"id": 0, "problem": "Q?", "answer": 27.0}
    amc = SOURCE_FORMATS["amc23"]
    assert normalize_rows([row], amc, "a", "clean")[0][0]["answer"] == "27"
    assert normalize_rows([row], amc, "a", "upstream")[0][0]["answer"] == "27.0"


def test_unknown_gold_format_is_refused_by_name(tmp_path):
    from pipeline.core.io import InputError

    with pytest.raises(InputError, match="gold must be one of"):
        normalize_rows([], OLYMPIAD, "ob", "lenient")


def test_minerva_upstream_gold_without_a_solution_field_falls_back_to_the_answer():
    minerva = SOURCE_FORMATS["minerva"]
    rows = [
        {"idx": 1, "problem": "Q?", "answer": "0.49"},
        {"idx": 2, "problem": "Q?", "answer": "E=\\boxed{7.2e-27} J"},
    ]
    items, _ = normalize_rows(rows, minerva, "m", "upstream")
    assert [item["answer"] for item in items] == ["0.49", "7.2e-27"]
