"""The credit placement stage (pipeline.credit_placement) on hand-made evaluation samples of the decisive-step task
and a real (randomly initialised) tiny model: which rollouts it scores, the oracle at 1 on every token and with the
box left out, the methods without weights left out, the gap share from hand-made accuracies, and the report's
section. Broken on purpose to check these tests: scoring rollouts with a zero advantage changes the counts; the
box left in for the ``_outside_answer`` scores moves grail_shuffled's there; swapping floor and ceiling moves the
gap share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipeline.core.io import InputError
from pipeline.credit_placement import main, outside_answer, scored_groups, weigh
from pipeline.evaluation.offline_credit import credit_methods, group_seed, method_result
from pipeline.evaluation.token_weights import Rollout, TokenAnalysisSpec, prompt_ids, rollout_batch
from pipeline.models.loading import load_model, load_tokenizer
from pipeline.models.tiny_model import TinyModelSpec, save_tiny_model
from pipeline.report import credit_placement_section
from pipeline.tasks.arith import ArithmeticSpec, arithmetic_problems
from pipeline.tasks.decisive import worked_solution

METHODS = {
    "grpo": {"credit": "grpo"},
    "oracle": {"credit": "oracle"},
    "grail_shuffled": {"credit": "grail_shuffled", "grail_symmetry": "both"},
}
PROBLEMS = arithmetic_problems(ArithmeticSpec(count=6, seed=3, low=0, high=6, operations=["+"], terms=2, steps=3))


def wrong_box(solution: str, answer: str) -> str:
    """The worked solution with another value boxed: the decisive error the warmed-up policy makes."""
    return solution.replace(f"\\boxed{{{answer}}}", f"\\boxed{{{int(answer) + 1}}}")


BARE = "bare"  # a wrong answer boxed with no reasoning: no decisive token outside the box


def samples(outcomes: list[list[bool | str]]) -> list[dict]:
    """Four samples per problem, correct (the worked solution), wrong (another value boxed) or ``BARE``."""
    rows = []
    for problem, group in zip(PROBLEMS, outcomes, strict=True):
        solution = worked_solution(problem["problem"], problem["answer"])
        for index, outcome in enumerate(group):
            completion = {True: solution, False: wrong_box(solution, problem["answer"])}.get(outcome)
            completion = completion or f"\\boxed{{{int(problem['answer']) + 1}}}"
            rows.append({"id": problem["id"], "sample": index, "completion": completion, "correct": outcome is True})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def placement(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("placement")
    model = root / "model"
    save_tiny_model(TinyModelSpec(num_hidden_layers=2, hidden_size=64, intermediate_size=128), model)
    benchmark = write_jsonl(root / "decisive.jsonl", [{**p, "source": "test"} for p in PROBLEMS])
    # seed 0: two mixed groups (8 rollouts scored), four all-correct or all-wrong (none scored); seed 1: one mixed,
    # one of its wrong answers bare
    mixed = [True, False, True, False]
    grpo = {
        0: samples([mixed, [True, True, False, True], [True] * 4, [False] * 4, [True] * 4, [False] * 4]),
        1: samples([[False] * 4, [True, False, True, BARE], [True] * 4, [True] * 4, [False] * 4, [False] * 4]),
    }
    runs = {"grpo": grpo}
    accuracy = {"oracle": [True, True, True, False], "grail_shuffled": [True, True, False, False]}
    for method, outcome in accuracy.items():  # every item the same outcomes: 75 % and 50 %
        runs[method] = {seed: samples([outcome] * len(PROBLEMS)) for seed in (0, 1)}
    arguments = []
    for seed, rows in grpo.items():
        arguments += ["--rollouts", str(seed), str(model), str(write_jsonl(root / f"grpo{seed}.jsonl", rows))]
    for method, by_seed in runs.items():
        for seed, rows in by_seed.items():
            arguments += ["--runs", method, str(seed), str(write_jsonl(root / f"{method}{seed}.jsonl", rows))]
    out = root / "out"
    analysis = json.dumps({"temperature": 0.7, "prompt_template": "bare"})
    options = ["--methods", json.dumps(METHODS), "--resamples", "200", "--analysis-spec", analysis]
    main([*arguments, "--benchmark", str(benchmark), *options, "--out-dir", str(out)])
    return out


def test_only_rollouts_with_a_nonzero_advantage_are_scored(placement: Path) -> None:
    result = json.loads((placement / "placement.json").read_text())
    # seed 0: the mixed group's 2 + 2 and the 3-of-4 group's 3 correct (A = +0.25) and 1 wrong; seed 1: 2 + 2
    assert result["rollouts"] == 12 and result["seeds"] == [0, 1]
    assert list(result["placement"]) == ["oracle", "grail_shuffled"]  # GRPO weights no token
    oracle = result["placement"]["oracle"]
    assert oracle["credit"]["rollouts"] == 7 and oracle["blame"]["rollouts"] == 5
    for key in ("credit", "blame", "credit_outside_answer", "blame_outside_answer"):
        assert oracle[key]["mean"] == oracle[key]["low"] == oracle[key]["high"] == 1.0, key
        assert oracle[key]["seeds"] == 2
    # the bare answer has decisive tokens (its box's content) but none outside the box
    assert oracle["blame"]["skipped"] == 0 and oracle["blame_outside_answer"]["skipped"] == 1
    assert oracle["blame_outside_answer"]["rollouts"] == 4


def test_the_gap_share_from_hand_made_accuracies(placement: Path) -> None:
    result = json.loads((placement / "placement.json").read_text())
    assert result["accuracy"]["oracle"] == {"0": 0.75, "1": 0.75}
    assert result["accuracy"]["grpo"] == {"0": pytest.approx(13 / 24), "1": pytest.approx(10 / 24)}
    grpo = (13 / 24 + 10 / 24) / 2
    share = result["gap_share"]["grail_shuffled"]
    assert share["share"] == pytest.approx((0.5 - grpo) / (0.75 - grpo))
    assert share["low"] <= share["share"] <= share["high"]
    assert result["gap_share"]["oracle"]["share"] == 1.0 and result["gap_share"]["grpo"]["share"] == 0.0


def test_the_report_section_and_figure(placement: Path) -> None:
    section = credit_placement_section([placement / "placement.json"], placement.parent)
    assert "| oracle | 1.000 [1.000, 1.000] | 1.000 [1.000, 1.000] | 1.000 [1.000, 1.000] |" in section
    assert "12 rollouts of seeds [0, 1]" in section and "| grail_shuffled | " in section
    assert "![credit placement](out/placement.png)" in section
    assert (placement / "placement.png").read_bytes()[:4] == b"\x89PNG"


def test_outside_answer_keeps_the_tokens_outside_the_box() -> None:
    assert outside_answer([1.0, 2.0, 3.0, 4.0], [True, False, False, True], [False, False, True, True]) == (
        [1.0, 2.0],
        [True, False],
    )


def test_a_benchmark_of_another_task_is_refused(tmp_path: Path) -> None:
    benchmark = write_jsonl(tmp_path / "arith.jsonl", [{"id": "a", "problem": "1+2=?", "answer": "3"}])
    samples_file = write_jsonl(tmp_path / "s.jsonl", [])
    with pytest.raises(InputError, match="not a decisive-step benchmark"):
        rollouts = ["--rollouts", "0", str(tmp_path), str(samples_file)]
        main([*rollouts, "--benchmark", str(benchmark), "--methods", json.dumps(METHODS), "--out-dir", str(tmp_path)])


# ------------------------------------------------------------------ whole groups: batch size and neighbours


GROUP_METHODS = {
    "grail": {"credit": "grail", "grail_symmetry": "both"},
    "oar_g": {"credit": "oar_g"},  # its noise: drawn per call, the same for a group whatever the batch size
    "ktae": {"credit": "ktae"},  # a group method without weights: scored by Â / A
    "group_contrast": {"credit": "examples.group_contrast"},  # a group method with weights
}


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    model_dir = tmp_path_factory.mktemp("policy")
    save_tiny_model(TinyModelSpec(num_hidden_layers=2, hidden_size=64, intermediate_size=128), model_dir)
    return load_model(model_dir).eval(), load_tokenizer(model_dir)


def weighed_groups(policy: tuple, batch_size: int, items: slice, monkeypatch: pytest.MonkeyPatch) -> list:
    """The groups of PROBLEMS[items] (four samples each, mixed outcomes), weighed by GROUP_METHODS."""
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2] / "docs"))
    model, tokenizer = policy
    outcomes = [[True, False, True, False], [True, True, False, True], [False, BARE, True, False]] * 2
    rows = samples(outcomes)
    problems = {p["id"]: p["problem"] for p in PROBLEMS[items]}
    rows = [row for row in rows if row["id"] in problems]
    groups = scored_groups(0, rows, problems, tokenizer, limit=100, where=Path("s.jsonl"))
    methods, _ = credit_methods(GROUP_METHODS, temperature=0.7, seed=0, batch_size=batch_size)
    weigh(groups, model, tokenizer, TokenAnalysisSpec(temperature=0.7, prompt_template="bare"), methods)
    return groups


def group_weights(groups: list) -> list[dict]:
    return [rollout.weights for group in groups for rollout in group.rollouts]


def test_weights_do_not_depend_on_the_batch_size_or_the_other_groups(tiny_policy, monkeypatch) -> None:
    """Batch sizes 6 and 16 (both hold a group of 4) give the same weights bit for bit, and a group weighed alone
    gets the weights it gets among the others: no rollout's weights depend on what else was weighed (packing
    several items' groups into one batch, as the stage did, fails both)."""
    six, sixteen = (weighed_groups(tiny_policy, size, slice(None), monkeypatch) for size in (6, 16))
    assert group_weights(six) == group_weights(sixteen)
    scored = [rollout for group in six for rollout in group.scored]
    assert len(scored) == 24 and all(set(rollout.weights) == set(GROUP_METHODS) for rollout in scored)
    assert all(not rollout.weights for group in six for rollout in group.rollouts if not rollout.scored)
    alone = weighed_groups(tiny_policy, 16, slice(2, 3), monkeypatch)
    assert group_weights(alone) == group_weights(six[2:3])


