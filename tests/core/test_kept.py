"""Answers kept on disk between processes (pipeline/core/kept.py), and the code digests' use of them
(pipeline/core/source_digest.py): a kept answer is read instead of computed, a bad one is computed again, a cache
that cannot be written is no error, and a digest kept for one source text is never given for another."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core import kept, source_digest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The kept answers of this test under ``tmp_path``; the code digests' in-process cache forgotten before and
    after."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    source_digest._source_facts.cache_clear()
    yield tmp_path / "cache" / "grail-pipeline"
    source_digest._source_facts.cache_clear()


def counted(answer: object, calls: list[int]):
    def compute() -> object:
        calls.append(1)
        return answer

    return compute


def test_an_answer_is_computed_once_per_key_and_read_after(cache: Path) -> None:
    calls: list[int] = []
    for _ in range(3):
        assert kept.kept_answer("demo", "a", counted({"x": [1]}, calls), lambda answer: True, limit=8) == {"x": [1]}
    assert len(calls) == 1
    assert kept.kept_answer("demo", "b", counted({"x": [2]}, calls), lambda answer: True, limit=8) == {"x": [2]}
    assert len(calls) == 2
    assert json.loads((cache / "demo" / "a.json").read_text()) == {"x": [1]}


def test_a_kept_answer_that_does_not_parse_or_fails_the_check_is_computed_again(cache: Path) -> None:
    calls: list[int] = []
    (cache / "demo").mkdir(parents=True)
    (cache / "demo" / "a.json").write_text('{"x": [1')
    assert kept.kept_answer("demo", "a", counted({"x": [1]}, calls), lambda answer: True, limit=8) == {"x": [1]}
    (cache / "demo" / "a.json").write_text('{"x": "not a list"}')
    check = lambda answer: isinstance(answer.get("x"), list)  # noqa: E731
    assert kept.kept_answer("demo", "a", counted({"x": [1]}, calls), check, limit=8) == {"x": [1]}
    assert len(calls) == 2
    assert json.loads((cache / "demo" / "a.json").read_text()) == {"x": [1]}


def test_only_the_newest_answers_of_a_kind_are_kept(cache: Path) -> None:
    for number in range(5):
        kept.kept_answer("demo", f"k{number}", lambda number=number: number, lambda answer: True, limit=3)
        os.utime(cache / "demo" / f"k{number}.json", ns=(number * 10**9, number * 10**9))
    assert sorted(path.name for path in (cache / "demo").iterdir()) == ["k2.json", "k3.json", "k4.json"]


def test_a_cache_that_cannot_be_written_means_computing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    calls: list[int] = []
    for _ in range(2):
        assert kept.kept_answer("demo", "a", counted([1], calls), lambda answer: True, limit=8) == [1]
    assert len(calls) == 2


def test_the_next_process_reads_the_kept_digests_without_parsing(tmp_path: Path) -> None:
    """A second process (a later Snakemake start, a training run) gets the same digests, and parses nothing."""
    script = (
        "import json, os, pipeline.core.source_digest as d\n"
        "if os.environ.get('PARSE_REFUSED'):\n"
        "    def refused(source): raise AssertionError('parsed although the digest was kept')\n"
        "    d._facts = refused\n"
        "print(d.source_digest('pipeline.train'))\n"
    )
    environment = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    answers = []
    for refused in ("", "1"):
        result = subprocess.run(
            [sys.executable, "-c", script],
            env={**environment, "PARSE_REFUSED": refused},
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        answers.append(result.stdout)
    assert answers[0] == answers[1]


def test_a_kept_digest_is_never_given_for_another_source_or_another_digest_code(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keyed by the source text and by the digest's own code: an edit of either is parsed again."""
    source = "import math\n\nRATE = 1\n"
    kept_digest = source_digest._source_facts(source)["digest"]
    edited = source_digest._source_facts(source.replace("1", "2"))
    assert edited["digest"] != kept_digest
    assert edited["digest"] == source_digest._facts(source.replace("1", "2"))["digest"]

    source_digest._source_facts.cache_clear()
    parsed: list[str] = []
    real_facts = source_digest._facts
    monkeypatch.setattr(source_digest, "_facts", lambda text: parsed.append(text) or real_facts(text))
    assert source_digest._source_facts(source)["digest"] == kept_digest
    assert parsed == []  # read from the disk
    source_digest._source_facts.cache_clear()
    monkeypatch.setattr(source_digest, "_own_source_key", lambda: "the digest's code, edited")
    assert source_digest._source_facts(source)["digest"] == kept_digest
    assert parsed == [source]  # parsed again under the edited code
