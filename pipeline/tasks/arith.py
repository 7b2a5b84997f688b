"""Seeded generator of verifiable arithmetic problems, the tiny study's stand-in for DeepMath and the benchmarks.

A problem chains ``terms`` operands with one operation, ``a op b op c ... = ?``, evaluated left to right (which
is also the usual precedence when every operation is the same). Its worked solution writes one line per step
before the box, so a completion carries reasoning tokens besides the answer:

    4+8+3=?  ->  4+8=12. 12+3=15. \\boxed{15}
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import reduce
from typing import Literal

Operation = Literal["+", "-", "*"]
APPLY = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y}
# A generated problem: an operand, then one or more (operation, operand) pairs; operands may be negative.
PROBLEM = re.compile(r"(-?\d+)((?:[+\-*]-?\d+)+)=\?")
STEP = re.compile(r"([+\-*])(-?\d+)")


@dataclass(frozen=True)
class ArithmeticSpec:
    """How to draw problems: ``count`` chains of ``terms`` operands in [low, high] joined by one operation."""

    count: int = 2000
    seed: int = 0
    low: int = 0
    high: int = 9
    operations: tuple[Operation, ...] = ("+",)
    terms: int = 2


def arithmetic_problems(spec: ArithmeticSpec, id_prefix: str = "arith") -> list[dict[str, str]]:
    """``spec.count`` rows ``{"id", "problem", "answer"}``, identical for the same spec."""
    if spec.count < 0 or spec.low > spec.high or not spec.operations or spec.terms < 2:
        raise ValueError(f"invalid arithmetic spec: {spec}")
    rng = random.Random(spec.seed)
    rows = []
    for index in range(spec.count):
        operands = [rng.randint(spec.low, spec.high) for _ in range(spec.terms)]
        operation = rng.choice(spec.operations)
        value = reduce(APPLY[operation], operands)
        problem = operation.join(str(operand) for operand in operands) + "=?"
        rows.append({"id": f"{id_prefix}-{spec.seed}-{index}", "problem": problem, "answer": str(value)})
    return rows


def is_arithmetic_problem(problem: str) -> bool:
    """Whether ``problem`` has the shape ``arithmetic_problems`` writes (so ``worked_solution`` can work it)."""
    return PROBLEM.fullmatch(problem) is not None


def worked_solution(problem: str, answer: str) -> str:
    """The SFT target for a generated problem: one ``x op y=z.`` line per step (left to right), then the box."""
    match = PROBLEM.fullmatch(problem)
    if match is None:
        raise ValueError(f"not a generated arithmetic problem: {problem!r}")
    running = int(match.group(1))
    steps = []
    for operation, operand in STEP.findall(match.group(2)):
        result = APPLY[operation](running, int(operand))
        steps.append(f"{running}{operation}{operand}={result}.")
        running = result
    return f"{' '.join(steps)} \\boxed{{{answer}}}"
