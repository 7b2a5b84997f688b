"""Wilcoxon rows (the paper's W = 459.5, p = 1.3e-8), exact tie-aware p-values, Holm, bootstrap, bad inputs."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from pipeline.core.io import InputError, run_cli
from pipeline.significance import main
from pipeline.stats.paired_tests import (
    conditional_exact_pvalue,
    holm,
    key_comparisons,
    paired_bootstrap,
    paper_test,
    rank_sums,
    wilcoxon_rows,
)

# 30 (model, benchmark) differences grail - grpo: ranks 1..30, rank 5 and 6 tied (|d| = 0.005) and the one
# loss among them, so W+ = 465 - 5.5 = 459.5 and W- = 5.5 (spec E.3).
PAPER_DIFFERENCES = np.arange(1, 31) / 1000
PAPER_DIFFERENCES[4], PAPER_DIFFERENCES[5] = -0.005, 0.005
MODELS = [f"model{i}" for i in range(5)]
BENCHMARKS = ["math500", "aime24", "amc23", "minerva", "olympiad", "college"]


def paper_scores(path: Path, *, with_checkpoint: bool = True) -> Path:
    """scores.csv: 5 models x 6 benchmarks x 2 seeds; grail = grpo + the paper differences (seed means).

    Also rows that must be ignored: base/start, a step-50 checkpoint and the average benchmarks.
    """
    rows = []
    for (cell, (model, benchmark)), seed in itertools.product(enumerate(itertools.product(MODELS, BENCHMARKS)), (0, 1)):
        noise = 0.01 * (1 if seed == 0 else -1)
        grpo = 0.3 + 0.01 * cell + noise
        for method, value, checkpoint in [
            ("grpo", grpo, "final"),
            ("grail", grpo + PAPER_DIFFERENCES[cell], "final"),
            ("grail", 0.0, "step-50"),
            ("base", 0.9, "start"),
        ]:
            for metric, scale in (("acc@3", 1.0), ("pass@3", 1.2), ("pass@1", 1.0)):
                rows.append((model, method, seed, checkpoint, benchmark, metric, value * scale))
    for model, seed in itertools.product(MODELS, (0, 1)):
        rows.append((model, "grail", seed, "final", "average", "acc@3", 0.0))
        rows.append((model, "grpo", seed, "final", "weighted_average", "acc@3", 1.0))
    frame = pd.DataFrame(rows, columns=["model", "method", "seed", "checkpoint", "benchmark", "metric", "value"])
    if not with_checkpoint:
        frame = frame[frame["checkpoint"] == "final"].drop(columns="checkpoint")
    frame.to_csv(path, index=False)
    return path


def run_significance(tmp_path: Path, *extra: str, scores: Path | None = None) -> list[dict]:
    scores = scores or paper_scores(tmp_path / "scores.csv")
    out = tmp_path / "significance.json"
    main(["--scores", str(scores), "--out", str(out), "--markdown", str(tmp_path / "significance.md"), *extra])
    return json.loads(out.read_text())


def find(rows: list[dict], **wanted) -> dict:
    matches = [row for row in rows if all(row.get(k) == v for k, v in wanted.items())]
    assert len(matches) == 1, wanted
    return matches[0]


def test_reproduces_the_papers_one_sided_exact_wilcoxon(tmp_path: Path) -> None:
    rows = run_significance(tmp_path)
    common = {"method_a": "grail", "method_b": "grpo", "metric": "acc@3", "zero_method": "wilcox"}
    paper = find(rows, **common, test="wilcoxon_exact", alternative="greater")
    assert paper["n"] == 30 and paper["n_zero"] == 0
    assert paper["statistic"] == paper["w_plus"] == 459.5 and paper["w_minus"] == 5.5
    assert paper["p_value"] == pytest.approx(14 / 2**30, rel=1e-9)  # P(W- <= 6) under the untied null
    assert paper["rank_biserial"] == pytest.approx(454 / 465)
    two_sided = find(rows, **common, test="wilcoxon_exact", alternative="two-sided")
    assert two_sided["statistic"] == 459.5 and two_sided["scipy_statistic"] == 5.5
    assert two_sided["p_value"] == pytest.approx(28 / 2**30, rel=1e-9)
    approx = find(rows, **common, test="wilcoxon_approx", alternative="greater")
    assert approx["p_value"] == pytest.approx(1.512e-6, rel=1e-3)
    # Tie-aware exact p: 11 of the 2^30 sign patterns reach W+ >= 459.5 with ranks 5 and 6 tied at 5.5.
    conditional = find(rows, **common, test="wilcoxon_exact_conditional", alternative="greater")
    assert conditional["p_value"] == pytest.approx(11 / 2**30, rel=1e-9)
    reverse = find(
        rows, **{**common, "method_a": "grpo", "method_b": "grail"}, test="wilcoxon_exact", alternative="greater"
    )
    assert reverse["statistic"] == 5.5 and reverse["p_value"] > 0.99
    # Two-sided rows only once per unordered pair; Holm family (test, alternative, zero_method) over 2 metrics.
    assert not [r for r in rows if r["method_a"] == "grpo" and r["alternative"] == "two-sided"]
    family = [
        r for r in rows if (r["test"], r["alternative"], r["zero_method"]) == ("wilcoxon_exact", "greater", "wilcox")
    ]
    assert sorted({r["metric"] for r in family}) == ["acc@3", "pass@3"] and len(family) == 4
    markdown = (tmp_path / "significance.md").read_text()
    assert "| grail | grpo | exact | wilcox | greater | 30 | 459.5 | 5.5 | 0.976 | 1.3e-08 |" in markdown
    assert markdown.splitlines()[2].startswith("**The paper's test**")
    assert "over 30 (model, benchmark) pairs of seed means): W+ = 459.5, W- = 5.5, p = 1.3e-08." in markdown


def test_zsplit_with_one_zero_difference_also_gives_the_papers_numbers() -> None:
    d = np.arange(1, 31) / 1000
    d[0], d[4] = 0.0, -0.005  # zero at rank 1 (half to each side), one loss at rank 5
    assert rank_sums(d, "zsplit") == (459.5, 5.5)
    result = stats.wilcoxon(d, zero_method="zsplit", alternative="greater", method="exact")
    assert result.statistic == 459.5 and result.pvalue == pytest.approx(14 / 2**30, rel=1e-9)


def test_scores_without_a_checkpoint_column_are_accepted(tmp_path: Path) -> None:
    scores = paper_scores(tmp_path / "plain.csv", with_checkpoint=False)
    rows = run_significance(tmp_path, scores=scores)
    row = find(
        rows,
        method_a="grail",
        method_b="grpo",
        metric="acc@3",
        test="wilcoxon_exact",
        alternative="greater",
        zero_method="wilcox",
    )
    assert row["statistic"] == 459.5


def test_an_earlier_checkpoint_can_be_compared(tmp_path: Path) -> None:
    rows = run_significance(tmp_path, "--checkpoint", "step-50", "--metrics", "acc@3")
    # Only grail has step-50 scores: no pair of methods, nothing to test.
    assert rows == []


def brute_force_pvalue(d: np.ndarray, zero_method: str, alternative: str) -> float:
    """Enumerate every sign pattern of the nonzero differences and count W+ as or more extreme."""
    observed = rank_sums(d, zero_method)[0]
    nonzero = np.flatnonzero(d)
    values = []
    for signs in itertools.product((1, -1), repeat=len(nonzero)):
        flipped = d.copy()
        flipped[nonzero] = np.abs(d[nonzero]) * signs
        values.append(rank_sums(flipped, zero_method)[0])
    values = np.array(values)
    greater, less = np.mean(values >= observed - 1e-9), np.mean(values <= observed + 1e-9)
    return {"greater": greater, "less": less, "two-sided": min(1.0, 2 * min(greater, less))}[alternative]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(-4, 4), min_size=1, max_size=9),
    st.sampled_from(["wilcox", "zsplit"]),
    st.sampled_from(["greater", "less", "two-sided"]),
)
def test_conditional_exact_pvalue_equals_enumeration(values: list[int], zero_method: str, alternative: str) -> None:
    d = np.array(values, dtype=float) / 10  # small integers: many ties and zeros
    expected = brute_force_pvalue(d, zero_method, alternative)
    assert conditional_exact_pvalue(d, zero_method, alternative) == pytest.approx(expected, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-5, 5).filter(bool), min_size=2, max_size=20), st.sampled_from(["wilcox", "zsplit"]))
def test_rank_sums_match_scipy(values: list[int], zero_method: str) -> None:
    d = np.array(values, dtype=float)
    w_plus, w_minus = rank_sums(d, zero_method)
    assert w_plus == pytest.approx(
        stats.wilcoxon(d, zero_method=zero_method, alternative="greater", method="asymptotic").statistic
    )
    assert w_plus + w_minus == pytest.approx(len(d) * (len(d) + 1) / 2)


def scipy_rows(d: np.ndarray, zero_method: str, alternative: str) -> dict[str, tuple[float, float]]:
    """scipy's own (W+, p) for each of our tests: exact, asymptotic and, for the conditional exact test, scipy's
    exact permutation test (every sign pattern enumerated, ranks recomputed with the zero method each time)."""
    methods = {
        "wilcoxon_exact": "exact",
        "wilcoxon_approx": "asymptotic",
        "wilcoxon_exact_conditional": stats.PermutationMethod(n_resamples=np.inf),
    }
    results = {}
    for test, method in methods.items():
        greater = stats.wilcoxon(d, zero_method=zero_method, alternative="greater", method=method)
        result = stats.wilcoxon(d, zero_method=zero_method, alternative=alternative, method=method)
        results[test] = (float(greater.statistic), float(result.pvalue))  # "greater" reports W+
    return results


def assert_rows_match_scipy(d: np.ndarray, zero_method: str) -> None:
    for alternative in ("greater", "less", "two-sided"):
        expected = scipy_rows(d, zero_method, alternative)
        rows = wilcoxon_rows(d, zero_method, alternative)
        assert {row["test"] for row in rows} == set(expected)
        for row in rows:
            w_plus, p_value = expected[row["test"]]
            assert row["statistic"] == row["w_plus"] == pytest.approx(w_plus, abs=1e-9), row
            assert row["p_value"] == pytest.approx(p_value, rel=1e-9, abs=1e-15), row
            assert row["n_zero"] == int((d == 0).sum())


@pytest.mark.parametrize(
    ("zero_method", "w_plus", "w_minus"),
    [
        # wilcox: zeros dropped, |d| = 1 1 2 2 3 4 ranked 1.5 1.5 3.5 3.5 5 6; W+ = 1.5 + 3.5 + 3.5 + 6
        ("wilcox", 14.5, 6.5),
        # zsplit: |d| = 0 0 1 1 2 2 3 4 ranked 1.5 1.5 3.5 3.5 5.5 5.5 7 8; the zeros' 3 splits 1.5 / 1.5;
        # W+ = 3.5 + 5.5 + 5.5 + 8 + 1.5
        ("zsplit", 24.0, 12.0),
    ],
)
def test_zero_differences_and_ties_known_answer(zero_method: str, w_plus: float, w_minus: float) -> None:
    d = np.array([0.0, 0.0, 1.0, -1.0, 2.0, 2.0, -3.0, 4.0])
    assert rank_sums(d, zero_method) == (w_plus, w_minus)
    assert_rows_match_scipy(d, zero_method)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(-3, 3).filter(bool), min_size=1, max_size=7),
    st.integers(1, 3),
    st.randoms(use_true_random=False),
    st.sampled_from(["wilcox", "zsplit"]),
)
def test_zero_differences_and_ties_match_scipy(nonzero: list[int], zeros: int, shuffle, zero_method: str) -> None:
    """At least one zero difference and (|d| in 1..3) ties among the nonzero ones: W+ and the p-values of every
    test agree with scipy's ``wilcoxon(..., zero_method=...)``."""
    values = [*nonzero, *[0] * zeros]
    shuffle.shuffle(values)
    assert_rows_match_scipy(np.array(values, dtype=float) / 10, zero_method)


