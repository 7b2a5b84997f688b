"""The one tokenizer loader and the one model loader of every stage (training, warm-up, evaluation, analysis).

Imports of transformers are deferred to the calls, so that stages that import this module stay quick to start.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pipeline.core.io import InputError
from pipeline.core.seal import damage_message, seal_problem


def looks_like_hub_id(reference: str) -> bool:
    """Whether a model or dataset reference has a hub id's form, ``name`` or ``owner/name``; anything else is a
    local path."""
    return re.fullmatch(r"[\w-][\w.-]*(/[\w.-]+)?", reference) is not None


def check_model_reference(model: str) -> None:
    """Refuse a local model path that does not exist (anything but a hub id ``name`` / ``org/name`` is a path)."""
    if not looks_like_hub_id(model) and not Path(model).expanduser().is_dir():
        raise InputError(f"{model}: model directory not found")


def weights_problem(path: Path) -> str | None:
    """Whether a weights file (or every shard of an index) exists and, for safetensors, has a readable header."""
    if path.name.endswith(".index.json"):
        try:
            shards = set(json.loads(path.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            return f"{path.name} unreadable ({error})"
        missing = sorted(shard for shard in shards if not (path.parent / shard).is_file())
        if missing:
            return f"weight shards missing: {', '.join(missing)}"
        problems = (weights_problem(path.parent / shard) for shard in sorted(shards))
        return next((problem for problem in problems if problem), None)
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(path, framework="pt") as handle:
                handle.keys()
        except Exception as error:  # safetensors raises its own error types for truncated or garbled files
            return f"{path.name} unreadable ({error})"
    return None


def model_file_problem(path: Path) -> str | None:
    """Why a file of a model directory cannot be read, or None: a weights file as ``weights_problem`` checks it, a
    JSON file (config, tokenizer, shard index) that does not parse. Other files are left to their loaders."""
    if path.name.endswith(".index.json") or path.suffix == ".safetensors":
        return weights_problem(path)
    if path.suffix == ".json":
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as error:
            return f"{path.name} unreadable ({error})"
    return None


def check_model_files(model: str) -> None:
    """Refuse a local model directory that does not match its seal (``pipeline.core.seal``: a file missing or cut)
    or has a damaged (truncated, garbled) weights, tokenizer or config file with an InputError naming the file; the loaders' own errors would name neither (a hub id is left to the hub client).

    Called by both loaders, so that every stage (and vLLM, whose tokenizer is loaded before its engine starts)
    refuses such a file before any work, with exit status 2: a rerun cannot heal it."""
    directory = Path(model).expanduser()
    if not directory.is_dir():
        return
    if problem := seal_problem(directory):
        raise InputError(damage_message(directory, problem))
    for path in sorted(directory.iterdir()):
        if path.is_file() and (problem := model_file_problem(path)):
            raise InputError(f"{path}: damaged model file: {problem}")


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


def model_hub_records(model: str, revision: str | None) -> list[dict[str, Any]]:
    """The provenance's ``hub`` entry of a model reference: its commit in the hub cache for a hub id at a pinned
    ``revision`` (pipeline.models.hub_cache.hub_record); none for a local directory or an unpinned id."""
    from pipeline.models.hub_cache import hub_record

    if revision is None or Path(model).is_dir():
        return []
    return [hub_record(model, "model", revision)]


def load_tokenizer(
    model: str, *, revision: str | None = None, trust_remote_code: bool = False, gguf_file: str | None = None
) -> Any:
    """The tokenizer of a model directory or hub id, ready for chat prompts: it must have a chat template and an
    eos token; padding and truncation are on the left (prompts are left-padded for generation); the pad token is
    the tokenizer's own, else unk, else eos. ``gguf_file`` reads it from that GGUF file of the directory."""
    from transformers import AutoTokenizer

    check_model_files(model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            model, revision=revision, trust_remote_code=trust_remote_code, **_gguf_option(gguf_file)
        )
    except (OSError, ValueError) as error:
        raise InputError(f"{model}: cannot load its tokenizer ({_first_line(error)})") from None
    if not tokenizer.chat_template:
        raise InputError(f"{model}: the tokenizer has no chat template (every stage prompts through it)")
    if tokenizer.eos_token_id is None:
        raise InputError(f"{model}: the tokenizer has no eos token")
    tokenizer.padding_side = "left"
    tokenizer.truncation_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.unk_token if tokenizer.unk_token is not None else tokenizer.eos_token
    return tokenizer


def is_causal_lm_config(config: Any) -> bool:
    """Whether a model config describes a causal LM: its saved architectures (or its type) are causal-LM classes."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    auto_map = getattr(config, "auto_map", None) or {}
    if "AutoModelForCausalLM" in auto_map:
        return True
    causal_classes = set()
    for names in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        causal_classes.update([names] if isinstance(names, str) else names)
    architectures = getattr(config, "architectures", None)
    if architectures:
        return any(name in causal_classes for name in architectures)
    return config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def working_dtype(model: str, device: str = "cpu") -> Any:
    """The precision a stage computes ``model`` in: on a GPU its stored one (``"auto"``); on the CPU its stored one
    when that is float64 (the tiny models, pipeline.models.tiny_model.TinyModelSpec.dtype), else float32 (half
    precision is slow and coarse on the CPU)."""
    import torch
    from transformers import AutoConfig

    if device != "cpu":
        return "auto"
    check_model_files(model)
    stored = AutoConfig.from_pretrained(model).dtype
    return torch.float64 if stored in (torch.float64, "float64") else torch.float32


def load_model(
    model: str,
    *,
    revision: str | None = None,
    trust_remote_code: bool = False,
    gguf_file: str | None = None,
    **options: Any,
) -> Any:
    """``AutoModelForCausalLM.from_pretrained`` with ``options`` (``dtype``, ``attn_implementation``); a model that
    cannot be loaded, or whose config is not a causal LM's, is an InputError naming it. ``gguf_file`` reads the
    config and the (dequantized) weights from that GGUF file of the directory.

    ``trust_remote_code`` stays off unless the caller's spec sets it: no code from a model repository is run.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    check_model_files(model)
    try:
        config = AutoConfig.from_pretrained(
            model, revision=revision, trust_remote_code=trust_remote_code, **_gguf_option(gguf_file)
        )
    except (OSError, ValueError) as error:
        raise InputError(f"{model}: cannot load it as a causal LM ({_first_line(error)})") from None
    if not is_causal_lm_config(config):
        architectures = ", ".join(getattr(config, "architectures", None) or [config.model_type])
        raise InputError(f"{model}: not a causal language model ({architectures})")
    try:
        return AutoModelForCausalLM.from_pretrained(
            model, revision=revision, trust_remote_code=trust_remote_code, **_gguf_option(gguf_file), **options
        )
    except (OSError, ValueError, KeyError) as error:
        raise InputError(f"{model}: cannot load it as a causal LM ({_first_line(error)})") from None


def _gguf_option(gguf_file: str | None) -> dict[str, str]:
    """``from_pretrained``'s ``gguf_file`` keyword, only when a file is named (not every loader accepts None)."""
    return {"gguf_file": gguf_file} if gguf_file else {}


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
