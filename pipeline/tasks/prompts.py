"""The prompt templates: the instruction appended to every problem (training data, warm-up, evaluation, analysis).

A module of its own, without the grader: the stages that only render prompts (data preparation, warm-up) do not
depend on how answers are graded, and so their code digest does not change when the grader does.
"""

from __future__ import annotations

from typing import Literal

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


def build_prompt(problem: str, template: PromptTemplate = "clean") -> str:
    """The user message: the problem followed by the boxed-answer instruction of ``template``."""
    try:
        return problem + PROMPT_TEMPLATES[template]
    except KeyError:
        raise ValueError(f"prompt_template must be one of {sorted(PROMPT_TEMPLATES)}, got {template!r}") from None
