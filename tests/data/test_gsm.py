"""GSM8K and GSM-Symbolic from the installed package: seeded rows, the template split, decontamination, golds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.io import InputError
from pipeline.prepare_benchmarks import prepare_benchmark
from pipeline.prepare_data import prepare_data
from pipeline.tasks import gsm
from pipeline.tasks.rewards import outcome_reward

# Fewer than the 40 training templates before template 80, whose conditions need a one-off enumeration (seconds).
TRAIN_COUNT = 12


def gsm_data(count: int = TRAIN_COUNT, seed: int = 0, **extra: object) -> dict:
    return {"source": "gsm_symbolic", "gsm_symbolic": {"count": count, "seed": seed}, **extra}


def write_items(path: Path, items: list[dict]) -> str:
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return str(path)


def test_training_rows_are_seeded_and_carry_worked_solutions() -> None:
    rows, card = prepare_data(gsm_data(), [])
    again, _ = prepare_data(gsm_data(), [])
    other, _ = prepare_data(gsm_data(seed=1), [])
    assert rows == again
    assert [row["prompt"] for row in rows] != [row["prompt"] for row in other]
    assert len(rows) == TRAIN_COUNT and card["gsm_symbolic"]["templates"] == "training"
    for row in rows:
        assert row["worked_solution"].endswith(f"The final answer is \\boxed{{{row['solution']}}}.")
        assert "<<" not in row["worked_solution"] and "####" not in row["worked_solution"]
        assert outcome_reward(row["worked_solution"], row["solution"]) == 1.0


def test_training_variants_come_from_training_templates_and_differ_from_every_original() -> None:
    variants = gsm.variants(TRAIN_COUNT, 0, "training", "t")
    originals = {problem.question for problem in gsm.originals("all")}
    assert all(problem.template % 2 == 0 for problem in variants)
    assert not {problem.question for problem in variants} & originals
    held_out = gsm.originals("held_out")
    assert len(held_out) == 50 and all(problem.template % 2 == 1 for problem in held_out)


def test_decontamination_keeps_the_split_and_reports_the_overlap_of_all_100(tmp_path: Path) -> None:
    """Against the held-out benchmarks no training variant shares a 13-gram; against all 100 GSM8K problems the
    variants that keep a 13-gram of their own original's wording are dropped (about 44 % measured)."""
    held_out, _ = prepare_benchmark("gsm8k", {"kind": "gsm8k"})
    variants, _ = prepare_benchmark("gsm_symbolic", {"kind": "gsm_symbolic", "gsm_symbolic": {"count": 12, "seed": 5}})
    against = [write_items(tmp_path / "gsm8k.jsonl", held_out), write_items(tmp_path / "gsm_symbolic.jsonl", variants)]
    rows, card = prepare_data(gsm_data(decontaminate={"enabled": True}), against)
    assert card["decontamination"]["dropped_count"] == 0 and len(rows) == TRAIN_COUNT

    everything, _ = prepare_benchmark("gsm8k_all", {"kind": "gsm8k", "templates": "all"})
    rows, card = prepare_data(
        gsm_data(decontaminate={"enabled": True}), [write_items(tmp_path / "all.jsonl", everything)]
    )
    assert 0 < card["decontamination"]["dropped_count"] < TRAIN_COUNT
    assert card["decontamination"]["dropped_by_benchmark"] == {"all": card["decontamination"]["dropped_count"]}


def test_gsm8k_benchmark_golds_grade_the_worked_answers_correct() -> None:
    items, audit = prepare_benchmark("gsm8k", {"kind": "gsm8k", "templates": "all"})
    assert len(items) == 100 and audit["modes"]["clean"]["failure_count"] == 0
    assert set(items[0]) == {"id", "problem", "answer", "source"}
    worked = {problem.id: problem.worked_solution for problem in gsm.originals("all")}
    assert all(outcome_reward(worked[item["id"]], item["answer"]) == 1.0 for item in items)
    assert len(prepare_benchmark("gsm8k", {"kind": "gsm8k"})[0]) == 50


def test_gsm_symbolic_benchmark_is_seeded_held_out_and_graded() -> None:
    spec = {"kind": "gsm_symbolic", "gsm_symbolic": {"count": 8, "seed": 3}}
    items, audit = prepare_benchmark("sym", spec)
    assert items == prepare_benchmark("sym", spec)[0]
    assert audit["modes"]["clean"]["failure_count"] == 0 and [item["id"] for item in items] == [
        f"sym-{i}" for i in range(8)
    ]
    variants = gsm.variants(8, 3, "held_out", "sym")
    assert all(problem.template % 2 == 1 for problem in variants)
    assert all(
        outcome_reward(p.worked_solution, item["answer"]) == 1.0 for p, item in zip(variants, items, strict=True)
    )


def test_thousands_separators_leave_the_gold() -> None:
    worked, gold = gsm.worked_answer("2 boxes of 500 = <<2*500=1000>>1,000 pens.\n#### 1,000", "test")
    assert gold == "1000"
    assert worked == "2 boxes of 500 = 1,000 pens.\nThe final answer is \\boxed{1000}."
    assert outcome_reward("So \\boxed{1,000}.", gold) == 1.0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (gsm_data(count=0), "data.gsm_symbolic.count: invalid value 0 (must be >= 1)"),
        (
            {"source": "gsm_symbolic", "gsm_symbolic": {"count": 3}},
            "data.gsm_symbolic: missing required key(s) ['seed']",
        ),
        ({"source": "gsm_symbolic", "gsm_symbolic": {"count": 3, "seed": 0, "split": "x"}}, "unknown key(s) ['split']"),
        (
            {"source": "gsm_symbolic", "gsm_symbolic": {"count": 3, "seed": True}},
            "data.gsm_symbolic.seed: expected int",
        ),
    ],
)
def test_bad_gsm_data_spec_is_refused_by_key(spec: dict, message: str) -> None:
    with pytest.raises(InputError) as error:
        prepare_data(spec, [])
    assert message in str(error.value)


def test_bad_gsm8k_templates_value_is_refused_by_key() -> None:
    with pytest.raises(InputError) as error:
        prepare_benchmark("g", {"kind": "gsm8k", "templates": "training"})
    assert "benchmarks.g.templates: expected 'held_out' | 'all'" in str(error.value)
