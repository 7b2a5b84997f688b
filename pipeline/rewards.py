"""Outcome reward (spec 4): the last complete ``\\boxed{...}`` of a completion, verified against the gold.

r(completion, gold) = 1  if verify(parse("$" + gold + "$"), parse("$" + last_boxed(completion) + "$"))
                      0  otherwise (no box, parse failure, timeout, any exception)
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Literal, get_args

from pipeline.grading import GradingMode, verify_answer

PROMPT_SUFFIX_CLEAN = " Please reason step by step, and put your final answer within \\boxed{}."
# Upstream wrote the suffix as a non-raw Python string: "\b" became a backspace (U+0008), so the paper's prompts
# asked for "<BS>oxed{}". Reproducing the paper's numbers means reproducing that string.
PROMPT_SUFFIX_UPSTREAM = " Please reason step by step, and put your final answer within \boxed{}."
# The tiny study's prompts: the problem alone. Its model learns the answer format in warm-up, and a character
# tokenizer would otherwise spend three quarters of every sequence (and of the CPU time) on the instruction.
PROMPT_SUFFIX_BARE = ""
PromptTemplate = Literal["clean", "upstream", "bare"]
# "bare" last: its empty suffix matches every prompt, so suffix lookups must try the others first.
PROMPT_TEMPLATES: dict[PromptTemplate, str] = {
    "clean": PROMPT_SUFFIX_CLEAN,
    "upstream": PROMPT_SUFFIX_UPSTREAM,
    "bare": PROMPT_SUFFIX_BARE,
}

BOX_MARKER = "\\boxed{"
ExtractionMode = Literal["clean", "upstream"]
EXTRACTION_MODES: tuple[str, ...] = get_args(ExtractionMode)
VERIFY_TIMEOUT_SECONDS = 5

logging.getLogger("math_verify").setLevel(logging.ERROR)


def build_prompt(problem: str, template: PromptTemplate = "clean") -> str:
    """The user message: the problem followed by the boxed-answer instruction of ``template``."""
    try:
        return problem + PROMPT_TEMPLATES[template]
    except KeyError:
        raise ValueError(f"prompt_template must be one of {sorted(PROMPT_TEMPLATES)}, got {template!r}") from None


def closing_braces(text: str) -> dict[int, int]:
    """Index of the matching ``}`` for every ``{`` of ``text`` that is closed (one stack pass, linear time).

    The match of ``{`` at ``p`` is the first ``q > p`` where the brace depth counted from ``p`` returns to 0,
    which is what a forward depth count from ``p`` finds; stray ``}`` with nothing open are ignored.
    """
    matches: dict[int, int] = {}
    open_positions: list[int] = []
    for index, character in enumerate(text):
        if character == "{":
            open_positions.append(index)
        elif character == "}" and open_positions:
            matches[open_positions.pop()] = index
    return matches


def boxed_contents(text: str, stop_at_unclosed: bool = False) -> list[tuple[int, int]]:
    """Character spans ``(content_start, content_end)`` of every complete, non-overlapping ``\\boxed{...}``.

    Braces are balanced by depth counting. An occurrence whose braces never close is skipped and the scan
    continues after its marker (as the training reward's recursive regex does), or, with ``stop_at_unclosed``,
    ends the scan (upstream's evaluation extractor). Linear in ``len(text)``.
    """
    if BOX_MARKER not in text:
        return []
    matches = closing_braces(text)
    spans: list[tuple[int, int]] = []
    position = 0
    while (start := text.find(BOX_MARKER, position)) != -1:
        content_start = start + len(BOX_MARKER)
        close = matches.get(content_start - 1)
        if close is None:
            if stop_at_unclosed:
                break
            position = content_start
        else:
            spans.append((content_start, close))
            position = close + 1
    return spans


def last_boxed(text: str, extraction: ExtractionMode = "clean") -> str | None:
    """Content of the last complete ``\\boxed{...}`` of ``text``, or None.

    ``clean``: unclosed boxes are skipped, the content is stripped. ``upstream`` (upstream's evaluation
    extractor, spec 6.2): the scan stops at the first unclosed box and the content is kept as written.
    """
    if extraction not in EXTRACTION_MODES:
        raise ValueError(f"extraction must be one of {EXTRACTION_MODES}, got {extraction!r}")
    spans = boxed_contents(text, stop_at_unclosed=extraction == "upstream")
    if not spans:
        return None
    start, end = spans[-1]
    return text[start:end] if extraction == "upstream" else text[start:end].strip()


def is_correct(
    answer: str | None,
    gold: Any,
    timeout_seconds: int | None = VERIFY_TIMEOUT_SECONDS,
    grading: GradingMode = "clean",
) -> bool:
    """Whether an extracted ``answer`` verifies against ``gold`` in mode ``grading`` (pipeline.grading); never
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