def test_a_group_method_gets_its_whole_group(tiny_policy, monkeypatch) -> None:
    """KTAE and the worked group example score on whole groups offline: their weights are not the constant a
    fragment would give, and KTAE's relative advantage is 1 + b / A of its token keys."""
    groups = weighed_groups(tiny_policy, 16, slice(0, 3), monkeypatch)
    for name in ("ktae", "group_contrast"):
        values = {round(value, 6) for group in groups for r in group.scored for value in r.weights[name]}
        assert len(values) > 2, name
    rewards = torch.tensor(groups[0].rewards)
    assert rewards.tolist() == [1.0, 0.0, 1.0, 0.0]


def test_each_group_draws_its_own_noise(tiny_policy) -> None:
    """grail_shuffled's permutations come from a generator seeded by (seed, group): the same group gets the same
    draw, another group another (one seed for every group repeated one permutation on every group's rows, which
    put the shuffled control off chance)."""
    model, tokenizer = tiny_policy
    methods, _ = credit_methods({"shuffled": {"credit": "grail_shuffled", "grail_symmetry": "both"}}, 0.7, 0)
    problem = PROBLEMS[0]
    solution = worked_solution(problem["problem"], problem["answer"])
    ids = tokenizer(solution, add_special_tokens=False)["input_ids"]
    prompt = prompt_ids(tokenizer, problem["problem"], TokenAnalysisSpec(prompt_template="bare"))
    rollouts = [Rollout(prompt, ids, True), Rollout(prompt, ids, False)]
    batch = rollout_batch(rollouts, [0.5, -0.5], tokenizer.pad_token_id)
    draws = {
        group: method_result(methods["shuffled"], model, tokenizer, batch, group=group).weights
        for group in ("0/q1", "0/q1 again", "0/q2")
    }
    again = method_result(methods["shuffled"], model, tokenizer, batch, group="0/q1").weights
    assert torch.equal(draws["0/q1"], again)
    assert not torch.equal(draws["0/q1"], draws["0/q2"]) and not torch.equal(draws["0/q1"], draws["0/q1 again"])
    assert group_seed(0, "q1") != group_seed(0, "q2") != group_seed(1, "q2")
