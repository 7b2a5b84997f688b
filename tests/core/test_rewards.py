import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.tasks.boxed import boxed_contents, last_boxed
from pipeline.tasks.prompts import PROMPT_SUFFIX_UPSTREAM, build_prompt
from pipeline.tasks.rewards import gold_self_check, outcome_reward, trl_outcome_reward, trl_reward_function


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"\boxed{3}", "3"),
        (r"first \boxed{1} then \boxed{ \frac{1}{2} }", r"\frac{1}{2}"),
        (r"\boxed{\{1,2\}}", r"\{1,2\}"),
        (r"\boxed{1} and an unclosed \boxed{2", "1"),
        (r"\boxed{x", None),
        ("no box at all", None),
        (r"\boxed{}", ""),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_unbalanced_occurrence_is_skipped_and_scanning_continues():
    text = r"\boxed{a \boxed{b}"
    assert [text[s:e] for s, e in boxed_contents(text)] == ["b"]


@pytest.mark.parametrize(
    ("completion", "gold", "reward"),
    [
        (r"so \boxed{\frac{1}{2}}", "0.5", 1.0),
        (r"\boxed{1} wait, \boxed{2}", "2", 1.0),
        (r"\boxed{2} wait, \boxed{1}", "2", 0.0),
        ("the answer is 2", "2", 0.0),
        (r"\boxed{27}", "27.0", 1.0),
        (r"\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    ],
)
def test_outcome_reward(completion, gold, reward):
    assert outcome_reward(completion, gold) == reward


def test_trl_reward_accepts_conversational_completions():
    completions = [[{"role": "assistant", "content": r"\boxed{4}"}], [{"role": "assistant", "content": "4"}]]
    assert trl_outcome_reward(completions, solution=["4", "4"]) == [1.0, 0.0]


@pytest.mark.timeout(120)  # a hang guard (math-verify on the whole text would not finish)
def test_megabyte_completion_is_scored():
    assert outcome_reward("1+" * 500_000 + r"\boxed{3}", "3") == 1.0


def test_gold_self_check():
    assert gold_self_check("27.0")
    assert gold_self_check(r"\frac{10}{3}")
    assert not gold_self_check("")
    assert not gold_self_check("$")


def test_upstream_prompt_reproduces_the_backspace_quirk():
    assert "\x08oxed{}" in PROMPT_SUFFIX_UPSTREAM
    assert build_prompt("1+1=?", "clean").endswith("within \\boxed{}.")
    with pytest.raises(ValueError, match="prompt_template"):
        build_prompt("1+1=?", "fancy")


def naive_boxed_contents(text):
    """The obvious quadratic scan: depth-count forward from each marker."""
    spans, position, marker = [], 0, "\\boxed{"
    while (start := text.find(marker, position)) != -1:
        depth, index = 1, start + len(marker)
        while index < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[index], 0)
            index += 1
        if depth == 0:
            spans.append((start + len(marker), index - 1))
            position = index
        else:
            position = start + len(marker)
    return spans


@given(st.lists(st.sampled_from(["\\boxed{", "{", "}", "a", "\\"]), max_size=30).map("".join))
def test_linear_box_scan_matches_the_naive_scan(text):
    assert boxed_contents(text) == naive_boxed_contents(text)


@pytest.mark.timeout(60)  # a hang guard: the quadratic scan needs hours here
def test_megabyte_of_unclosed_markers_is_scanned():
    assert boxed_contents("\\boxed{" * 150_000) == []


def test_trl_reward_function_is_bound_to_its_grading_mode_and_keeps_the_metric_name():
    completions = [r"\boxed{3000000}"]
    assert trl_reward_function("clean")(completions, solution=["3e6"]) == [1.0]
    assert trl_reward_function("upstream")(completions, solution=["3e6"]) == [0.0]
    assert trl_reward_function("upstream").__name__ == "trl_outcome_reward"
