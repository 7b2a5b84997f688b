"""Seeded generator of verifiable arithmetic problems, the tiny study's stand-in for DeepMath and the benchmarks."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

Operation = Literal["+", "-", "*"]


@dataclass(frozen=True)
class ArithmeticSpec:
    """How to draw problems: ``count`` problems ``a op b`` with operands in [low, high]."""

    count: int = 2000
    seed: int = 0
    low: int = 0
    high: int = 9
    operations: tuple[Operation, ...] = ("+",)


def arithmetic_problems(spec: ArithmeticSpec, id_prefix: str = "arith") -> list[dict[str, str]]:
    """``spec.count`` rows ``{"id", "problem", "answer"}``, identical for the same spec."""
    if spec.count < 0 or spec.low > spec.high or not spec.operations:
        raise ValueError(f"invalid arithmetic spec: {spec}")
    rng = random.Random(spec.seed)
    rows = []
    for index in range(spec.count):
        a, b = rng.randint(spec.low, spec.high), rng.randint(spec.low, spec.high)
        operation = rng.choice(spec.operations)
        value = {"+": a + b, "-": a - b, "*": a * b}[operation]
        rows.append({"id": f"{id_prefix}-{spec.seed}-{index}", "problem": f"{a}{operation}{b}=?", "answer": str(value)})
    return rows


def worked_solution(problem: str, answer: str) -> str:
    """The SFT target for a generated problem: a short reasoning line and the boxed answer."""
    return f"{problem.removesuffix('=?')}={answer}. \\boxed{{{answer}}}"
