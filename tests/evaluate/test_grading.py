"""Grading edge cases: no box, unbalanced braces, megabyte completions, LaTeX that is slow for sympy."""

from __future__ import annotations

import subprocess
import sys

import pytest

import pipeline.evaluation.sampling
from pipeline.core.io import InputError
from pipeline.evaluation.eval_spec import EvalSpec, parse_eval_spec
from pipeline.evaluation.sampling import grade

SPEC = EvalSpec()


@pytest.mark.parametrize(
    ("completion", "gold", "extracted", "correct"),
    [
        ("The answer is 12.", "12", None, False),
        ("", "12", None, False),
        ("so \\boxed{12", "12", None, False),
        ("\\boxed{12}}", "12", "12", True),
        ("first \\boxed{3} then \\boxed{ 12 }", "12", "12", True),
        ("first \\boxed{12} then \\boxed{3}", "12", "3", False),
        ("\\boxed{\\frac{1}{2}}", "0.5", "\\frac{1}{2}", True),
        ("\\boxed{5} and an open \\boxed{6", "5", "5", True),
        ("\\boxed{}", "5", "", False),
    ],
)
def test_grade_known_cases(completion, gold, extracted, correct):
    assert grade(completion, gold, SPEC) == (extracted, correct)


@pytest.mark.timeout(60)  # a hang guard: the box scan was once quadratic and ran for hours on such input
def test_megabyte_completion_with_answer_at_the_end_is_graded():
    completion = "x" * 1_000_000 + " so \\boxed{42}"
    assert grade(completion, "42", SPEC) == ("42", True)


def test_megabyte_answer_is_scored_zero_without_parsing(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("an answer over max_answer_chars reached math-verify")

    monkeypatch.setattr(pipeline.evaluation.sampling, "is_correct", refuse)
    answer = "1" * 1_000_000
    extracted, correct = grade(f"\\boxed{{{answer}}}", "5", parse_eval_spec({"grading_timeout_seconds": 5}))
    assert (extracted, correct) == (answer, False)


def test_answer_at_the_length_cap_is_still_graded():
    spec = parse_eval_spec({"max_answer_chars": 3})
    assert grade("\\boxed{123}", "123", spec) == ("123", True)
    assert grade("\\boxed{1234}", "1234", spec) == ("1234", False)


def _grade_in_subprocess(code: str, limit_s: float) -> str:
    """Run grading code in a fresh interpreter (its main thread); ``limit_s`` is a hang guard, not a speed check:
    the input would keep sympy busy for hours, so only a grader that gives up ends within it."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=limit_s, check=True)
    return result.stdout.strip()


def test_latex_slow_for_sympy_is_bounded_by_the_timeout_and_scored_zero():
    # 2^(2^40) cannot be evaluated by sympy in any reasonable time; math-verify must give up after its timeout.
    # The spy records the timeouts math-verify is given: the spec's, for every parse and verify.
    code = (
        "import pipeline.tasks.grading as grading\n"
        "from pipeline.evaluation.eval_spec import parse_eval_spec\nfrom pipeline.evaluation.sampling import grade\n"
        "timeouts = []\n"
        "parse, verify = grading.parse, grading.verify\n"
        "def parse_spy(text, parsing_timeout):\n"
        "    timeouts.append(parsing_timeout)\n"
        "    return parse(text, parsing_timeout=parsing_timeout)\n"
        "def verify_spy(gold, answer, timeout_seconds):\n"
        "    timeouts.append(timeout_seconds)\n"
        "    return verify(gold, answer, timeout_seconds=timeout_seconds)\n"
        "grading.parse, grading.verify = parse_spy, verify_spy\n"
        "spec = parse_eval_spec({'grading_timeout_seconds': 1})\n"
        "for answer in ['2^{2^{40}}', '\\\\sqrt{2}^{10^{9}}', '{' * 5000 + '1']:\n"
        "    print(grade('\\\\boxed{' + answer + '}', '3', spec)[1])\n"
        "print(sorted(set(timeouts)))\n"
    )
    assert _grade_in_subprocess(code, limit_s=120).splitlines() == ["False", "False", "False", "[1]"]


def test_megabyte_of_unclosed_boxes_is_bounded():
    code = "from pipeline.evaluation.eval_spec import EvalSpec\nfrom pipeline.evaluation.sampling import grade\nprint(grade('\\\\boxed{' * 150_000, '3', EvalSpec()))\n"
    assert _grade_in_subprocess(code, limit_s=10) == "(None, False)"


UPSTREAM = parse_eval_spec({"extraction": "upstream", "grading": "upstream"})


@pytest.mark.parametrize(
    ("completion", "clean", "upstream"),
    [
        # upstream's extractor stops at the first unclosed box; the clean one skips it and keeps scanning
        ("\\boxed{5} then an open \\boxed{6 and \\boxed{7}", "7", "5"),
        ("an open \\boxed{6 and \\boxed{7}", "7", None),
        ("\\boxed{ 12 }", "12", " 12 "),  # upstream keeps the content as written
        ("\\boxed{1} and \\boxed{2}", "2", "2"),
    ],
)
def test_extraction_modes(completion, clean, upstream):
    assert grade(completion, "7", SPEC)[0] == clean
    assert grade(completion, "7", UPSTREAM)[0] == upstream


def test_upstream_extraction_grades_answers_over_the_length_cap():
    spec = parse_eval_spec({"max_answer_chars": 3, "extraction": "upstream"})
    assert grade("\\boxed{1234}", "1234", spec) == ("1234", True)


def test_upstream_grading_mode_reaches_math_verify_unnormalized():
    assert grade("\\boxed{3000000}", "3e6", SPEC) == ("3000000", True)
    assert grade("\\boxed{3000000}", "3e6", UPSTREAM) == ("3000000", False)


@pytest.mark.parametrize("key", ["grading", "extraction"])
def test_unknown_mode_is_refused_by_name(key):
    with pytest.raises(InputError, match=f"evaluation spec.{key}"):
        parse_eval_spec({key: "lenient"})
