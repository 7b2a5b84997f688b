"""Answer grading modes: upstream's plain math-verify, and the clean grader that fixes five of its misreadings.

    upstream:  correct = verify(parse("$" + gold + "$"), parse("$" + answer + "$"))      (what the paper graded)
    clean:     both strings normalized first (below), base-subscripted integers compared by value, and an
               equation accepted only when its (lhs - rhs) is a non-zero constant multiple of the gold's

Normalizations (each fixes a form math-verify 0.9 misreads; measured on upstream's benchmark golds):
    4.5e33, 1.325e-27, 3e6    -> 4.5 \\times 10^{33} ...   (math-verify reads "3e6" as 3*e*6)
    -1./3                     -> -1/3                      (a trailing decimal point made it parse as -1)
    28-21 i                   -> 28-21i                    (a space before i made i a different symbol)
    52_9 vs 52_8              -> int("52", 9) vs int("52", 8)   (math-verify drops the subscript: both 52)
    x^2-12x+39=1 vs ...=0     -> not proportional, refused  (math-verify compares real solution sets: both empty)
"""

from __future__ import annotations

import re
import threading
from typing import Literal, get_args

import sympy
from math_verify import parse, verify
from math_verify.utils import timeout

GradingMode = Literal["clean", "upstream"]
GRADING_MODES: tuple[str, ...] = get_args(GradingMode)

# A plain decimal in e-notation, not part of a word or a longer number ("2e" or "e^2" are left alone).
E_NOTATION = re.compile(r"(?<![\w.\\])(\d+(?:\.\d+)?)[eE]([-+]?\d+)(?![\w.])")
# A decimal point with no digit after it: "-1./3", "5." (a "..." ellipsis is left alone).
TRAILING_DECIMAL_POINT = re.compile(r"(?<=\d)\.(?![\d.])")
# Whitespace (or a LaTeX thin space) between a coefficient and the imaginary unit.
SPACED_IMAGINARY_UNIT = re.compile(r"(?<=\d)(?:\s|\\[,;: ])+(?=i\b)")
# The whole answer is one integer with a base subscript: 52_8, 52_{8}, 1A_{16}.
BASE_SUBSCRIPT = re.compile(r"^\s*\$?\s*([0-9A-Za-z]+)_\{?(\d+)\}?\s*\$?\s*$")


def normalize_for_grading(text: str) -> str:
    """``text`` with e-notation, trailing decimal points and spaced imaginary units rewritten (module docstring)."""
    # the trailing point goes first: "0.E0" would otherwise become e-notation only on a second pass
    text = TRAILING_DECIMAL_POINT.sub("", text)
    text = E_NOTATION.sub(lambda match: f"{match.group(1)} \\times 10^{{{match.group(2)}}}", text)
    return SPACED_IMAGINARY_UNIT.sub("", text)


def base_subscript_value(text: str) -> int | None:
    """The value of a base-subscripted integer (``52_8`` -> 42), or None when ``text`` is not one.

    Digits invalid in their base (``9_8``) or bases outside 2..36 give None (graded by math-verify).
    """
    match = BASE_SUBSCRIPT.match(text)
    if match is None:
        return None
    digits, base = match.group(1), int(match.group(2))
    if not 2 <= base <= 36:
        return None
    try:
        return int(digits, base)
    except ValueError:
        return None


def equations_proportional(gold: object, answer: object) -> bool | None:
    """For two sympy equations: whether lhs - rhs of one is a non-zero constant times the other's.

    None when either is not an equation or the check cannot decide (math-verify's verdict then stands).
    """
    if not (isinstance(gold, sympy.Equality) and isinstance(answer, sympy.Equality)):
        return None
    gold_difference = gold.lhs - gold.rhs
    answer_difference = answer.lhs - answer.rhs
    try:
        if sympy.simplify(answer_difference) == 0:
            return None
        ratio = sympy.simplify(gold_difference / answer_difference)
    except Exception:
        return None
    return not ratio.free_symbols and ratio != 0 and ratio.is_finite is not False


def verify_answer(gold: str, answer: str, timeout_seconds: int | None, grading: GradingMode = "clean") -> bool:
    """Whether ``answer`` is graded equal to ``gold`` in mode ``grading`` (module docstring); may raise."""
    if grading not in GRADING_MODES:
        raise ValueError(f"grading must be one of {GRADING_MODES}, got {grading!r}")
    # math-verify's timeout uses SIGALRM, which only works in the main thread; elsewhere it must be disabled.
    if threading.current_thread() is not threading.main_thread():
        timeout_seconds = None
    if grading == "clean":
        gold, answer = normalize_for_grading(gold), normalize_for_grading(answer)
        gold_value, answer_value = base_subscript_value(gold), base_subscript_value(answer)
        if gold_value is not None and answer_value is not None:
            return gold_value == answer_value
    gold_parsed = parse(f"${gold}$", parsing_timeout=timeout_seconds)
    answer_parsed = parse(f"${answer}$", parsing_timeout=timeout_seconds)
    verdict = bool(verify(gold_parsed, answer_parsed, timeout_seconds=timeout_seconds))
    if verdict and grading == "clean" and gold_parsed and answer_parsed:
        # sympy's simplify has no limit of its own: math-verify's timeout bounds it (a timeout raises: graded 0)
        proportional = timeout(timeout_seconds)(equations_proportional)(gold_parsed[0], answer_parsed[0])
        return proportional is not False
    return verdict
