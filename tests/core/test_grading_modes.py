"""The clean grader's five fixes, both ways, and the upstream mode keeping math-verify's own verdicts.

Golds are forms found in upstream's benchmark files (Minerva-MATH's e-notation and ``-1./3``, complex and
base-subscript golds, an equation without real roots).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.tasks.grading import base_subscript_value, normalize_for_grading
from pipeline.tasks.rewards import is_correct

# (gold, a right answer, a wrong answer that must be refused)
PATTERNS = {
    "e-notation": ("3e6", "3000000", "3100000"),
    "e-notation as power": ("3e6", "3 \\times 10^{6}", "3 \\times 10^{7}"),
    "e-notation, 4.5e33": ("4.5e33", "4.5 \\times 10^{33}", "4.5 \\times 10^{34}"),
    "negative e-notation": ("1.325e-27", "1.325 \\times 10^{-27}", "1.325 \\times 10^{27}"),
    "trailing decimal point": ("-1./3", "-\\frac{1}{3}", "-1"),
    "spaced imaginary unit": ("28-21 i", "28-21i", "28+21i"),
    "base subscript": ("52_8", "52_8", "52_9"),
    "equation without real roots": ("x^{2}-12 x+39=1", "x^{2}-12 x+38=0", "x^{2}-12 x+39=0"),
}
# What plain math-verify (the upstream mode) gets wrong on the same pairs: (right refused, wrong accepted).
UPSTREAM_MISTAKES = {
    "e-notation": (True, False),
    "e-notation as power": (True, False),
    "e-notation, 4.5e33": (True, False),
    "trailing decimal point": (True, True),
    "spaced imaginary unit": (True, False),
    "base subscript": (False, True),
    "equation without real roots": (False, True),
}


@pytest.mark.parametrize("pattern", PATTERNS)
def test_clean_grader_accepts_the_right_form(pattern):
    gold, right, _ = PATTERNS[pattern]
    assert is_correct(right, gold, grading="clean")


@pytest.mark.parametrize("pattern", PATTERNS)
def test_clean_grader_refuses_the_wrong_form(pattern):
    gold, _, wrong = PATTERNS[pattern]
    assert not is_correct(wrong, gold, grading="clean")


@pytest.mark.parametrize("pattern", UPSTREAM_MISTAKES)
def test_upstream_mode_keeps_math_verifys_verdicts(pattern):
    gold, right, wrong = PATTERNS[pattern]
    right_refused, wrong_accepted = UPSTREAM_MISTAKES[pattern]
    assert is_correct(right, gold, grading="upstream") is not right_refused
    assert is_correct(wrong, gold, grading="upstream") is wrong_accepted


@pytest.mark.parametrize(
    ("gold", "answer"),
    [
        ("x=3", "3=x"),  # an equation and its mirror: ratio -1
        ("y=2x+1", "2y=4x+2"),  # a scaled equation
        ("\\frac{1}{2}", "0.5"),
        ("(3,0),(-3,1)", "(3,0), (-3,1)"),
        ("52_8", "52_{8}"),
        ("1A_{16}", "26_{10}"),  # base subscripts compare by value
    ],
)
def test_clean_grader_keeps_accepting_equivalent_forms(gold, answer):
    assert is_correct(answer, gold, grading="clean")


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("4.5e33", "4.5 \\times 10^{33}"),
        ("1.325e-27", "1.325 \\times 10^{-27}"),
        ("-1./3", "-1/3"),
        ("28-21 i", "28-21i"),
        ("28-21\\,i", "28-21i"),
        ("2e", "2e"),  # two times e, not e-notation
        ("e^{2}", "e^{2}"),
        ("1, 2, \\ldots", "1, 2, \\ldots"),
        ("3.5", "3.5"),
        ("2 in", "2 in"),  # a unit word starting with i stays
    ],
)
def test_normalize_for_grading(text, normalized):
    assert normalize_for_grading(text) == normalized


@pytest.mark.parametrize(
    ("text", "value"), [("52_8", 42), ("52_{9}", 47), ("1A_{16}", 26), ("9_8", None), ("52", None), ("5_1", None)]
)
def test_base_subscript_value(text, value):
    assert base_subscript_value(text) == value


def test_unknown_grading_mode_is_refused_by_name():
    from pipeline.tasks.grading import verify_answer

    with pytest.raises(ValueError, match="grading must be one of"):
        verify_answer("1", "1", None, "lenient")


@given(st.text(alphabet="0123456789.eEi -+/\\,{}_x=", max_size=30))
def test_normalization_is_idempotent(text):
    once = normalize_for_grading(text)
    assert normalize_for_grading(once) == once


@given(st.integers(0, 10**6), st.integers(2, 36))
def test_base_subscript_values_round_trip(value, base):
    digits = "".join(reversed(_digits(value, base)))
    assert base_subscript_value(f"{digits}_{{{base}}}") == value


def _digits(value: int, base: int) -> list[str]:
    alphabet = "0123456789abcdefghijklmnopqrstuvwxyz"
    digits = [alphabet[value % base]]
    while value := value // base:
        digits.append(alphabet[value % base])
    return digits