def test_conditional_exact_equals_scipy_exact_without_ties() -> None:
    d = np.array([0.3, -0.1, 0.7, 0.2, 0.9, -0.4, 0.5, 1.1])
    for alternative in ("greater", "less", "two-sided"):
        scipy_p = stats.wilcoxon(d, alternative=alternative, method="exact").pvalue
        assert conditional_exact_pvalue(d, "wilcox", alternative) == pytest.approx(scipy_p, rel=1e-12)


def test_holm_hand_case() -> None:
    # Sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 -> max(0.06, 0.04) = 0.06.
    assert holm([0.01, 0.04, None, 0.03, 0.005]) == pytest.approx([0.03, 0.06, None, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_bootstrap_interval_covers_the_true_difference_and_is_seeded() -> None:
    rng = np.random.default_rng(123)
    items = 400
    correct_a = rng.random(items) < 0.6
    correct_b = rng.random(items) < 0.4
    d = correct_a.astype(float) - correct_b.astype(float)
    low, high, p = paired_bootstrap(d, 10_000, 0.95, seed=7)
    assert low < 0.2 < high  # the population difference 0.6 - 0.4
    # The percentile interval agrees with the normal interval mean +- 1.96 sd / sqrt(m).
    half_width = 1.96 * d.std(ddof=1) / np.sqrt(items)
    assert low == pytest.approx(d.mean() - half_width, abs=0.01)
    assert high == pytest.approx(d.mean() + half_width, abs=0.01)
    assert p < 1e-3
    assert paired_bootstrap(d, 10_000, 0.95, seed=7) == (low, high, p)
    continuous = rng.normal(size=50)
    assert paired_bootstrap(continuous, 1_000, 0.9, seed=7) == paired_bootstrap(continuous, 1_000, 0.9, seed=7)
    assert paired_bootstrap(continuous, 1_000, 0.9, seed=7) != paired_bootstrap(continuous, 1_000, 0.9, seed=8)


def test_bootstrap_of_identical_methods_is_not_significant() -> None:
    d = np.array([1.0, -1.0, 0.0, 1.0, -1.0, 0.0])
    low, high, p = paired_bootstrap(d, 2_000, 0.95, seed=0)
    assert low < 0 < high and p > 0.5


def test_item_rows_from_samples_files(tmp_path: Path, write_samples) -> None:
    items = {f"q{i}": [True, True] for i in range(12)}
    wrong_half = {f"q{i}": [i < 6, False] for i in range(12)}
    samples = [
        write_samples("m", "grail", 0, "final", "math", items),
        write_samples("m", "grail", 1, "final", "math", items),
        write_samples("m", "grpo", 0, "final", "math", wrong_half),
        write_samples("m", "grpo", 1, "final", "math", wrong_half),
        write_samples("m", "base", 0, "start", "math", wrong_half),
        write_samples("m", "base", 0, "final", "math", items),  # not the baseline's checkpoint: ignored
    ]
    scores = paper_scores(tmp_path / "scores.csv")
    argv = ["--samples", *map(str, samples), "--resamples", "2000", "--seed", "3"]
    rows = run_significance(tmp_path, *argv, scores=scores)
    boot = find(rows, test="paired_bootstrap", method_a="grail", method_b="grpo")
    assert (boot["benchmark"], boot["model"]) == ("math", "m")
    assert boot["metric"] == "acc@2" and boot["n"] == 12 and boot["alternative"] == "two-sided"
    assert boot["statistic"] == pytest.approx(1 - 0.25)
    assert boot["ci_low"] <= 0.75 <= boot["ci_high"]
    # Against base, the method is method_a: grail - base = 0.75 on average; grpo - base = 0 on every item.
    assert find(rows, test="paired_bootstrap", method_a="grail", method_b="base")["statistic"] == pytest.approx(0.75)
    same = find(rows, test="wilcoxon_items", method_a="grpo", method_b="base")
    assert (same["n_zero"], same["p_value"], same["alternative"]) == (12, 1.0, "greater")
    # grail - base per item: 0.5 on q0..q5, 1.0 on q6..q11, all positive: one-sided exact p = 2^-12.
    better = find(rows, test="wilcoxon_items", method_a="grail", method_b="base")
    assert (better["w_plus"], better["w_minus"]) == (78, 0)
    assert better["p_value"] == pytest.approx(2.0**-12)
    pair = find(rows, test="wilcoxon_items", method_a="grail", method_b="grpo")
    assert pair["alternative"] == "two-sided" and pair["p_value"] == pytest.approx(2 * 2.0**-12)
    assert run_significance(tmp_path, *argv, scores=scores) == rows
    markdown = (tmp_path / "significance.md").read_text()
    assert markdown.index("The paper's test") < markdown.index("## Did RL help") < markdown.index("## Full grid")
    key_table = markdown[markdown.index("## Did RL help") : markdown.index("## Full grid")]
    assert "| m | math | grail vs base | acc@2 | 12 | +0.7500 |" in key_table
    assert "| m | math | grail vs grpo |" in key_table and "grpo vs base" in key_table
    assert "oar_g" not in key_table and "| 0.000244 (one-sided) |" in key_table


def test_key_comparisons_leave_out_pairs_that_do_not_answer_the_questions(tmp_path: Path, write_samples) -> None:
    items = {f"q{i}": [i % 2 == 0] for i in range(4)}
    samples = [write_samples("m", method, 0, "final", "b", items) for method in ("grail", "grpo", "oar_g")]
    rows = run_significance(tmp_path, "--samples", *map(str, samples), "--resamples", "50")
    entries = key_comparisons(rows)
    # no base samples: no base rows; oar_g held against the two references, named second
    assert [entry["comparison"] for entry in entries] == ["grail vs grpo", "oar_g vs grail", "oar_g vs grpo"]
    shown = next(e for e in entries if e["comparison"] == "oar_g vs grail")
    tested = find(rows, test="wilcoxon_items", method_a="grail", method_b="oar_g", metric=shown["metric"])
    interval = find(rows, test="paired_bootstrap", method_a="grail", method_b="oar_g", metric=shown["metric"])
    assert shown["difference"] == -tested["mean_difference"] and shown["p_wilcoxon"] == tested["p_value"]
    assert (shown["ci_low"], shown["ci_high"]) == (-interval["ci_high"], -interval["ci_low"])
    assert paper_test(rows) == find(
        rows,
        test="wilcoxon_exact",
        method_a="grail",
        method_b="grpo",
        metric="acc@3",
        zero_method="wilcox",
        alternative="greater",
    )


def test_different_item_sets_are_refused(tmp_path: Path, write_samples) -> None:
    samples = [
        write_samples("m", "grail", 0, "final", "math", {"q1": [True], "q2": [False]}),
        write_samples("m", "grpo", 0, "final", "math", {"q1": [True], "q3": [False]}),
    ]
    with pytest.raises(InputError, match="m/math: grail and grpo were scored on different items"):
        run_significance(tmp_path, "--samples", *map(str, samples))


def test_missing_column_is_named(tmp_path: Path, capsys) -> None:
    scores = paper_scores(tmp_path / "scores.csv")
    pd.read_csv(scores).drop(columns="metric").to_csv(scores, index=False)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, ["--scores", str(scores), "--out", str(tmp_path / "out.json")])
    assert exit_info.value.code == 2
    assert f"{scores}: missing column(s) 'metric'" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_samples_path_outside_the_layout_is_named(tmp_path: Path) -> None:
    stray = tmp_path / "math.jsonl"
    stray.write_text("")
    with pytest.raises(InputError, match=f"^{stray}: .*MODEL/METHOD/seedS/CHECKPOINT/BENCHMARK.jsonl"):
        run_significance(tmp_path, "--samples", str(stray))


def test_non_numeric_value_and_unknown_metric_are_refused(tmp_path: Path) -> None:
    scores = paper_scores(tmp_path / "scores.csv")
    with pytest.raises(InputError, match="no scores for metric\\(s\\) acc@7"):
        run_significance(tmp_path, "--metrics", "acc@7", scores=scores)
    lines = scores.read_text().splitlines()
    lines[4] = lines[4].rsplit(",", 1)[0] + ",high"
    scores.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match="line 5: column 'value' is not a number"):
        run_significance(tmp_path, scores=scores)
