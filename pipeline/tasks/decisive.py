"""The decisive-step task: arithmetic whose answer is decided by a known part of the completion.

A problem defines ``steps`` independent named chains and asks for one of them (``ArithmeticSpec.steps`` > 1):

    a=3+4, b=5+2, c=9+1. b=?   ->   a=3+4=7. b=5+2=7. c=9+1=10. \\boxed{7}

The worked solution (the warm-up's SFT target) computes every step in order, so a completion carries the steps
that cannot change the answer (the filler: ``a`` and ``c``) beside the one that does (``b``). Whether the boxed
answer is right is decided by the queried step's tokens (its operands as copied, its arithmetic, its result) and
by the boxed content (the copy of that result); an error anywhere else leaves the answer's correctness as it is.
The generator knows which step is queried, so every rollout's per-token truth follows from its problem alone,
with no model: ``decisive_spans`` marks the characters, ``decisive_tokens`` the tokens.

For a completion that leaves the template (a step written twice, a step missing, text after the box), the truth
is kept conservative: the first segment that starts with the queried name is decisive, and so is the content of
the last complete box (what the reward reads); nothing else is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from pipeline.tasks.arith import worked_chain
from pipeline.tasks.boxed import BOX_MARKER, boxed_contents

CHAIN = r"-?\d+(?:[+\-*]-?\d+)+"
STEP = re.compile(rf"([a-z])=({CHAIN})")
# ``a=3+4, b=5+2. b=?`` (pipeline.tasks.arith.arithmetic_problems with steps > 1): named chains, then the query.
PROBLEM = re.compile(rf"((?:[a-z]={CHAIN})(?:, [a-z]={CHAIN})+)\. ([a-z])=\?")
# Where a step of a completion starts: a name and "=" at the start of the text or after white space.
STEP_START = re.compile(r"(?:^|(?<=\s))([a-z])=")


def parse(problem: str) -> tuple[dict[str, str], str] | None:
    """({name: expression}, queried name) of a decisive-step problem found in ``problem`` (e.g. inside a chat
    prompt), or None when it holds none."""
    matches = list(PROBLEM.finditer(problem))
    if not matches:
        return None
    match = matches[-1]  # a prompt's own problem follows any example its template carries
    steps = dict(STEP.findall(match.group(1)))
    return (steps, match.group(2)) if match.group(2) in steps else None


def is_decisive_problem(problem: str) -> bool:
    """Whether ``problem`` is exactly a decisive-step problem (so ``worked_solution`` can work it)."""
    return PROBLEM.fullmatch(problem) is not None


def worked_solution(problem: str, answer: str) -> str:
    """The SFT target: every named chain worked in order (``b=5+2=7.``), then the box."""
    parsed = parse(problem)
    if parsed is None or not is_decisive_problem(problem):
        raise ValueError(f"not a decisive-step problem: {problem!r}")
    steps, _ = parsed
    return " ".join(f"{name}={worked_chain(expression)}" for name, expression in steps.items()) + (
        f" \\boxed{{{answer}}}"
    )


def decisive_spans(problem: str, completion: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of ``completion`` that decide its answer's correctness (module
    docstring): the first segment of the queried step (from its ``name=`` to the next step's start, the box or
    the end, trailing white space excluded) and the content of the last complete ``\\boxed{}``."""
    parsed = parse(problem)
    if parsed is None:
        raise ValueError(f"not a decisive-step problem: {problem!r}")
    _, query = parsed
    box = completion.find(BOX_MARKER)
    reasoning_end = len(completion) if box == -1 else box
    starts = [(m.start(), m.group(1)) for m in STEP_START.finditer(completion[:reasoning_end])]
    spans = []
    for index, (start, name) in enumerate(starts):
        if name == query:
            end = starts[index + 1][0] if index + 1 < len(starts) else reasoning_end
            spans.append((start, len(completion[:end].rstrip())))
            break
    if boxes := boxed_contents(completion):
        spans.append(boxes[-1])
    return spans


def token_character_ends(tokenizer: Any, ids: Sequence[int]) -> list[int]:
    """The end of each token's text in ``decode(ids)``: ``len(decode(ids[:k + 1]))``.

    When the tokens' own texts concatenate to the decoded text (ASCII byte-level BPE, the tiny model's characters),
    the ends are their running lengths: one decode per token, O(T). Otherwise (a byte token that completes a
    character, a tokenizer that drops a leading space) it decodes every prefix, O(T^2), which works for any
    tokenizer: offset mappings exist only for fast tokenizers and encoded text, not for sampled ids.
    """
    pieces = tokenizer.batch_decode([[token] for token in ids], skip_special_tokens=True)
    if "".join(pieces) == tokenizer.decode(list(ids), skip_special_tokens=True):
        return list(accumulate(len(piece) for piece in pieces))
    return [len(tokenizer.decode(list(ids[: k + 1]), skip_special_tokens=True)) for k in range(len(ids))]


def answer_region(completion: str) -> tuple[int, int] | None:
    """Character span of the last complete ``\\boxed{...}``, marker and braces included (None without one)."""
    if not (boxes := boxed_contents(completion)):
        return None
    content_start, content_end = boxes[-1]
    return content_start - len(BOX_MARKER), content_end + 1


@dataclass(frozen=True)
class TokenTruth:
    """Per completion token: whether it is decisive, and whether it lies in the answer's box (its marker, braces
    and content), so that a score can leave the box out."""

    decisive: list[bool]
    in_answer: list[bool]


def token_truth(tokenizer: Any, problem: str, completion_ids: Sequence[int]) -> TokenTruth:
    """The completion's ``TokenTruth``: a token is in a span when its text overlaps it."""
    text = tokenizer.decode(list(completion_ids), skip_special_tokens=True)
    ends = token_character_ends(tokenizer, completion_ids)
    starts = [0, *ends[:-1]] if ends else []
    answer = answer_region(text)

    def overlapping(spans: list[tuple[int, int]]) -> list[bool]:
        return [
            any(a < span_end and span_start < b for span_start, span_end in spans)
            for a, b in zip(starts, ends, strict=True)
        ]

    return TokenTruth(overlapping(decisive_spans(problem, text)), overlapping([answer] if answer else []))


def decisive_tokens(tokenizer: Any, problem: str, completion_ids: Sequence[int]) -> list[bool]:
    """Per completion token: whether its text overlaps a decisive span of the decoded completion."""
    return token_truth(tokenizer, problem, completion_ids).decisive
