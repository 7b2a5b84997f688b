"""Outcome reward (spec 4): the last complete ``\\boxed{...}`` of a completion, verified against the gold.

r(completion, gold) = 1  if verify(parse("$" + gold + "$"), parse("$" + last_boxed(completion) + "$"))
                      0  otherwise (no box, parse failure, timeout, any exception)
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Literal

from math_verify import parse, verify

PROMPT_SUFFIX_CLEAN = " Please reason step by step, and put your final answer within \\boxed{}."
# Upstream wrote the suffix as a non-raw Python string: "\b" became a backspace (U+0008), so the paper's prompts
# asked for "<BS>oxed{}". Reproducing the paper's numbers means reproducing that string.
PROMPT_SUFFIX_UPSTREAM = " Please reason step by step, and put your final answer within \boxed{}."
PromptTemplate = Literal["clean", "upstream"]
PROMPT_TEMPLATES: dict[PromptTemplate, str] = {"clean": PROMPT_SUFFIX_CLEAN, "upstream": PROMPT_SUFFIX_UPSTREAM}

BOX_MARKER = "\\boxed{"
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


def boxed_contents(text: str) -> list[tuple[int, int]]:
    """Character spans ``(content_start, content_end)`` of every complete, non-overlapping ``\\boxed{...}``.

    Braces are balanced by depth counting; an occurrence whose braces never close is skipped and the scan
    continues after its marker (as the training reward's recursive regex does). Linear in ``len(text)``.
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
            position = content_start
        else:
            spans.append((content_start, close))
            position = close + 1
    return spans


def last_boxed(text: str) -> str | None:
    """Content (stripped) of the last complete ``\\boxed{...}`` of ``text``, or None."""
    spans = boxed_contents(text)
    if not spans:
        return None
    start, end = spans[-1]
    return text[start:end].strip()


def _verify_in_main_thread(gold: str, answer: str, timeout_seconds: int | None) -> bool:
    # math-verify's timeout uses SIGALRM, which only works in the main thread; elsewhere it must be disabled.
    if threading.current_thread() is not threading.main_thread():
        timeout_seconds = None
    gold_parsed = parse(f"${gold}$", parsing_timeout=timeout_seconds)
    answer_parsed = parse(f"${answer}$", parsing_timeout=timeout_seconds)
    return bool(verify(gold_parsed, answer_parsed, timeout_seconds=timeout_seconds))


def is_correct(answer: str | None, gold: Any, timeout_seconds: int | None = VERIFY_TIMEOUT_SECONDS) -> bool:
    """Whether an extracted ``answer`` verifies against ``gold`` (gold parsed first); never raises."""
    if answer is None or gold is None:
        return False
    try:
        return _verify_in_main_thread(str(gold).strip(), answer, timeout_seconds)
    except Exception:
        return False


def outcome_reward(completion: str, gold: Any, timeout_seconds: int | None = VERIFY_TIMEOUT_SECONDS) -> float:
    """1.0 when the last complete box of ``completion`` verifies against ``gold``, else 0.0."""
    return 1.0 if is_correct(last_boxed(completion), gold, timeout_seconds) else 0.0


def completion_text(completion: Any) -> str:
    """Plain text of a TRL completion: a string, or a conversational list of messages."""
    if isinstance(completion, str):
        return completion
    return "".join(message.get("content", "") for message in completion)


def trl_outcome_reward(completions: list[Any], solution: list[str], **_: Any) -> list[float]:
    """TRL reward function (``reward_funcs=[trl_outcome_reward]``): one reward per completion."""
    return [outcome_reward(completion_text(c), gold) for c, gold in zip(completions, solution, strict=True)]


def gold_self_check(gold: Any, timeout_seconds: int | None = VERIFY_TIMEOUT_SECONDS) -> bool:
    """Whether ``gold`` verifies against itself: False marks an item no answer can ever be graded correct on."""
    return is_correct(str(gold).strip(), gold, timeout_seconds)
