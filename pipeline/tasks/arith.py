"""Seeded generator of verifiable arithmetic problems, the tiny study's stand-in for DeepMath and the benchmarks.

A problem chains ``terms`` operands with one operation, ``a op b op c ... = ?``, evaluated left to right (which
is also the usual precedence when every operation is the same). Its worked solution writes one line per step
before the box, so a completion carries reasoning tokens besides the answer:

    4+8+3=?  ->  4+8=12. 12+3=15. \\boxed{15}

With ``steps`` > 1 a problem is the decisive-step task instead (pipeline.tasks.decisive): ``steps`` such chains,
named, and a question about one of them, so the answer is decided by a known part of the completion.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import reduce
from string import ascii_lowercase
from typing import ClassVar, Literal, get_args

from pipeline.core.declared import Range, setting

Operation = Literal["+", "-", "*"]
APPLY = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y}
# A generated problem: an operand, then one or more (operation, operand) pairs; operands may be negative.
PROBLEM = re.compile(r"(-?\d+)((?:[+\-*]-?\d+)+)=\?")
STEP = re.compile(r"([+\-*])(-?\d+)")
STEP_NAMES = ascii_lowercase  # the names of a decisive-step problem's chains, in order


@dataclass(frozen=True)
class ArithmeticSpec:
    """Generated arithmetic: `count` problems, each a chain of `terms` operands in [low, high] joined by one
    operation (pipeline.tasks.arith).

    Declared here once (``pipeline.core.declared``): the schema's ``arithmetic`` entry (``python -m tools.schema``);
    the keys without a schema default are the generator's defaults in code only, so a config's filled-in section
    stays what it wrote."""

    filled_by_default: ClassVar[bool] = False

    count: int = setting(2000, "problems to draw", Range(minimum=1), schema_default=False)
    seed: int = setting(0, "the seed of the draw (random.Random)", Range(minimum=0), schema_default=False)
    low: int = setting(0, "the smallest operand", schema_default=False)
    high: int = setting(9, "the largest operand", schema_default=False)
    operations: tuple[Operation, ...] = setting(
        ("+",),
        "the operations a problem may use (one per problem)",
        json={"type": "array", "minItems": 1, "uniqueItems": True, "items": {"enum": list(get_args(Operation))}},
        schema_default=False,
    )
    terms: int = setting(2, "operands per problem, joined by one operation", Range(minimum=2))
    steps: int = setting(
        1,
        "1: one chain per problem (`4+8+3=?`). More: the decisive-step task (pipeline.tasks.decisive), `steps` named "
        "chains and a question about one (`a=3+4, b=5+2, c=9+1. b=?`), so only the queried chain's tokens and the "
        "box decide the answer; every rollout's per-token truth follows from its problem, which the `oracle` credit "
        "method and the report's decisive-token scores read",
        Range(minimum=1, maximum=len(STEP_NAMES)),
    )


def arithmetic_problems(spec: ArithmeticSpec, id_prefix: str = "arith") -> list[dict[str, str]]:
    """``spec.count`` rows ``{"id", "problem", "answer"}``, identical for the same spec."""
    if spec.count < 0 or spec.low > spec.high or not spec.operations or spec.terms < 2 or spec.steps < 1:
        raise ValueError(f"invalid arithmetic spec: {spec}")
    if spec.steps > len(STEP_NAMES):
        raise ValueError(f"invalid arithmetic spec: at most {len(STEP_NAMES)} steps, got {spec.steps}")
    rng = random.Random(spec.seed)
    rows = []
    for index in range(spec.count):
        if spec.steps > 1:
            chains = [random_chain(rng, spec) for _ in range(spec.steps)]
            query = rng.randrange(spec.steps)
            named = ", ".join(
                f"{name}={expression}" for name, (expression, _) in zip(STEP_NAMES[: spec.steps], chains, strict=True)
            )
            problem, value = f"{named}. {STEP_NAMES[query]}=?", chains[query][1]
        else:
            expression, value = random_chain(rng, spec)
            problem = f"{expression}=?"
        rows.append({"id": f"{id_prefix}-{spec.seed}-{index}", "problem": problem, "answer": str(value)})
    return rows


def random_chain(rng: random.Random, spec: ArithmeticSpec) -> tuple[str, int]:
    """``spec.terms`` operands in [low, high] joined by one operation drawn from ``spec.operations``: (the
    expression, its value left to right)."""
    operands = [rng.randint(spec.low, spec.high) for _ in range(spec.terms)]
    operation = rng.choice(spec.operations)
    return operation.join(str(operand) for operand in operands), reduce(APPLY[operation], operands)


def is_arithmetic_problem(problem: str) -> bool:
    """Whether ``problem`` has the shape ``arithmetic_problems`` writes (so ``worked_solution`` can work it)."""
    return PROBLEM.fullmatch(problem) is not None


def worked_chain(expression: str) -> str:
    """``4+8+3`` -> ``4+8=12. 12+3=15.``: one ``x op y=z.`` sentence per step, left to right."""
    match = PROBLEM.fullmatch(f"{expression}=?")
    if match is None:
        raise ValueError(f"not an arithmetic chain: {expression!r}")
    running = int(match.group(1))
    steps = []
    for operation, operand in STEP.findall(match.group(2)):
        result = APPLY[operation](running, int(operand))
        steps.append(f"{running}{operation}{operand}={result}.")
        running = result
    return " ".join(steps)


def worked_solution(problem: str, answer: str) -> str:
    """The SFT target for a generated problem: one ``x op y=z.`` line per step (left to right), then the box."""
    if not is_arithmetic_problem(problem):
        raise ValueError(f"not a generated arithmetic problem: {problem!r}")
    return f"{worked_chain(problem.removesuffix('=?'))} \\boxed{{{answer}}}"
