"""Answer grading modes: upstream's plain math-verify, and the clean grader that fixes six of its misreadings.

    upstream:  correct = verify(parse("$" + gold + "$"), parse("$" + answer + "$"))      (what the paper graded)
    clean:     both strings normalized first (below), base-subscripted integers compared by value, numbers
               compared with a relative tolerance (numbers_close), and an equation between scalar expressions
               accepted only when its (lhs - rhs) is a non-zero constant multiple of the gold's

Normalizations (each fixes a form math-verify 0.9 misreads; measured on upstream's benchmark golds):
    4.5e33, 1.325e-27, 3e6    -> 4.5 \\times 10^{33} ...   (math-verify reads "3e6" as 3*e*6)
    -1./3                     -> -1/3                      (a trailing decimal point made it parse as -1)
    28-21 i                   -> 28-21i                    (a space before i made i a different symbol)
    52_9 vs 52_8              -> int("52", 9) vs int("52", 8)   (math-verify drops the subscript: both 52)
    x^2-12x+39=1 vs ...=0     -> not proportional, refused  (math-verify compares real solution sets: both empty)
    2.88e-19 vs 9.99e-19      -> refused                    (math-verify rounds to 6 decimals or chops below
                                                              ~1e-15 absolute: every value under 5e-7 was equal)

Equations whose sides are sets, intervals or matrices (``x=-1,0``, ``x \\in [-2,7]``, ``A^{-1}=[...]``) keep
math-verify's verdict: they are lists of solutions, not polynomial equations, and have no lhs - rhs.
"""

from __future__ import annotations

import contextvars
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal, get_args

import math_verify.grader
import sympy
from math_verify import parse, verify
from math_verify.utils import timeout
from sympy.matrices import MatrixBase
from sympy.matrices.expressions import MatrixExpr

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


def is_scalar_expression(expression: object) -> bool:
    """Whether ``expression`` is a sympy scalar expression (not a set, interval, tuple or matrix)."""
    return isinstance(expression, sympy.Expr) and not isinstance(expression, (MatrixBase, MatrixExpr))


def is_scalar_equation(expression: object) -> bool:
    """Whether ``expression`` is an equation both of whose sides are scalar expressions."""
    return (
        isinstance(expression, sympy.Equality)
        and is_scalar_expression(expression.lhs)
        and is_scalar_expression(expression.rhs)
    )


def equations_proportional(gold: object, answer: object) -> bool | None:
    """For two scalar equations: whether lhs - rhs of one is a non-zero constant times the other's.

    None when either is not a scalar equation (``x=-1,0`` is a list of solutions: math-verify compares its sets)
    or the check cannot decide (math-verify's verdict then stands).
    """
    if not (is_scalar_equation(gold) and is_scalar_equation(answer)):
        return None
    try:
        gold_difference = gold.lhs - gold.rhs
        answer_difference = answer.lhs - answer.rhs
        if sympy.simplify(answer_difference) == 0:
            return None
        ratio = sympy.simplify(gold_difference / answer_difference)
    except Exception:
        return None
    return not ratio.free_symbols and ratio != 0 and ratio.is_finite is not False


# Relative tolerance for numbers written with a decimal point: 1e-4, the tolerance of the Qwen2.5-Math evaluation
# harness (math_equal's isclose(reference, prediction, rel_tol=1e-4)), whose files upstream's six benchmarks come
# from and whose grader most RLVR papers report with: answers agree to about four significant figures (2.8803e-19
# for 2.88e-19, 0.3333 for 1/3), and a wrong answer 1e-2 away is refused with a margin of 100, at any magnitude
# (relative, so 1e-30 and 1e30 alike; math-verify's 6 decimals are 1e-6 relative at 1 but nothing at 1e-7).
RELATIVE_TOLERANCE = 1e-4
# Exact (decimal-free) irrational values are evaluated to NUMERIC_DIGITS digits and compared to evaluation noise;
# exact rationals, integers included, compare exactly.
NUMERIC_DIGITS = 30
EXACT_RELATIVE_TOLERANCE = 1e-20


