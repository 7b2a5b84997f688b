"""Shared helpers for stages that prompt a chat model: specs from mappings, loading, chat prompts, seeds.

The warm-up (SFT) and the evaluation build their prompts here, so that both see exactly the tokens that training
sees: the user message is ``build_prompt(problem, template)``, rendered with the tokenizer's chat template,
``add_generation_prompt=True`` and ``enable_thinking=False`` (Qwen3 then pre-fills an empty think block).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pipeline.io import InputError
from pipeline.rewards import PROMPT_TEMPLATES

SpecT = TypeVar("SpecT")


def dataclass_from_mapping(cls: type[SpecT], mapping: Any, where: str) -> SpecT:
    """Build the (frozen) dataclass ``cls`` from ``mapping``, refusing unknown keys and mistyped values.

    A field's expected type is that of its default: bool, int, str, float (an int is accepted for a float), or
    a nested dataclass (built recursively from a nested mapping). A default of None accepts any scalar.
    ``where`` names the spec in error messages (e.g. ``"evaluation spec"``).
    """
    if mapping is None:
        mapping = {}
    if not isinstance(mapping, Mapping):
        raise InputError(f"{where}: expected a mapping, got {type(mapping).__name__}")
    fields = {field.name: field for field in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(mapping) - set(fields))
    if unknown:
        raise InputError(f"{where}: unknown key(s) {unknown}; known keys: {sorted(fields)}")
    values = {}
    defaults = cls()
    for name, value in mapping.items():
        default = getattr(defaults, name)
        key = f"{where}.{name}"
        if dataclasses.is_dataclass(default):
            values[name] = dataclass_from_mapping(type(default), value, key)
        else:
            values[name] = _checked_value(value, default, key)
    return cls(**values)


def _checked_value(value: Any, default: Any, key: str) -> Any:
    """``value`` if it has the type of ``default`` (int accepted for float; bool never accepted for numbers)."""
    if default is None:
        if value is not None and not isinstance(value, bool | int | float | str):
            raise InputError(f"{key}: expected a scalar, got {type(value).__name__}")
        return value
    if isinstance(default, bool) or isinstance(value, bool):
        if not (isinstance(default, bool) and isinstance(value, bool)):
            raise InputError(f"{key}: expected {type(default).__name__}, got {value!r}")
        return value
    if isinstance(default, float) and isinstance(value, int):
        return float(value)
    if not isinstance(value, type(default)):
        raise InputError(f"{key}: expected {type(default).__name__}, got {type(value).__name__} {value!r}")
    return value


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


def resolve_model(model: str, revision: str | None) -> str:
    """A local directory for ``model`` when a hub ``revision`` is pinned: the snapshot at that revision.

    A local directory, or a hub id without a revision, is returned unchanged. The snapshot comes from the
    Hugging Face cache (``HF_HOME``), so offline mode (``HF_HUB_OFFLINE=1``) works once it has been fetched.
    """
    if revision is None or Path(model).is_dir():
        return model
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(model, revision=revision)
    except Exception as error:
        raise InputError(f"model {model!r} at revision {revision!r}: cannot fetch it ({_first_line(error)})") from None


def load_tokenizer(model: str) -> Any:
    """The tokenizer of a local model directory or hub id; it must have a chat template and an eos token."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
    except (OSError, ValueError) as error:
        raise InputError(f"model {model!r}: cannot load its tokenizer ({_first_line(error)})") from None
    if not tokenizer.chat_template:
        raise InputError(f"model {model!r}: the tokenizer has no chat template")
    if tokenizer.eos_token_id is None:
        raise InputError(f"model {model!r}: the tokenizer has no eos token")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(model: str, **kwargs: Any) -> Any:
    """``AutoModelForCausalLM.from_pretrained(model)``; a missing path or a non-causal-LM is an InputError.

    ``trust_remote_code`` stays off (the transformers default): no code from a model repository is run.
    """
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(model, **kwargs)
    except (OSError, ValueError, KeyError) as error:
        raise InputError(f"model {model!r}: cannot load it as a causal LM ({_first_line(error)})") from None


def model_fingerprint(model: str) -> dict[str, Any]:
    """What identifies a model's weights cheaply: its files' names, sizes and mtimes (local), or the hub id."""
    path = Path(model)
    if not path.is_dir():
        return {"model": model}
    files = sorted(p for p in path.rglob("*") if p.is_file())
    listing = [(str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    return {"model": str(path.resolve()), "files": stable_hash(listing)}


def stable_hash(obj: Any) -> str:
    """SHA-256 (hex) of ``repr(obj)``: the same on every run and machine, unlike ``hash``."""
    return hashlib.sha256(repr(obj).encode("utf-8")).hexdigest()


def derive_seed(*parts: Any) -> int:
    """A 31-bit seed determined by ``parts`` alone (e.g. the CLI seed, an item id and a sample index)."""
    return int(stable_hash(parts)[:8], 16) & 0x7FFFFFFF


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
