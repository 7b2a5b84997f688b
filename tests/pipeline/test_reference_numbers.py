"""The reference-numbers guard (tests/reference_numbers.py): the shared CI study's numbers equal the committed
reference, and ``compare`` names what differs, where and by how much."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from pipeline.core.kernels import cpu_model
from tests.reference_numbers import (
    CROSS_CPU_RTOL,
    UPDATE_COMMAND,
    collect,
    compare,
    evaluation_items,
    failure_message,
    read_reference,
    tensors_digest,
)


@pytest.mark.slow
def test_ci_study_matches_reference(finished_ci_study: Path) -> None:
    """Warm-up losses and weights, every run's per-step metrics and final weights, every evaluation's per-item
    correctness and completions: exactly the reference's."""
    differences = compare(read_reference(), collect(finished_ci_study / "results"), cpu_model())
    if differences:
        pytest.fail(failure_message(differences), pytrace=False)


def step(number: int, loss: float, reward: float = 0.25) -> dict[str, Any]:
    return {"step": number, "loss": loss, "reward": reward, "grad_norm": 0.5, "entropy": 3.5, "num_tokens": 800.0}


REFERENCE: dict[str, Any] = {
    "header": {"command": UPDATE_COMMAND, "cpu_capability": "AVX2", "cpu": "AMD EPYC"},
    "warmup": {"tiny": {"losses": [4.5, 3.25], "weights": "a" * 64}},
    "training": {
        "tiny/grail/seed0": {"steps": [step(1, 0.125), step(2, 0.01234567)], "final_weights": "b" * 64},
        "tiny/grpo/seed0": {"steps": [step(1, 0.5), step(2, 0.25)], "final_weights": "c" * 64},
    },
    "evaluation": {
        "tiny/grpo/seed0/final/arith_add": {
            "correct": {"q1": "10", "q2": "00", "q3": "11"},
            "completions": {"q1": "1" * 16, "q2": "2" * 16, "q3": "3" * 16},
        }
    },
}


@pytest.fixture
def actual() -> dict[str, Any]:
    """The reference's numbers as a run would collect them (no header), to be changed by each test."""
    numbers = copy.deepcopy(REFERENCE)
    del numbers["header"]
    return numbers


def test_equal_numbers_no_differences_and_the_header_is_not_compared(actual: dict[str, Any]) -> None:
    assert compare(REFERENCE, actual) == []


def test_a_changed_loss_names_run_step_metric_values_and_difference(actual: dict[str, Any]) -> None:
    actual["training"]["tiny/grail/seed0"]["steps"][1]["loss"] = 0.01234571
    assert compare(REFERENCE, actual) == [
        "tiny/grail/seed0 step 2 loss: reference 0.01234567, actual 0.01234571 (+4.0e-08)"
    ]


def test_floats_are_compared_exactly(actual: dict[str, Any]) -> None:
    """One unit in the last place is a difference, printed with enough digits to tell the two apart."""
    loss = REFERENCE["training"]["tiny/grpo/seed0"]["steps"][0]["loss"]
    actual["training"]["tiny/grpo/seed0"]["steps"][0]["loss"] = next_float = loss + loss * 2**-52
    (line,) = compare(REFERENCE, actual)
    assert line.startswith(f"tiny/grpo/seed0 step 1 loss: reference {loss!r}, actual {next_float!r} (+")


def test_on_another_cpu_model_continuous_numbers_move_within_the_tolerance_and_digests_are_not_compared(
    actual: dict[str, Any],
) -> None:
    """What an Intel Xeon gave against an AMD EPYC reference (the module docstring of tests/reference_numbers.py):
    losses, gradient norms and entropies moved in their last bits, every weight digest differed."""
    run = actual["training"]["tiny/grail/seed0"]
    run["steps"][0] |= {"loss": 0.125 * (1 + 1e-6), "grad_norm": 0.5 * (1 - 1.7e-3), "entropy": 3.5 * (1 + 8e-6)}
    run["final_weights"] = "d" * 64
    actual["warmup"]["tiny"] |= {"losses": [4.5 * (1 + 1.3e-6), 3.25], "weights": "e" * 64}
    assert compare(REFERENCE, actual, "Intel(R) Xeon(R) Processor") == []
    assert len(compare(REFERENCE, actual, "AMD EPYC")) == 6  # on the reference's model: exactly, digests too
    assert len(compare(REFERENCE, actual)) == 6


def test_on_another_cpu_model_discrete_numbers_and_larger_moves_are_still_differences(actual: dict[str, Any]) -> None:
    steps = actual["training"]["tiny/grpo/seed0"]["steps"]
    steps[0]["grad_norm"] = 0.5 * (1 + 2 * CROSS_CPU_RTOL)
    steps[1] |= {"reward": 0.25 + 2**-10, "num_tokens": 801.0}
    actual["evaluation"]["tiny/grpo/seed0/final/arith_add"]["completions"]["q3"] = "f" * 16
    assert compare(REFERENCE, actual, "Intel(R) Xeon(R) Processor") == [
        "tiny/grpo/seed0 step 1 grad_norm: reference 0.5, actual 0.51 (+1.0e-02)",
        "tiny/grpo/seed0 step 2 reward: reference 0.25, actual 0.2509765625 (+9.8e-04)",
        "tiny/grpo/seed0 step 2 num_tokens: reference 800.0, actual 801.0 (+1.0e+00)",
        "eval tiny/grpo/seed0/final/arith_add: completions of 1 of 3 items differ (q3)",
    ]


