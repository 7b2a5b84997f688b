"""prepare_data: DeepMath format through datasets, generated and JSONL sources, answer policy, decontamination."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.io import InputError
from pipeline.prepare_data import prepare_data, word_ngrams
from pipeline.tasks.prompts import PROMPT_SUFFIX_CLEAN, PROMPT_SUFFIX_UPSTREAM

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[2]
PLAIN = str(FIXTURES / "train_plain.jsonl")


def deepmath_spec(tmp_path: Path, **deepmath: object) -> dict:
    """DATA_SPEC reading the DeepMath-format fixture directory through datasets.load_dataset."""
    settings = {"hub_id": str(FIXTURES / "hub" / "deepmath"), "cache_dir": str(tmp_path / "hf"), **deepmath}
    return {"source": "deepmath", "deepmath": settings}


def write_benchmark(path: Path, problems: list[str]) -> str:
    rows = [{"id": str(i), "problem": p, "answer": "1", "source": "t"} for i, p in enumerate(problems)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_deepmath_rows_prompt_and_skips(tmp_path: Path) -> None:
    rows, card = prepare_data(deepmath_spec(tmp_path), [])
    assert {row["id"] for row in rows} == {"deepmath-0", "deepmath-1", "deepmath-2", "deepmath-3"}
    first = next(row for row in rows if row["id"] == "deepmath-1")
    assert first == {
        "id": "deepmath-1",
        "prompt": [{"role": "user", "content": "Find the smallest prime greater than 10." + PROMPT_SUFFIX_CLEAN}],
        "solution": "11",
        "source": "deepmath",
    }
    assert card["rows_read"] == 7 and card["rows_written"] == 4
    assert card["skipped"]["by_reason"] == {
        "missing field 'solution'": 1,
        "empty answer": 1,
        "prompt is not a non-empty list of messages": 1,
    }
    assert (card["hub_id"], card["split"], card["revision"], card["shuffle_seed"]) == (
        str(FIXTURES / "hub" / "deepmath"),
        "train",
        "main",
        42,
    )


def test_upstream_template_reproduces_the_backspace(tmp_path: Path) -> None:
    rows, card = prepare_data(deepmath_spec(tmp_path) | {"prompt_template": "upstream"}, [])
    content = rows[0]["prompt"][0]["content"]
    assert content.endswith(PROMPT_SUFFIX_UPSTREAM) and "\x08oxed{}" in content and "\\boxed" not in content
    assert card["prompt_template"] == "upstream"


def test_shuffle_seed_and_max_rows_are_deterministic(tmp_path: Path) -> None:
    first, card = prepare_data(deepmath_spec(tmp_path, max_rows=2, shuffle_seed=3), [])
    again, _ = prepare_data(deepmath_spec(tmp_path, max_rows=2, shuffle_seed=3), [])
    assert first == again and len(first) == 2 and card["max_rows"] == 2
    all_rows, _ = prepare_data(deepmath_spec(tmp_path, shuffle_seed=3), [])
    assert [row["id"] for row in all_rows[:2]] == [row["id"] for row in first]


def test_jsonl_answer_policy_converts_numbers_and_skips_the_rest() -> None:
    rows, card = prepare_data({"source": "jsonl", "jsonl": {"path": PLAIN}}, [])
    assert {row["id"]: row["solution"] for row in rows} == {"p1": "4", "p2": "9", "p3": "2.5", "p11": "2"}
    assert card["skipped"]["count"] == 7
    assert card["skipped"]["by_reason"] == {
        "non-string answer (bool)": 1,
        "non-string answer (list)": 1,
        "missing field 'answer'": 1,
        "empty problem": 1,
        "missing field 'problem'": 1,
        "non-string problem (int)": 1,
        "empty answer": 1,
    }
    assert "converted" in card["answer_policy"] and card["rows_read"] == 11


def test_generated_source_is_arith_with_the_prompt() -> None:
    rows, card = prepare_data({"generated": {"count": 3, "seed": 2, "operations": ["*"]}}, [])
    assert [row["id"] for row in rows] == ["train-2-0", "train-2-1", "train-2-2"]
    for row in rows:
        content = row["prompt"][0]["content"]
        assert content.endswith(PROMPT_SUFFIX_CLEAN)
        a, b = content.removesuffix(PROMPT_SUFFIX_CLEAN).removesuffix("=?").split("*")
        assert row["solution"] == str(int(a) * int(b))
    assert card["source"] == "generated" and list(card["generated"]["operations"]) == ["*"]


def test_decontamination_drops_the_planted_overlap(tmp_path: Path) -> None:
    # The 13-gram "evaluate the limit \[ \lim_{x \to 0} \frac{\sin x}{x} ..." of DeepMath row 0 is planted.
    planted = "Please evaluate the limit \\[ \\lim_{x \\to 0} \\frac{\\sin x}{x}. \\] and explain"
    bench = write_benchmark(tmp_path / "mybench.jsonl", ["Something unrelated entirely.", planted])
    other = write_benchmark(tmp_path / "other.jsonl", ["Compute $2^{10}$."])  # shorter than n: compared whole
    rows, card = prepare_data(deepmath_spec(tmp_path), [bench, other])
    assert {row["id"] for row in rows} == {"deepmath-1", "deepmath-3"}
    decontamination = card["decontamination"]
    assert decontamination["dropped"] == [
        {"id": "deepmath-0", "benchmarks": ["mybench"]},
        {"id": "deepmath-2", "benchmarks": ["other"]},
    ]
    assert decontamination["dropped_by_benchmark"] == {"mybench": 1, "other": 1}
    assert (decontamination["enabled"], decontamination["ngram"], decontamination["dropped_count"]) == (True, 13, 2)


def test_decontamination_ngram_size_matters(tmp_path: Path) -> None:
    bench = write_benchmark(tmp_path / "b.jsonl", ["the smallest prime greater than ten thousand and one"])
    kept, _ = prepare_data(deepmath_spec(tmp_path), [bench])
    assert "deepmath-1" in {row["id"] for row in kept}  # no shared 13-gram
    dropped, card = prepare_data(deepmath_spec(tmp_path) | {"decontaminate": {"ngram": 4}}, [bench])
    assert "deepmath-1" not in {row["id"] for row in dropped}  # "smallest prime greater than" shared
    assert card["decontamination"]["ngram"] == 4


def test_word_ngrams_known_answer() -> None:
    assert word_ngrams("A b, c", 2) == {("a", "b"), ("b", ","), (",", "c")}
    assert word_ngrams("3+4=?", 13) == {("3", "+", "4", "=", "?")}
    assert word_ngrams("3+4=?", 13) != word_ngrams("3*4=?", 13)
    assert word_ngrams("   ", 3) == set()


@given(st.lists(st.sampled_from(["x", "2", "limit", "+", "="]), min_size=1, max_size=30), st.integers(1, 6))
def test_a_problem_embedded_in_a_longer_text_shares_an_ngram(tokens: list[str], n: int) -> None:
    problem = " ".join(tokens)
    grams = word_ngrams(problem, n)
    assert all(len(gram) == min(n, len(tokens)) for gram in grams)
    if len(tokens) >= n:  # what decontamination relies on: a copied problem inside a training text is caught
        assert grams and grams <= word_ngrams(f"we first note that {problem} and then stop", n)


def test_card_length_stats(tmp_path: Path) -> None:
    rows, card = prepare_data(deepmath_spec(tmp_path), [])
    prompt_lengths = sorted(len(row["prompt"][0]["content"]) for row in rows)
    assert card["lengths_chars"]["prompt"]["min"] == prompt_lengths[0]
    assert card["lengths_chars"]["prompt"]["max"] == prompt_lengths[-1]
    assert card["lengths_chars"]["solution"] == {
        "min": 1,
        "mean": 2.0,
        "median": 1.5,
        "max": 4,
    }  # "1", "11", "1024", "3"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"source": "hf"}, r"data\.source: expected 'generated' \| 'deepmath' \| .* got str 'hf'"),
        ({"sources": "deepmath"}, r"data: unknown key\(s\) \['sources'\]"),
        ({"prompt_template": "fancy"}, r"data\.prompt_template"),
        ({"source": "deepmath", "deepmath": {"max_row": 3}}, r"data\.deepmath: unknown key\(s\) \['max_row'\]"),
        ({"source": "deepmath", "deepmath": {"revision": 3}}, r"data\.deepmath\.revision: expected str"),
        ({"source": "jsonl", "jsonl": {}}, r"data\.jsonl: missing required key\(s\) \['path'\]"),
        ({"source": "jsonl", "jsonl": {"path": PLAIN, "max_rows": -2}}, r"data\.jsonl\.max_rows"),
        ({"decontaminate": {"enabled": True}}, r"decontaminate\.enabled is true but no"),
        ({"decontaminate": {"ngram": 0}}, r"data\.decontaminate\.ngram"),
        ({"generated": {"count": 0}}, r"data\.generated\.count: invalid value 0 \(must be >= 1\)"),
        ({"generated": {"low": 5, "high": 2}}, r"data\.generated: low 5 is above high 2"),
        ({"generated": {"count": 2, "colour": 1}}, r"data\.generated: unknown key\(s\) \['colour'\]"),
    ],
)
def test_bad_specs_name_the_key(spec: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        prepare_data(spec, [])


def test_corrupt_training_file_names_the_line() -> None:
    corrupt = str(FIXTURES / "qwen" / "corrupt.jsonl")
    with pytest.raises(InputError, match=r"corrupt\.jsonl:2: not valid JSON"):
        prepare_data({"source": "jsonl", "jsonl": {"path": corrupt}}, [])
    with pytest.raises(InputError, match=r"corrupt\.jsonl:2: not valid JSON"):
        prepare_data({}, [corrupt])


def run_stage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.prepare_data", *args], cwd=REPO, capture_output=True, text=True
    )


def test_cli_writes_rows_and_card(tmp_path: Path) -> None:
    out, card = tmp_path / "data" / "train.jsonl", tmp_path / "data" / "card.json"
    spec = json.dumps({"source": "jsonl", "jsonl": {"path": PLAIN}})
    result = run_stage("--spec", spec, "--out", str(out), "--card", str(card))
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4 and all(set(row) == {"id", "prompt", "solution", "source"} for row in rows)
    assert json.loads(card.read_text())["rows_written"] == 4


def test_cli_bad_spec_exits_2(tmp_path: Path) -> None:
    out = tmp_path / "train.jsonl"
    result = run_stage("--spec", '{"source": "hf"}', "--out", str(out), "--card", str(tmp_path / "c.json"))
    assert result.returncode == 2 and "data.source" in result.stderr and not out.exists()


# --- upstream's training order ------------------------------------------------------------------------------------


def write_deepmath_shaped(directory: Path, n: int) -> Path:
    """A DeepMath-103K-shaped split (conversational ``prompt`` + ``solution``) of n distinct rows."""
    directory.mkdir(parents=True)
    rows = [{"prompt": [{"role": "user", "content": f"Compute {i} + {i}."}], "solution": str(2 * i)} for i in range(n)]
    (directory / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return directory


def test_paper_config_trains_on_upstreams_first_1600_prompts(tmp_path: Path) -> None:
    """The paper config's training table is the split in the order of datasets' own Dataset.shuffle(seed=42)."""
    import datasets
    import yaml

    hub = write_deepmath_shaped(tmp_path / "deepmath", 2000)
    data_spec = yaml.safe_load((REPO / "configs" / "paper.yaml").read_text())["data"]
    data_spec["deepmath"] |= {"hub_id": str(hub), "cache_dir": str(tmp_path / "hf")}
    rows, card = prepare_data(data_spec, [])

    split = datasets.load_dataset(str(hub), split="train", cache_dir=str(tmp_path / "hf2"))
    upstream = datasets.concatenate_datasets([split]).shuffle(seed=42)
    expected = [row["prompt"][0]["content"] + PROMPT_SUFFIX_UPSTREAM for row in upstream]
    ours = [row["prompt"][0]["content"] for row in rows]
    assert ours[:1600] == expected[:1600]
    assert ours == expected and [row["solution"] for row in rows] == upstream["solution"]
    assert card["shuffle"] == "datasets"


def test_python_random_order_is_not_upstreams(tmp_path: Path) -> None:
    hub = write_deepmath_shaped(tmp_path / "deepmath", 200)
    rows, _ = prepare_data({"source": "deepmath", "deepmath": {"hub_id": str(hub), "cache_dir": str(tmp_path)}}, [])
    datasets_order, _ = prepare_data(
        {"source": "deepmath", "deepmath": {"hub_id": str(hub), "cache_dir": str(tmp_path), "shuffle": "datasets"}}, []
    )
    assert [row["id"] for row in rows] != [row["id"] for row in datasets_order]
    assert sorted(row["id"] for row in rows) == sorted(row["id"] for row in datasets_order)


def test_datasets_order_refuses_rows_that_would_shift_positions(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"data.deepmath.shuffle: .* 3 row\(s\) cannot be used \(first: row"):
        prepare_data(deepmath_spec(tmp_path, shuffle="datasets"), [])
    hub = write_deepmath_shaped(tmp_path / "deepmath", 10)
    spec = {"source": "deepmath", "deepmath": {"hub_id": str(hub), "cache_dir": str(tmp_path), "shuffle": "datasets"}}
    benchmark = write_benchmark(tmp_path / "bench.jsonl", ["Compute 1 + 1."])
    with pytest.raises(InputError, match=r"decontaminate\.enabled would drop rows"):
        prepare_data(spec | {"decontaminate": {"enabled": True}}, [benchmark])
