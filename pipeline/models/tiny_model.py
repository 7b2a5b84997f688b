"""A tiny Qwen3 causal LM and a character-level ChatML tokenizer, built offline and seeded.

Everything downstream loads them with ``AutoModelForCausalLM`` / ``AutoTokenizer`` like any hub model.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from pipeline.core.declared import Range, refuse_out_of_range, setting

PAD, UNK, IM_START, IM_END = "<pad>", "<unk>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, UNK, IM_START, IM_END]
CHARACTERS = string.digits + string.ascii_letters + string.punctuation + " \n"

# ChatML, as Qwen models use; `enable_thinking` is accepted and ignored so that Qwen3-style calls work unchanged.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyModelSpec:
    """Architecture of the tiny model (about 0.5 M parameters at the defaults).

    The architecture keys of ``models.<name>.warmup``, declared here once: ``python -m tools.schema`` writes them
    into the schema's ``warmup`` entry, without schema defaults (a model built from a ``source`` takes none of them,
    and a study's filled-in section stays what it wrote); the warm-up stage checks them when it builds the spec."""

    hidden_size: int = setting(128, "the width of the residual stream", Range(minimum=1), schema_default=False)
    intermediate_size: int = setting(512, "the MLP's inner width", Range(minimum=1), schema_default=False)
    num_hidden_layers: int = setting(2, "transformer layers", Range(minimum=1), schema_default=False)
    num_attention_heads: int = setting(4, "query heads", Range(minimum=1), schema_default=False)
    num_key_value_heads: int = setting(2, "key and value heads (grouped-query attention)", Range(minimum=1),
                                       schema_default=False)  # fmt: skip
    head_dim: int = setting(32, "the width of one head", Range(minimum=1), schema_default=False)
    max_position_embeddings: int = setting(512, "the longest sequence (prompt + completion) in tokens",
                                           Range(minimum=1), schema_default=False)  # fmt: skip
    # pipeline.models.loading.working_dtype reads it; float32 stays the default until the recorded studies are
    # regenerated in float64 (issue 54)
    dtype: Literal["float32", "float64"] = setting(
        "float32",
        "the tiny model's precision, stored, trained and evaluated in (default float32, the precision every recorded "
        "study used): float64 leaves the last-bit differences between CPU kernel paths (AVX-512 against AVX2) too "
        "small to flip a sampled token: the CI study's samples were identical on both paths, its losses within "
        "4e-16 relative (docs/lab-notes.md). A model loaded from `path` or built from `source` runs in float32 on "
        "the CPU (bf16 per the training spec on GPUs)",
        schema_default=False,
    )
    seed: int = setting(0, "the warm-up stage's --seed: random init and SFT batch order", Range(minimum=0))

    def __post_init__(self) -> None:
        refuse_out_of_range(self, "warmup spec")


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer: one token per character, exact decode round trip, ChatML template."""
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + list(CHARACTERS))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(SPECIAL_TOKENS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=PAD, unk_token=UNK, eos_token=IM_END, bos_token=None
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(spec: TinyModelSpec, tokenizer: PreTrainedTokenizerFast) -> Qwen3ForCausalLM:
    """A randomly initialised tiny Qwen3 (seeded: the same spec gives the same weights)."""
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    # Initialised in float32 whatever the dtype, so a float64 model starts from the float32 model's weights exactly.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen3ForCausalLM(config).to(getattr(torch, spec.dtype))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def save_tiny_model(spec: TinyModelSpec, out_dir: str | Path) -> Path:
    """Build and ``save_pretrained`` the tiny model and its tokenizer into ``out_dir``."""
    tokenizer = build_tokenizer()
    model = build_model(spec, tokenizer)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
