"""One evaluation job on several benchmarks (the Snakefile's default, ``evaluation.job_per: checkpoint``): one
backend start-up, each benchmark's samples equal to a job of its own, and after a kill or a changed input the rerun
gives back the finished benchmarks' samples as they were and resumes the unfinished one exactly.

Snakemake deletes every output of a job before it runs it again (after a failure too); the tests do the same."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pipeline.core.io import read_jsonl
from pipeline.core.seal import seal_problem
from pipeline.evaluation import eval_spec, sampling
from tests.evaluate.conftest import FAST_SPEC, benchmark_rows, write_jsonl
from tests.evaluate.test_evaluate_kill import kill_after_rows

REPO = Path(__file__).resolve().parents[2]
FIRST_ITEMS, SECOND_ITEMS = 5, 6  # x 2 samples, batches of 4: 10 rows (4, 4, 2), then 12 (4, 4, 4)


RERUN_KEY = "the digest of the rule's rerun params"  # what the Snakefile passes (pipeline.core.rerun_key)


def stage_command(
    model: Path, pairs: list[tuple[Path, Path]], spec: dict, rerun_key: str | None = RERUN_KEY
) -> list[str]:
    command = [sys.executable, "-m", "pipeline.evaluate", "--model", str(model), "--spec", json.dumps(spec)]
    for benchmark, out in pairs:
        command += ["--benchmark", str(benchmark), "--out", str(out)]
    return [*command, "--seed", "3", *(["--rerun-key", rerun_key] if rerun_key is not None else [])]


def delete_outputs(outs: list[Path]) -> None:
    """What Snakemake does to a job's outputs before it runs the job again."""
    for out in outs:
        out.unlink(missing_ok=True)
        sampling.samples_provenance(out).unlink(missing_ok=True)


def separate_jobs(model: Path, pairs: list[tuple[Path, Path]], tmp_path: Path) -> list[list[dict]]:
    spec = eval_spec.parse_eval_spec(FAST_SPEC)
    return [sampling.evaluate(str(model), bench, spec, 3, tmp_path / "alone" / out.name) for bench, out in pairs]


