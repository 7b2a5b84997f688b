"""Session fixtures: a random 4-layer tiny model, and the tiny model after a short SFT (it boxes its answers)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_support import arithmetic_rows

from pipeline.models.tiny_model import TinyModelSpec, build_model, build_tokenizer
from pipeline.tasks.generation import chat_prompt_ids
from pipeline.warmup import Example, SFTSettings, sft_target, train_sft


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised 4-layer tiny model (four distinct GRAIL leaves) and its tokenizer."""
    out = tmp_path_factory.mktemp("random_model")
    tokenizer = build_tokenizer()
    build_model(TinyModelSpec(num_hidden_layers=4, seed=0), tokenizer).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def boxing_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model after a short SFT on worked arithmetic: most completions contain a complete box."""
    tokenizer = build_tokenizer()
    model = build_model(TinyModelSpec(seed=0), tokenizer)
    examples = [
        Example(
            prompt_ids=chat_prompt_ids(tokenizer, row["prompt"][0]["content"]),
            completion_ids=[
                *tokenizer(sft_target(row["prompt"][0]["content"].split(" ")[0], row["solution"]))["input_ids"],
                tokenizer.eos_token_id,
            ],
        )
        for row in arithmetic_rows(200, seed=1)
    ]
    train_sft(model, examples, SFTSettings(steps=40, learning_rate=5e-3, batch_size=16), 0, tokenizer.pad_token_id)
    out = tmp_path_factory.mktemp("boxing_model")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
