"""pass@k and per-benchmark scoring against hand-worked cases and brute-force enumeration."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sample_rows import sample_rows as rows

from pipeline.core.io import InputError
from pipeline.stats.metrics import pass_at_k, score_benchmark


def brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """Fraction of the k-subsets of n samples (the first c correct) that hold a correct sample."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in subset) for subset in subsets), len(subsets))


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (3, 0, 1, 0.0),
        (3, 1, 1, 1 / 3),
        (3, 1, 2, 2 / 3),  # 1 - C(2,2)/C(3,2)
        (3, 1, 3, 1.0),  # n - c = 2 < k
        (3, 3, 1, 1.0),
        (10, 2, 5, 1 - 56 / 252),  # 1 - C(8,5)/C(10,5)
        (1, 1, 1, 1.0),
    ],
)
def test_pass_at_k_hand_cases(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-15)


@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_equals_subset_enumeration(case: tuple[int, int, int]) -> None:
    n, c, k = case
    assert pass_at_k(n, c, k) == pytest.approx(float(brute_force_pass_at_k(n, c, k)), abs=1e-12)


def test_pass_at_k_is_stable_for_large_n() -> None:
    # C(1000, 500) overflows a float; the product form does not.
    expected = 1 - math.comb(900, 500) / math.comb(1000, 500)
    assert pass_at_k(1000, 100, 500) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_refuses_impossible_arguments(n: int, c: int, k: int) -> None:
    with pytest.raises(InputError, match="pass_at_k"):
        pass_at_k(n, c, k)


def test_score_benchmark_hand_case() -> None:
    scores = score_benchmark(rows({"a": [True, False, False], "b": [False, False, False], "c": [True, True, True]}))
    assert scores["acc@3"] == pytest.approx((1 / 3 + 0 + 1) / 3)
    assert scores["pass@1"] == pytest.approx(scores["acc@3"])
    assert scores["pass@2"] == pytest.approx((2 / 3 + 0 + 1) / 3)
    assert scores["pass@3"] == pytest.approx(2 / 3)
    assert scores["items"] == 3 and scores["samples"] == 9
    # Answers: a/0 (10 tokens) and c/0..2 (10, 20, 30): mean over answered samples only.
    assert scores["mean_tokens"] == pytest.approx((10 + 10 + 20 + 30) / 4)
    assert scores["no_answer"] == 5
    # Runs: sample 0 -> (1+0+1)/3, sample 1 -> 1/3, sample 2 -> 1/3; population std.
    runs = [2 / 3, 1 / 3, 1 / 3]
    mean = sum(runs) / 3
    assert scores["run_acc_mean"] == pytest.approx(mean)
    assert scores["run_acc_std"] == pytest.approx(math.sqrt(sum((r - mean) ** 2 for r in runs) / 3))


def test_score_benchmark_with_unequal_sample_counts_uses_the_minimum_for_pass_at_k() -> None:
    scores = score_benchmark(rows({"a": [True, False, False, False], "b": [False, True]}))
    assert "pass@3" not in scores and "acc@2" in scores
    assert scores["acc@2"] == pytest.approx((1 / 4 + 1 / 2) / 2)
    assert scores["pass@2"] == pytest.approx((pass_at_k(4, 1, 2) + 1.0) / 2)
    # Run 2 and 3 hold only item a's samples.
    runs = [1 / 2, 1 / 2, 0, 0]
    assert scores["run_acc_mean"] == pytest.approx(sum(runs) / 4)


def test_score_benchmark_without_answers_has_nan_mean_tokens() -> None:
    scores = score_benchmark(rows({"a": [False, False]}))
    assert math.isnan(scores["mean_tokens"]) and scores["no_answer"] == 2


def test_wrong_samples_with_an_answer_count_in_mean_tokens() -> None:
    scores = score_benchmark(rows({"a": [True, False]}, extracted_when_wrong="7"))
    assert scores["mean_tokens"] == pytest.approx(15) and scores["no_answer"] == 0


def test_sample_order_in_the_file_does_not_matter() -> None:
    ordered = rows({"a": [True, False, True], "b": [False, True, False]})
    assert score_benchmark(ordered[::-1]) == score_benchmark(ordered)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.pop("correct"), "row 2: missing field 'correct'"),
        (lambda r: r.update(correct=1), "row 2: field 'correct' has type int"),
        (lambda r: r.update(sample=True), "row 2: field 'sample' has type bool"),
        (lambda r: r.update(num_tokens=-1), "row 2: 'sample' and 'num_tokens' must be >= 0"),
        (lambda r: r.update(id=3), "row 2: field 'id' has type int"),
        (lambda r: r.update(correct=True, extracted=None), "row 2: marked correct but has no extracted answer"),
        (lambda r: r.update(sample=0), "row 2: duplicate sample 0 of item 'a'"),
    ],
)
def test_score_benchmark_refuses_inconsistent_rows(change, message: str) -> None:
    samples = rows({"a": [True, False]})
    change(samples[1])
    with pytest.raises(InputError, match=f"^file.jsonl: {message}"):
        score_benchmark(samples, source="file.jsonl")


def test_score_benchmark_refuses_an_empty_file() -> None:
    with pytest.raises(InputError, match="no samples"):
        score_benchmark([], source="empty.jsonl")