def test_one_job_on_two_benchmarks_starts_one_backend_and_equals_a_job_each(tiny_model_dir: Path, tmp_path: Path):
    first = write_jsonl(tmp_path / "first.jsonl", benchmark_rows(FIRST_ITEMS, seed=1))
    second = write_jsonl(tmp_path / "second.jsonl", benchmark_rows(SECOND_ITEMS, seed=2))
    pairs = [(first, tmp_path / "eval" / "first.jsonl"), (second, tmp_path / "eval" / "second.jsonl")]
    job = subprocess.run(stage_command(tiny_model_dir, pairs, FAST_SPEC), cwd=REPO, capture_output=True, text=True)
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.stderr.count("evaluate: starting the hf backend") == 1
    assert "evaluate: 2 benchmarks, 1 hf backend start-up(s)" in job.stderr
    assert [read_jsonl(out) for _, out in pairs] == separate_jobs(tiny_model_dir, pairs, tmp_path)
    for _, out in pairs:
        assert seal_problem(out) is None and sampling.samples_provenance(out).is_file()

    # rerun after Snakemake deleted the outputs, the second benchmark changed: the first is given back as it was
    # (no sample generated for it), the second is generated again
    before = pairs[0][1].read_bytes()
    delete_outputs([out for _, out in pairs])
    write_jsonl(second, benchmark_rows(SECOND_ITEMS - 1, seed=2))
    rerun = subprocess.run(stage_command(tiny_model_dir, pairs, FAST_SPEC), cwd=REPO, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "evaluate: first: the samples kept from an earlier run of this job" in rerun.stderr
    assert "evaluate: second: no partial results; 10 samples to generate" in rerun.stderr
    assert pairs[0][1].read_bytes() == before and seal_problem(pairs[0][1]) is None
    assert len(read_jsonl(pairs[1][1])) == 2 * (SECOND_ITEMS - 1)

    # another n_samples: the kept samples hold other rows; nothing is given back, one backend for both
    more = {**FAST_SPEC, "n_samples": 3}
    delete_outputs([out for _, out in pairs])
    third = subprocess.run(stage_command(tiny_model_dir, pairs, more), cwd=REPO, capture_output=True, text=True)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "kept from an earlier run" not in third.stderr and "1 hf backend start-up(s)" in third.stderr
    assert len(read_jsonl(pairs[0][1])) == 3 * FIRST_ITEMS


def test_kept_samples_are_given_back_only_under_the_rerun_key_they_were_kept_with(tiny_model_dir: Path, tmp_path: Path):
    """A rerun of the job whose rerun params changed (its code, libraries, kernel path or settings: another
    ``--rerun-key``) generates its samples again instead of giving back those of the earlier code; a stage run by
    hand (no key) keeps nothing and gives nothing back. (Checked by breaking it: with the key left out of the
    fingerprint, the second run gave back the first run's samples.)"""
    bench = write_jsonl(tmp_path / "bench.jsonl", benchmark_rows(FIRST_ITEMS, seed=1))
    pairs = [(bench, tmp_path / "eval" / "bench.jsonl")]
    runs = {}
    for name, key in [("first", "old code"), ("changed", "new code"), ("same", "new code"), ("by hand", None)]:
        delete_outputs([pairs[0][1]])
        job = subprocess.run(
            stage_command(tiny_model_dir, pairs, FAST_SPEC, key), cwd=REPO, capture_output=True, text=True
        )
        assert job.returncode == 0, job.stderr[-3000:]
        runs[name] = job.stderr
    assert "kept from an earlier run" not in runs["changed"]
    assert "no partial results; 10 samples to generate" in runs["changed"]
    assert "evaluate: bench: the samples kept from an earlier run of this job" in runs["same"]
    assert "kept from an earlier run" not in runs["by hand"]
    assert "no partial results; 10 samples to generate" in runs["by hand"]


def test_a_kill_in_the_second_benchmark_keeps_the_first_and_resumes_the_second_exactly(
    tiny_model_dir: Path, tmp_path: Path
):
    """Killed mid-batch in the second benchmark (the first finished and published); Snakemake deletes both outputs;
    the rerun gives the first back unchanged without a backend for it, and resumes the second from its partial file
    to the rows of an uninterrupted job. (Checked by breaking it: without ``restore_kept`` the first benchmark is
    generated again, and the log line is missing.)"""
    first = write_jsonl(tmp_path / "first.jsonl", benchmark_rows(FIRST_ITEMS, seed=1))
    second = write_jsonl(tmp_path / "second.jsonl", benchmark_rows(SECOND_ITEMS, seed=2))
    pairs = [(first, tmp_path / "eval" / "first.jsonl"), (second, tmp_path / "eval" / "second.jsonl")]
    command = stage_command(tiny_model_dir, pairs, FAST_SPEC)
    kill_after_rows(command, 2 * FIRST_ITEMS + 6, tmp_path / "killed.stderr")  # 4 + 2 rows of the second
    published = pairs[0][1].read_bytes()
    assert not pairs[1][1].exists()
    delete_outputs([out for _, out in pairs])

    resumed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "evaluate: first: the samples kept from an earlier run of this job" in resumed.stderr
    assert "second: resuming from" in resumed.stderr
    assert "4 of 12 samples done (2 rows of an unfinished batch dropped)" in resumed.stderr
    assert pairs[0][1].read_bytes() == published
    assert [read_jsonl(out) for _, out in pairs] == separate_jobs(tiny_model_dir, pairs, tmp_path)
    assert not sampling.partial_path(pairs[1][1]).exists()


def test_kept_samples_that_no_longer_match_their_seal_are_not_given_back(tiny_model_dir: Path, tmp_path: Path):
    """The kept file is a hard link of the published one: a damaged output (cut in place) damages it too, so the
    rerun must generate the benchmark again instead of publishing the cut rows."""
    bench = write_jsonl(tmp_path / "bench.jsonl", benchmark_rows(FIRST_ITEMS, seed=1))
    out = tmp_path / "eval" / "bench.jsonl"
    spec = eval_spec.parse_eval_spec(FAST_SPEC)
    rows = sampling.evaluate(str(tiny_model_dir), bench, spec, 3, out, rerun_key=RERUN_KEY)
    with open(out, "r+b") as handle:  # cut in place: the same inode as the kept link
        handle.truncate(out.stat().st_size // 2)
    key = sampling.kept_key(sampling.fingerprint(str(tiny_model_dir), bench, spec, 3, RERUN_KEY), spec, "hf")
    assert not sampling.restore_kept(out, key)
    out.unlink()
    assert sampling.evaluate(str(tiny_model_dir), bench, spec, 3, out, rerun_key=RERUN_KEY) == rows
    assert sampling.restore_kept(out, key)  # the new samples are kept in turn