def numbers_close(first: sympy.Expr, second: sympy.Expr, relative_tolerance: float) -> bool:
    """``|first - second| <= relative_tolerance * max(|first|, |second|)`` (math.isclose's rule), evaluated to
    NUMERIC_DIGITS digits, so that no magnitude over- or underflows a float.

    Relative, so that it means the same from 1e-30 to 1e30 (no absolute floor: 0 equals only 0).
    """
    difference = sympy.Abs(first - second).evalf(NUMERIC_DIGITS)
    scale = sympy.Max(sympy.Abs(first), sympy.Abs(second)).evalf(NUMERIC_DIGITS)
    return bool(difference <= relative_tolerance * scale)


def scalar_numbers_equal(first: sympy.Expr, second: sympy.Expr) -> bool:
    """Whether two numeric scalars are equal: within RELATIVE_TOLERANCE when either holds a decimal (a Float),
    exactly when both are rationals, within EXACT_RELATIVE_TOLERANCE for exact irrationals (pi, sqrt(2))."""
    if first.has(sympy.Float) or second.has(sympy.Float):
        return numbers_close(first, second, RELATIVE_TOLERANCE)
    if first.is_Rational and second.is_Rational:
        return bool(first == second)
    return numbers_close(first, second, EXACT_RELATIVE_TOLERANCE)


def is_numeric_scalar(expression: object) -> bool:
    """A scalar sympy expression with a numeric value (no free symbols, not a matrix, set or relation)."""
    return is_scalar_expression(expression) and bool(expression.is_number)


# math-verify compares numbers in one function, grader.sympy_numeric_eq, after rounding to `float_rounding`
# decimals (or, for expressions like 2.88 * 10**-19, after evalf's chop, an absolute cut-off): it has no relative
# comparison to select. The clean mode replaces that one function while it grades; math-verify calls it by its
# module-global name for scalars and for every element of tuples, sets, intervals and matrices, so the fix
# reaches them all. The replacement is installed once and consults a context variable, so the upstream mode (and
# any other user of math-verify in the process) runs math-verify's own function unchanged.
_clean_numbers = contextvars.ContextVar("clean_numbers", default=False)
_math_verify_numeric_eq = math_verify.grader.sympy_numeric_eq


def _numeric_eq(first: object, second: object, float_rounding: int, numeric_precision: int) -> bool:
    """math-verify's numeric comparison, with numeric scalars compared by scalar_numbers_equal in clean mode."""
    if not _clean_numbers.get() or not (is_numeric_scalar(first) and is_numeric_scalar(second)):
        return _math_verify_numeric_eq(first, second, float_rounding, numeric_precision)
    integers = (sympy.Integer,)
    if math_verify.grader.is_atomic_or_pct_atomic(first, integers) and math_verify.grader.is_atomic_or_pct_atomic(
        second, integers
    ):
        # math-verify's own rule for integers and integer percentages (9% = 9): exact, nothing to fix
        return _math_verify_numeric_eq(first, second, float_rounding, numeric_precision)
    try:
        return scalar_numbers_equal(
            math_verify.grader.safe_sympy_doit(first), math_verify.grader.safe_sympy_doit(second)
        )
    except (TypeError, ValueError, ArithmeticError):
        return False


math_verify.grader.sympy_numeric_eq = _numeric_eq


@contextmanager
def relative_number_comparison() -> Iterator[None]:
    """Within this block (this thread or task only), math-verify compares numbers as scalar_numbers_equal does."""
    token = _clean_numbers.set(True)
    try:
        yield
    finally:
        _clean_numbers.reset(token)


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
    if grading == "upstream":
        return bool(verify(gold_parsed, answer_parsed, timeout_seconds=timeout_seconds))
    with relative_number_comparison():
        verdict = bool(verify(gold_parsed, answer_parsed, timeout_seconds=timeout_seconds))
    if verdict and gold_parsed and answer_parsed:
        # sympy's simplify has no limit of its own: math-verify's timeout bounds it (a timeout raises: graded 0)
        proportional = timeout(timeout_seconds)(equations_proportional)(gold_parsed[0], answer_parsed[0])
        return proportional is not False
    return verdict
