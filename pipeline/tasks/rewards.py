"""Outcome reward (spec 4): the last complete ``\\boxed{...}`` of a completion, verified against the gold.

r(completion, gold) = 1  if verify(parse("$" + gold + "$"), parse("$" + last_boxed(completion) + "$"))
                      0  otherwise (no box, parse failure, timeout, any exception)
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from pipeline.tasks.boxed import BOX_MARKER, last_boxed
from pipeline.tasks.grading import GradingMode, verify_answer

VERIFY_TIMEOUT_SECONDS = 5

logging.getLogger("math_verify").setLevel(logging.ERROR)


def is_correct(
    answer: str | None,
    gold: Any,
    timeout_seconds: int | None = VERIFY_TIMEOUT_SECONDS,
    grading: GradingMode = "clean",
) -> bool:
    """Whether an extracted ``answer`` verifies against ``gold`` in mode ``grading`` (pipeline.tasks.grading); never
    raises (a parse failure, a timeout or any exception is False)."""
    if answer is None or gold is None:
        return False
    try:
        return verify_answer(str(gold).strip(), answer, timeout_seconds, grading)
    except Exception:
        return False


def outcome_reward(
    completion: str,
    gold: Any,
    timeout_seconds: int | None = VERIFY_TIMEOUT_SECONDS,
    grading: GradingMode = "clean",
) -> float:
    """1.0 when the last complete box of ``completion`` verifies against ``gold``, else 0.0."""
    return 1.0 if is_correct(last_boxed(completion), gold, timeout_seconds, grading) else 0.0


def completion_text(completion: Any) -> str:
    """Plain text of a TRL completion: a string, or a conversational list of messages."""
    if isinstance(completion, str):
        return completion
    return "".join(message.get("content", "") for message in completion)


def trl_outcome_reward(
    completions: list[Any], solution: list[str], grading: GradingMode = "clean", **_: Any
) -> list[float]:
    """TRL reward function: one reward per completion, graded in mode ``grading``."""
    return [
        outcome_reward(completion_text(c), gold, grading=grading) for c, gold in zip(completions, solution, strict=True)
    ]


def trl_reward_function(grading: GradingMode) -> Callable[..., list[float]]:
    """``trl_outcome_reward`` bound to ``grading``, keeping its ``__name__`` (TRL names the reward metrics by it)."""
    return functools.update_wrapper(functools.partial(trl_outcome_reward, grading=grading), trl_outcome_reward)


def gold_self_check(
    gold: Any, grading: GradingMode = "clean", timeout_seconds: int | None = VERIFY_TIMEOUT_SECONDS
) -> bool:
    """Whether ``\\boxed{gold}`` as a completion is graded correct against ``gold`` in mode ``grading``: False
    marks an item that no answer can ever be graded correct on in that mode."""
    return outcome_reward(f"{BOX_MARKER}{str(gold).strip()}}}", gold, timeout_seconds, grading) == 1.0
