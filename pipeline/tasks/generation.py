"""Shared helpers for stages that prompt a chat model: chat prompts and seeds.

The warm-up (SFT) and the evaluation build their prompts here, so that both see exactly the tokens that training
sees: the user message is ``build_prompt(problem, template)``, rendered with the tokenizer's chat template,
``add_generation_prompt=True`` and ``enable_thinking=False`` (Qwen3 then pre-fills an empty think block).
"""

from __future__ import annotations

import hashlib
from typing import Any

from pipeline.core.io import InputError
from pipeline.tasks.prompts import PROMPT_TEMPLATES


def problem_from_prompt(prompt: Any, where: str) -> str:
    """The problem text of a training row's conversational prompt: the user content minus the instruction.

    Any prompt template's suffix (clean, upstream or the empty bare one) is removed; content without a known suffix is returned
    whole (a row written with some other instruction still gives a usable problem).
    """
    if (
        not isinstance(prompt, list)
        or not prompt
        or not isinstance(prompt[-1], dict)
        or not isinstance(prompt[-1].get("content"), str)
    ):
        raise InputError(f"{where}: 'prompt' must be a non-empty list of {{role, content}} messages")
    content = prompt[-1]["content"]
    for suffix in PROMPT_TEMPLATES.values():
        if content.endswith(suffix):
            return content.removesuffix(suffix)
    return content


def chat_prompt_ids(tokenizer: Any, user_content: str, enable_thinking: bool = False) -> list[int]:
    """Token ids of the chat prompt ``[user: user_content]`` with the assistant turn opened.

    Rendered to text first and tokenized without extra special tokens, so a template that writes its own BOS is
    not given a second one; ``enable_thinking`` is forwarded to the template (Qwen3 reads it, others ignore it).
    """
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": user_content}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=enable_thinking,
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def stable_hash(obj: Any) -> str:
    """SHA-256 (hex) of ``repr(obj)``: the same on every run and machine, unlike ``hash``."""
    return hashlib.sha256(repr(obj).encode("utf-8")).hexdigest()


def derive_seed(*parts: Any) -> int:
    """A 31-bit seed determined by ``parts`` alone (e.g. the CLI seed, an item id and a sample index)."""
    return int(stable_hash(parts)[:8], 16) & 0x7FFFFFFF
