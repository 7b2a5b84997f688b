"""A training run's resumable state: what made it (the run fingerprint), what is done with state made under other
settings, and the one writer allowed at a time (the run lock). docs/reruns.md "What a rerun keeps".

Fingerprint: the components that decide a run's trajectory, each recorded in every checkpoint
(``checkpoint-N/run_fingerprint.json``) and in the working directory (``checkpoints/run_fingerprint.json``):

    spec       the merged training and method specs (METHOD_SPEC wins), without the settings that only decide
               which checkpoints are kept or how long a collective waits (``NOT_TRAJECTORY``) and, for a schedule that does not depend on it
               (``continuable``), without ``max_steps``
    seed       the run's seed
    processes  the number of training processes (each samples its own share of a step's batch)
    data       file_digest of the training rows
    model      the start model by content (pipeline.core.file_digest.model_identity)
    code       the train rule's module digests (pipeline.core.source_digest: train, launch and the credit method's module)
    libraries  the library versions, only under ``library_changes: rerun``
    kernels    the CPU kernel path (``pipeline.core.kernels.kernel_path``): ``pinned AVX2``, or the native capability
               when the pin is off (an AVX-512 run's checkpoints do not resume on an AVX2 machine)
    engine     ``deepspeed``, only for a DeepSpeed run (its checkpoints shard the optimizer per rank)
    gpu_determinism  ``true``, only for a run with the study's ``gpu_determinism`` on (pipeline.core.gpu_determinism):
               its checkpoints are a deterministic trajectory, the others' are not
    fingerprint = SHA-256 of the canonical JSON of the components

A run resumes only from checkpoints whose fingerprint is its own. A working directory holding anything else is
moved aside whole, to ``RUN_DIR/set_aside/<UTC time>/`` with a ``why.json`` naming the components that differ
(or deleted, ``--stale-checkpoints delete``), and the run starts from scratch.

Lock: ``RUN_DIR/train.lock`` (host, pid, Slurm job id, start time) is created exclusively while the run trains. A
second writer is refused, naming the holder; a lock whose holder is gone is broken with a log line (the lock files
and when their holder counts as gone: pipeline.core.locks).
No third-party imports.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from pipeline.core.io import InputError
from pipeline.core.layout import EXPORTS_DIR, METRICS_FILE
from pipeline.core.locks import Holder, release_lock, take_lock

logger = logging.getLogger(__name__)

FINGERPRINT_FILE = "run_fingerprint.json"
SET_ASIDE_DIR = "set_aside"  # RUN_DIR/set_aside/<time>/: working directories made under other settings
WHY_FILE = "why.json"
LOCK_FILE = "train.lock"
StaleCheckpoints = Literal["set_aside", "delete"]
STALE_CHECKPOINT_ACTIONS: tuple[StaleCheckpoints, ...] = ("set_aside", "delete")
# Settings that choose which checkpoints are written and kept, or how long a collective may wait, not what is trained.
NOT_TRAJECTORY = frozenset({"save_steps", "save_total_limit"})
# Schedules whose learning rate at step t does not depend on max_steps (with a warm-up given in steps).
CONSTANT_SCHEDULES = frozenset({"constant", "constant_with_warmup"})


# ----------------------------------------------------------------------------------------------- fingerprint


def set_aside_dir(parent: Path) -> Path:
    """``parent/set_aside/<UTC time, to the microsecond>``: where one setting-aside puts what it keeps (a run's
    stale working files; a study's damaged outputs, pipeline.study.integrity)."""
    return parent / SET_ASIDE_DIR / datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S.%fZ")


def continuable(setting: Mapping[str, Any]) -> bool:
    """Whether steps 1..n of a run do not depend on ``max_steps``, from the trainer's effective ``setting`` of
    lr_scheduler_type, warmup_ratio, warmup_steps, save_steps and logging_steps: a constant schedule, a warm-up
    given in steps (not as a fraction of max_steps) and save/logging intervals given in steps. Then a larger
    max_steps continues a finished run; any other schedule (linear decay, the default, cosine) is another
    trajectory and starts over."""
    fractional = any(0 < float(setting.get(key) or 0) < 1 for key in ("save_steps", "logging_steps", "warmup_steps"))
    return (
        setting.get("lr_scheduler_type") in CONSTANT_SCHEDULES
        and not float(setting.get("warmup_ratio") or 0)
        and not fractional
    )


def fingerprint_components(
    spec: Mapping[str, Any],
    *,
    continues: bool,
    seed: int,
    processes: int,
    data_digest: str,
    model: Mapping[str, str],
    code: Mapping[str, str],
    libraries: Mapping[str, str] | None,
    kernel_path: str,
    deepspeed: bool = False,
    gpu_determinism: bool = False,
) -> dict[str, Any]:
    """The components of the module docstring (``continues``: leave ``max_steps`` out, see ``continuable``);
    ``engine`` only for a DeepSpeed run and ``gpu_determinism`` only when on, so that the fingerprints of the runs
    made before they existed stay valid."""
    left_out = NOT_TRAJECTORY | ({"max_steps"} if continues else set())
    components: dict[str, Any] = {
        "spec": {key: value for key, value in sorted(spec.items()) if key not in left_out},
        "seed": seed,
        "processes": processes,
        "data": data_digest,
        "model": dict(model),
        "code": dict(sorted(code.items())),
        "kernels": kernel_path,
    }
    if libraries is not None:
        components["libraries"] = dict(sorted(libraries.items()))
    if deepspeed:
        components["engine"] = "deepspeed"
    if gpu_determinism:
        components["gpu_determinism"] = True
    return components


def fingerprint_of(components: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the canonical JSON of ``components``."""
    return hashlib.sha256(json.dumps(components, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def fingerprint_record(components: Mapping[str, Any]) -> dict[str, Any]:
    """What ``FINGERPRINT_FILE`` holds: the fingerprint and its components (so a mismatch can be explained)."""
    return {"fingerprint": fingerprint_of(components), "components": dict(components)}


def read_fingerprint(directory: Path) -> dict[str, Any] | None:
    """The fingerprint record of a checkpoint or working directory; None when absent or unreadable."""
    try:
        record = json.loads((directory / FINGERPRINT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("fingerprint"), str) else None


def write_fingerprint(directory: Path, record: Mapping[str, Any]) -> None:
    (directory / FINGERPRINT_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def differences(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[str]:
    """What differs between two fingerprint records, for the log: component names, spec keys by name."""
    if old is None:
        return ["no fingerprint (made before runs recorded one, or by an interrupted start)"]
    before, after = old.get("components", {}), new["components"]
    found = []
    for name in sorted(before.keys() | after.keys()):
        if before.get(name) == after.get(name):
            continue
        if name == "spec" and isinstance(before.get(name), dict):
            keys = sorted(
                k for k in before[name].keys() | after[name].keys() if before[name].get(k) != after[name].get(k)
            )
            found.append(f"spec ({', '.join(keys)})")
        elif name == "code" and isinstance(before.get(name), dict):
            modules = sorted(
                m for m in before[name].keys() | after[name].keys() if before[name].get(m) != after[name].get(m)
            )
            found.append(f"code ({', '.join(modules)})")
        else:
            found.append(name)
    return found or ["fingerprint"]


# ----------------------------------------------------------------------------------------------- stale state


def foreign_state(
    working: Path, record: Mapping[str, Any], max_steps: int, published: list[Path]
) -> tuple[list[str], list[Path]] | None:
    """Why ``working`` (a run's checkpoints directory) cannot be resumed by the run of ``record``, and the
    checkpoints in it; None when it is empty or all of it is the run's own. Checkpoints past a positive
    ``max_steps`` count as foreign (a continuable run whose max_steps was lowered); so do ``published`` outputs
    that exist without any working state (they cannot be this run's)."""
    if not working.is_dir() or not any(working.iterdir()):
        leftover = [path.name for path in published if holds_something(path)]
        return ([f"published outputs without working state: {', '.join(leftover)}"], []) if leftover else None
    checkpoints = sorted(
        (path for path in working.iterdir() if path.is_dir() and path.name.startswith("checkpoint-")),
        key=lambda path: int(path.name.rpartition("-")[2]) if path.name.rpartition("-")[2].isdigit() else -1,
    )
    reasons: list[str] = []
    for directory in [working, *checkpoints]:
        found = read_fingerprint(directory)
        if found is None or found["fingerprint"] != record["fingerprint"]:
            reasons = differences(found, record)
            break
    past = [path.name for path in checkpoints if max_steps > 0 and path.name.rpartition("-")[2].isdigit()
            and int(path.name.rpartition("-")[2]) > max_steps]  # fmt: skip
    if not reasons and past:
        reasons = [f"checkpoints past max_steps {max_steps}: {', '.join(past)}"]
    return (reasons, checkpoints) if reasons else None


def holds_something(path: Path) -> bool:
    """A file, or a directory with anything in it (Snakemake makes the empty parents of a job's outputs)."""
    return path.is_file() or (path.is_dir() and any(path.iterdir()))


def prepare_working_dir(
    working: Path,
    record: Mapping[str, Any],
    max_steps: int,
    stale: StaleCheckpoints = "set_aside",
    published: list[Path] | None = None,
) -> Path | None:
    """Make ``working`` the run's own: state made under other settings (with the ``published`` outputs made from
    it) is moved to ``RUN_DIR/set_aside/<time>/`` (returned) or deleted, with a log line naming where and why;
    then the run's fingerprint is recorded there."""
    published = published or []
    found = foreign_state(working, record, max_steps, published)
    moved_to = None
    if found is not None:
        reasons, checkpoints = found
        names = ", ".join(path.name for path in checkpoints) or "no checkpoint"
        why = "; ".join(reasons)
        stale_paths = [path for path in [working, *published] if holds_something(path)]
        if stale == "delete":
            for path in stale_paths:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
            logger.warning(
                "deleted %s (%s) made under other settings (%s): training starts from scratch", working, names, why
            )
        else:
            moved_to = set_aside_dir(working.parent)
            moved_to.mkdir(parents=True)
            for path in stale_paths:
                os.replace(path, moved_to / path.name)
            why_record = {"reasons": reasons, "old": read_fingerprint(moved_to / working.name), "new": dict(record)}
            (moved_to / WHY_FILE).write_text(json.dumps(why_record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            logger.warning(
                "set aside %s (%s) made under other settings (%s) to %s: training starts from scratch",
                working,
                names,
                why,
                moved_to,
            )
    working.mkdir(parents=True, exist_ok=True)
    write_fingerprint(working, record)
    return moved_to


def checkpoint_step(path: Path) -> int | None:
    """N of a ``checkpoint-N`` or ``step-N`` directory; None for any other name."""
    number = path.name.rpartition("-")[2]
    return (
        int(number) if path.is_dir() and path.name.startswith(("checkpoint-", "step-")) and number.isdigit() else None
    )


def set_aside_after(
    working: Path, step: int, reasons: list[str], details: Mapping[str, Any], stale: StaleCheckpoints = "set_aside"
) -> tuple[list[str], Path | None]:
    """Move the checkpoints of ``working`` made after ``step``, and the working exports of those steps, out of the
    run's way (a rerun resumes from the newest one left): to ``RUN_DIR/set_aside/<time>/checkpoints/`` with a
    ``why.json`` (``reasons``, ``details``) and a copy of the working metrics as they were, or deleted under
    ``stale`` ``delete``. Returns the names of what was moved and where (None when deleted or nothing was there)."""
    exports = working / EXPORTS_DIR
    after = [
        path
        for directory in (working, exports)
        if directory.is_dir()
        for path in sorted(directory.iterdir())
        if (number := checkpoint_step(path)) is not None and number > step
    ]
    names = [str(path.relative_to(working)) for path in after]
    if not after:
        return names, None
    if stale == "delete":
        for path in after:
            shutil.rmtree(path)
        return names, None
    moved_to = set_aside_dir(working.parent)
    for path in after:
        destination = moved_to / working.name / path.relative_to(working)
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, destination)
    metrics = working / METRICS_FILE
    if metrics.is_file():
        shutil.copyfile(metrics, moved_to / working.name / metrics.name)
    why = {"reasons": reasons, **details}
    (moved_to / WHY_FILE).write_text(json.dumps(why, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return names, moved_to


# ----------------------------------------------------------------------------------------------- the run lock


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[Holder]:
    """Hold ``RUN_DIR/train.lock`` while the block runs; InputError naming the holder when another writer has it."""
    lock = run_dir / LOCK_FILE
    me = Holder.this_process()
    if (holder := take_lock(lock, me)) is not None:
        raise InputError(
            f"{lock}: another writer is training this run ({holder.describe()}); "
            "wait for it, or stop it, before starting this one"
        )
    try:
        yield me
    finally:
        release_lock(lock, me)
