"""Shared fixtures: the character tokenizer, a small 4-layer Qwen3 and a batch of prompt + completion ids."""

from __future__ import annotations

import copy

import pytest
import torch
from credit_helpers import left_pad, right_pad

from pipeline.credit import answer_mask_from_spans, find_boxed_spans
from pipeline.models.qwen_vocabulary import build_qwen_tokenizer
from pipeline.models.tiny_model import TinyModelSpec, build_model, build_tokenizer

SMALL_SPEC = TinyModelSpec(
    hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=16
)
PROMPTS = ["1+2=", "x", "7*6?"]
COMPLETIONS = ["so \\boxed{3}.", "\\boxed{{a}{b}} tail", "no answer here"]


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    """Tiny tensors gain nothing from threads, and on a shared CPU they lose much (oversubscription)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def char_tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """A fast tokenizer with the real Qwen2.5/Qwen3 vocabulary, built once per session from qwen.tiktoken."""
    return build_qwen_tokenizer()


@pytest.fixture(scope="session")
def small_model(char_tokenizer):
    model = build_model(SMALL_SPEC, char_tokenizer)
    model.eval()
    return model


@pytest.fixture(scope="session")
def batch(char_tokenizer):
    """Left-padded prompts, right-padded completions ending in EOS, as TRL lays them out."""
    tok = char_tokenizer
    prompts = [tok(p, add_special_tokens=False).input_ids for p in PROMPTS]
    completions = [[*tok(c, add_special_tokens=False).input_ids, tok.eos_token_id] for c in COMPLETIONS]
    prompt_ids = left_pad(prompts, tok.pad_token_id)
    completion_ids = right_pad(completions, tok.pad_token_id)
    prompt_mask = left_pad([[1] * len(p) for p in prompts], 0)
    completion_mask = right_pad([[1] * len(c) for c in completions], 0)
    return {
        "input_ids": torch.cat([prompt_ids, completion_ids], dim=1),
        "attention_mask": torch.cat([prompt_mask, completion_mask], dim=1),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
    }


@pytest.fixture(scope="module")
def model64(small_model):
    """A float64 copy of the small model, for the independent reference computations."""
    return copy.deepcopy(small_model).double()


@pytest.fixture(scope="module")
def answer_mask(char_tokenizer, batch):
    """The batch's first-box answer positions: rows 0 and 1 have a box, row 2 has none."""
    spans = find_boxed_spans(char_tokenizer, batch["completion_ids"], batch["completion_mask"])
    mask = answer_mask_from_spans(spans, batch["completion_ids"].shape[1])
    assert mask.any(dim=1).tolist() == [True, True, False]
    return mask
