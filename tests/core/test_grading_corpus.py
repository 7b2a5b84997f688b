"""The graders on a corpus of gold forms, and the two properties the clean grader must keep.

tests/core/grading_corpus.csv: (family, gold, answer, clean, upstream) rows. ``clean`` is the right verdict; the
clean grader must give it. ``upstream`` is plain math-verify 0.9's verdict, wrong ones included (the scientific
rows below 1e-6, ``10^{-20}`` vs ``10^{-21}``, ``52_8`` vs ``52_9``): the upstream mode must keep every one of
them, bit for bit, since it is what the paper graded with.

Properties:
- reflexive: ``\\boxed{gold}`` graded against ``gold`` is correct in clean mode whenever upstream mode accepts it,
  for every gold of the corpus and of every benchmark that can be built here;
- discriminating: a numeric gold perturbed by a relative 1e-2 (or by +1 when an integer) is refused, at every
  magnitude from 1e-30 to 1e30 and in every written form.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.prepare_benchmarks import prepare_benchmark
from pipeline.tasks.grading import GRADING_MODES
from pipeline.tasks.rewards import gold_self_check, is_correct

CORPUS = Path(__file__).with_name("grading_corpus.csv")
QWEN_FIXTURES = Path(__file__).parents[1] / "data" / "fixtures" / "qwen"
E_EXPONENT = re.compile(r"\de(-?\d+)$")
FAMILIES = {
    "several roots", "k pi family", "interval", "matrix", "tuple", "scientific", "magnitude", "units", "percent",
    "degrees", "base", "peer comparison",
}  # fmt: skip


def corpus_rows() -> list[dict[str, str]]:
    with CORPUS.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_corpus_covers_every_form_in_both_modes() -> None:
    rows = corpus_rows()
    assert len(rows) >= 200
    assert {row["family"] for row in rows} == FAMILIES
    verdicts = defaultdict(set)
    for row in rows:
        verdicts[row["family"]].add(row["clean"])
    # every family holds answers that must be accepted and answers that must be refused
    assert all(found == {"true", "false"} for found in verdicts.values()), verdicts
    exponents = {
        int(match) for row in rows if row["family"] == "scientific" for match in E_EXPONENT.findall(row["gold"])
    }
    assert min(exponents) == -30 and max(exponents) == 30


@pytest.mark.parametrize("mode", GRADING_MODES)
def test_corpus_verdicts(mode: str) -> None:
    wrong = [
        (row["family"], row["gold"], row["answer"], row[mode])
        for row in corpus_rows()
        if is_correct(row["answer"], row["gold"], grading=mode) != (row[mode] == "true")
    ]
    assert not wrong, f"{len(wrong)} verdicts differ in {mode} mode: {wrong[:10]}"


def buildable_golds() -> dict[str, list[str]]:
    """The golds of every benchmark that can be built here, by benchmark."""
    specs = {
        "arith": {"kind": "generated", "generated": {"count": 100, "seed": 3, "low": 0, "high": 99, "terms": 3}},
        "arith_products": {"kind": "generated", "generated": {"count": 100, "seed": 4, "operations": ["*", "-"]}},
        "gsm8k": {"kind": "gsm8k", "templates": "all"},
        "gsm_symbolic": {"kind": "gsm_symbolic", "gsm_symbolic": {"count": 100, "seed": 0}},
        **{path.stem: {"kind": "qwen_jsonl", "path": str(path)} for path in sorted(QWEN_FIXTURES.glob("*.jsonl"))},
    }
    specs.pop("corrupt")  # rows with missing fields: tests/data/test_benchmarks.py
    golds = {name: [item["answer"] for item in prepare_benchmark(name, spec)[0]] for name, spec in specs.items()}
    golds["corpus"] = sorted({row["gold"] for row in corpus_rows()})
    return golds


def test_clean_accepts_every_gold_that_upstream_accepts() -> None:
    refused = [
        (benchmark, gold)
        for benchmark, golds in buildable_golds().items()
        for gold in golds
        if gold_self_check(gold, "upstream") and not gold_self_check(gold, "clean")
    ]
    assert not refused, f"the clean grader refuses {len(refused)} golds upstream accepts: {refused[:10]}"


def decimal_forms(mantissa: float, exponent: int) -> list[str]:
    """One value, ``mantissa * 10**exponent``, written every way a gold or an answer writes it."""
    digits = f"{mantissa:.6g}"
    forms = [f"{digits}e{exponent}", f"{digits} \\times 10^{{{exponent}}}", f"{digits} \\cdot 10^{{{exponent}}}"]
    if -6 <= exponent <= 6:
        forms.append(f"{mantissa * 10.0**exponent:.{max(0, 6 - exponent)}f}")
    return forms


@settings(max_examples=150, deadline=None)
@given(
    mantissa=st.floats(min_value=1.0, max_value=9.99, allow_nan=False).map(lambda value: round(value, 3)),
    exponent=st.integers(min_value=-30, max_value=30),
    sign=st.sampled_from([1, -1]),
    relative_error=st.sampled_from([1e-2, -1e-2, 5e-2]),
    gold_form=st.integers(min_value=0, max_value=3),
    answer_form=st.integers(min_value=0, max_value=3),
    data=st.data(),
)
def test_perturbed_numbers_are_refused_at_every_magnitude(
    mantissa, exponent, sign, relative_error, gold_form, answer_form, data
) -> None:
    golds = decimal_forms(sign * mantissa, exponent)
    answers = decimal_forms(sign * mantissa * (1 + relative_error), exponent)
    gold = golds[gold_form % len(golds)]
    same_value = golds[answer_form % len(golds)]
    wrong = answers[answer_form % len(answers)]
    unit = data.draw(st.sampled_from(["", " \\text{ m}", " \\mathrm{~J}"]))
    assert is_correct(same_value + unit, gold, grading="clean"), (gold, same_value + unit)
    assert not is_correct(wrong + unit, gold, grading="clean"), (gold, wrong + unit)


@settings(max_examples=100, deadline=None)
@given(value=st.integers(min_value=-(10**30), max_value=10**30), power_form=st.booleans())
def test_integers_off_by_one_are_refused_at_every_magnitude(value: int, power_form: bool) -> None:
    gold = str(value)
    assert is_correct(gold, gold, grading="clean")
    assert not is_correct(str(value + 1), gold, grading="clean"), gold
    if power_form and value > 0:
        # an exact power of ten and its neighbour: 10^{n} vs 10^{n} + 1
        exponent = len(gold) - 1
        assert not is_correct(f"10^{{{exponent}}}+1", f"10^{{{exponent}}}", grading="clean")


PLAIN_MATH_VERIFY = """
import csv, json, sys
from math_verify import parse, verify
rows = list(csv.DictReader(open(sys.argv[1], newline="", encoding="utf-8")))
print(json.dumps([bool(verify(parse("$" + r["gold"] + "$"), parse("$" + r["answer"] + "$"))) for r in rows]))
"""


def test_upstream_mode_is_plain_math_verify_bit_for_bit() -> None:
    """The clean mode swaps math-verify's numeric comparison while it grades: a process that never imports the
    pipeline (so runs math-verify untouched) gives the upstream mode's verdicts on every corpus row."""
    result = subprocess.run(
        [sys.executable, "-c", PLAIN_MATH_VERIFY, str(CORPUS)], capture_output=True, text=True, check=True
    )
    plain = json.loads(result.stdout)
    rows = corpus_rows()
    assert plain == [is_correct(row["answer"], row["gold"], grading="upstream") for row in rows]