def test_a_flipped_item_names_the_item_sample_and_direction(actual: dict[str, Any]) -> None:
    evaluation = actual["evaluation"]["tiny/grpo/seed0/final/arith_add"]
    evaluation["correct"] |= {"q1": "00", "q2": "01"}
    assert compare(REFERENCE, actual) == [
        "eval tiny/grpo/seed0/final/arith_add: items q1, q2 differ (correct->wrong: q1#0; wrong->correct: q2#1)"
    ]


def test_changed_completions_are_named_even_when_correctness_holds(actual: dict[str, Any]) -> None:
    actual["evaluation"]["tiny/grpo/seed0/final/arith_add"]["completions"]["q3"] = "f" * 16
    assert compare(REFERENCE, actual) == [
        "eval tiny/grpo/seed0/final/arith_add: completions of 1 of 3 items differ (q3)"
    ]


def test_a_changed_digest_is_named_with_both_digests(actual: dict[str, Any]) -> None:
    actual["training"]["tiny/grpo/seed0"]["final_weights"] = "d" * 64
    actual["warmup"]["tiny"]["weights"] = "e" * 64
    assert compare(REFERENCE, actual) == [
        f"warm-up tiny weights: digest differs (reference {'a' * 12}…, actual {'e' * 12}…)",
        f"tiny/grpo/seed0 final weights: digest differs (reference {'c' * 12}…, actual {'d' * 12}…)",
    ]


def test_missing_and_extra_runs_steps_and_items(actual: dict[str, Any]) -> None:
    training = actual["training"]
    training["tiny/oar_g/seed0"] = training.pop("tiny/grail/seed0")
    training["tiny/grpo/seed0"]["steps"].pop()
    del actual["evaluation"]["tiny/grpo/seed0/final/arith_add"]["correct"]["q2"]
    assert compare(REFERENCE, actual) == [
        "training run tiny/grail/seed0: in the reference, missing from the results",
        "training run tiny/oar_g/seed0: in the results, not in the reference",
        "tiny/grpo/seed0 step 2: in the reference, missing from the results",
        "eval tiny/grpo/seed0/final/arith_add item q2: in the reference, missing from the results",
    ]


def test_warmup_differences_lead(actual: dict[str, Any]) -> None:
    """Stages in the order they run: the first line is the earliest change, here a warm-up step."""
    actual["warmup"]["tiny"]["losses"][1] = 3.5
    actual["training"]["tiny/grail/seed0"]["steps"][0]["reward"] = 0.5
    assert compare(REFERENCE, actual) == [
        "warm-up tiny step 2 loss: reference 3.25, actual 3.5 (+2.5e-01)",
        "tiny/grail/seed0 step 1 reward: reference 0.25, actual 0.5 (+2.5e-01)",
    ]


def test_failure_message_names_the_one_command_and_the_changelog(actual: dict[str, Any]) -> None:
    actual["training"]["tiny/grpo/seed0"]["steps"][0]["grad_norm"] = 0.75
    message = failure_message(compare(REFERENCE, actual))
    assert "  tiny/grpo/seed0 step 1 grad_norm: reference 0.5, actual 0.75 (+2.5e-01)" in message.splitlines()
    assert f"    {UPDATE_COMMAND}" in message.splitlines()
    assert '"Changed results"' in message and "CHANGELOG.md" in message


def test_weights_digest_is_of_tensor_content_not_file_bytes(tmp_path: Path) -> None:
    """The same tensors written in another order with other metadata digest alike; one changed value or dtype not."""
    tensors = {"b": torch.arange(6.0).reshape(2, 3), "a": torch.ones(4, dtype=torch.bfloat16)}
    for name, contents, metadata in [
        ("one", tensors, None),
        ("two", dict(reversed(tensors.items())), {"format": "pt"}),
        ("value", tensors | {"b": tensors["b"] + torch.eye(2, 3) * 1e-6}, None),
        ("dtype", tensors | {"a": tensors["a"].half()}, None),
    ]:
        (tmp_path / name).mkdir()
        save_file(contents, tmp_path / name / "model.safetensors", metadata=metadata)
    digests = {name: tensors_digest(tmp_path / name) for name in ("one", "two", "value", "dtype")}
    assert digests["one"] == digests["two"]
    assert len({digests["one"], digests["value"], digests["dtype"]}) == 3


def test_evaluation_items_are_ordered_by_item_then_sample(tmp_path: Path) -> None:
    rows = [
        {"id": "q2", "sample": 1, "completion": "\\boxed{3}", "correct": True, "num_tokens": 5},
        {"id": "q1", "sample": 0, "completion": "x", "correct": False, "num_tokens": 1},
        {"id": "q2", "sample": 0, "completion": "y", "correct": False, "num_tokens": 1},
    ]
    samples = tmp_path / "arith_add.jsonl"
    samples.write_text("".join(json.dumps(row) + "\n" for row in rows))
    items = evaluation_items(samples)
    assert items["correct"] == {"q1": "0", "q2": "01"}
    samples.write_text("".join(json.dumps(row) + "\n" for row in reversed(rows)))
    assert evaluation_items(samples) == items
