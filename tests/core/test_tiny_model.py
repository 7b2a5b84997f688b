import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.models.tiny_model import TinyModelSpec, build_model, build_tokenizer, save_tiny_model
from pipeline.tasks.arith import ArithmeticSpec, arithmetic_problems, worked_solution
from pipeline.tasks.rewards import outcome_reward


def test_tokenizer_round_trips_and_ends_turns_with_eos():
    tokenizer = build_tokenizer()
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": r"7+5=? \boxed{}"}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token == "<|im_end|>"
    assert text.endswith("<|im_start|>assistant\n")
    assert len(tokenizer(r"\boxed{12}")["input_ids"]) == len(r"\boxed{12}")


def test_same_spec_same_weights_and_reload(tmp_path):
    tokenizer = build_tokenizer()
    first = build_model(TinyModelSpec(seed=3), tokenizer)
    second = build_model(TinyModelSpec(seed=3), tokenizer)
    other = build_model(TinyModelSpec(seed=4), tokenizer)
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters(), strict=True))
    assert not torch.equal(first.lm_head.weight, other.lm_head.weight)
    path = save_tiny_model(TinyModelSpec(seed=3), tmp_path / "tiny")
    loaded = AutoModelForCausalLM.from_pretrained(path)
    assert torch.equal(loaded.lm_head.weight, first.lm_head.weight)
    assert AutoTokenizer.from_pretrained(path).chat_template == tokenizer.chat_template


def test_arithmetic_problems_are_seeded_and_verifiable():
    spec = ArithmeticSpec(count=20, seed=5, operations=("+", "*"))
    rows = arithmetic_problems(spec)
    assert rows == arithmetic_problems(spec)
    assert rows != arithmetic_problems(ArithmeticSpec(count=20, seed=6, operations=("+", "*")))
    for row in rows:
        assert eval(row["problem"].removesuffix("=?")) == int(row["answer"])
        assert outcome_reward(worked_solution(row["problem"], row["answer"]), row["answer"]) == 1.0
