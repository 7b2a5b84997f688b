"""Small I/O helpers shared by every stage: atomic outputs, durable JSONL, durable directory publishing, model
export, spec loading, CLI errors."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.disk_full import OutputSpaceError, is_out_of_space, output_space, unnamed_space_error
from pipeline.core.exit_codes import (
    INPUT_ERROR_EXIT_CODE,
    SAVE_FAILED_EXIT_CODE,
    record_final_exit,
    repeat_final_exit,
)
from pipeline.core.launch_dir import record_exit_status
from pipeline.core.locks import controller_problem
from pipeline.core.orphans import die_with_parent, refuse_orphan_publish
from pipeline.core.seal import DIRECTORY_SEAL, damage_message, seal_problem, write_seal

# Checkpoint content that is training state, not part of an exported model.
TRAINING_STATE_FILES = re.compile(
    r"^(optimizer\.pt|scheduler\.pt|scaler\.pt|rng_state.*\.pth|trainer_state\.json|training_args\.bin"
    r"|generation_buffer.*\.pt|credit_generator.*\.pt|latest|zero_to_fp32\.py|README\.md)$"
)


class InputError(ValueError):
    """Bad user input (config key, data row, file line): the message names what is wrong and where."""


def _temporary_sibling(path: Path) -> Path:
    """A fresh name next to ``path`` (same filesystem, so ``os.replace`` is atomic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    os.unlink(name)
    return Path(name)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary sibling of ``path``; on success rename it onto ``path``, on error delete it.

    Works for files and directories alike: whatever the caller creates at the yielded path replaces ``path``. A stage
    whose Snakemake job's wrapper or controller is gone renames nothing (``pipeline.core.orphans``).
    """
    target = Path(path)
    temporary = _temporary_sibling(target)
    try:
        yield temporary
        if not temporary.exists():
            raise FileNotFoundError(f"nothing was written to the temporary output for {target}")
        refuse_orphan_publish(target)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(temporary, target)
    finally:
        _remove(temporary)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically (fsync, then rename)."""
    with atomic_path(path) as temporary, open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def atomic_write_jsonl(path: str | os.PathLike[str], rows: Iterable[dict[str, Any]]) -> None:
    """Write one JSON object a line to ``path`` atomically."""
    atomic_write_text(path, "".join(json.dumps(row, default=_json_default) + "\n" for row in rows))


def publish_jsonl(path: str | os.PathLike[str], rows: Iterable[dict[str, Any]]) -> None:
    """Write a stage output that later stages read: atomically, then sealed (``pipeline.core.seal``)."""
    atomic_write_jsonl(path, rows)
    write_seal(Path(path))


def publish_text(path: str | os.PathLike[str], text: str) -> None:
    """``publish_jsonl`` for text that is already serialised (a copied JSONL log)."""
    atomic_write_text(path, text)
    write_seal(Path(path))


def jsonl_bytes(rows: Iterable[dict[str, Any]]) -> int:
    """The size of ``rows`` written as JSONL (what ``atomic_write_jsonl`` writes): the space they need."""
    return sum(len((json.dumps(row, default=_json_default) + "\n").encode()) for row in rows)


def atomic_save_figure(figure: Any, path: str | os.PathLike[str], dpi: int) -> None:
    """Write a matplotlib ``figure`` to ``path`` as PNG atomically; rendered first, so that a full disk is named
    with the figure's exact size (``pipeline.core.disk_full``)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    data = buffer.getvalue()
    with (
        output_space(Path(path), len(data), "the figure"),
        atomic_path(path) as temporary,
        open(temporary, "wb") as handle,
    ):
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def append_jsonl_durably(handle: Any, rows: Iterable[dict[str, Any]]) -> None:
    """Append rows to an open text handle and fsync, so that a killed process loses at most the line in flight."""
    for row in rows:
        handle.write(json.dumps(row, default=_json_default) + "\n")
    handle.flush()
    os.fsync(handle.fileno())


def append_jsonl_whole(path: str | os.PathLike[str], rows: Iterable[dict[str, Any]]) -> None:
    """Append ``rows`` to the JSONL file ``path`` durably (fsync), all of them or none: when the write fails (a full
    disk), the file is cut back to its length before the call and the error raised, so that it never keeps part of
    ``rows``. A kill mid-write can still leave part of them; a reader that must not trust part of them marks their
    end (the evaluation's batches: ``pipeline.evaluation.sampling``)."""
    data = memoryview("".join(json.dumps(row, default=_json_default) + "\n" for row in rows).encode())
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        start = os.fstat(descriptor).st_size
        try:
            written = 0
            while written < len(data):
                written += os.write(descriptor, data[written:])
            os.fsync(descriptor)
        except BaseException:
            os.ftruncate(descriptor, start)
            raise
    finally:
        os.close(descriptor)


def fsync_tree(root: Path) -> None:
    """fsync every file under ``root`` and the directories themselves, so a rename publishes durable content."""
    for directory, _, files in os.walk(root):
        for name in files:
            with open(Path(directory) / name, "rb") as handle:
                os.fsync(handle.fileno())
        fsync_directory(Path(directory))


def fsync_directory(directory: Path) -> None:
    """fsync a directory entry (makes renames inside it durable)."""
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def publish_directory(staging: Path, target: Path) -> None:
    """Seal the complete directory ``staging`` (``pipeline.core.seal``), make it durable and rename it onto
    ``target`` (replacing it); a stage whose Snakemake job's wrapper or controller is gone publishes nothing
    (``pipeline.core.orphans``)."""
    write_seal(staging)
    fsync_tree(staging)
    refuse_orphan_publish(target)
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)
    fsync_directory(target.parent)


def export_model(checkpoint: Path, destination: Path) -> None:
    """Publish the model and tokenizer files of a checkpoint (or of an export) as ``destination``, hardlinked where
    possible; a full disk is named with the size of those files (``pipeline.core.disk_full``)."""
    staging = destination.parent / f".{destination.name}.partial"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    files = [
        path
        for path in sorted(checkpoint.iterdir())
        # (the checkpoint's seal covers its training state: publish_directory seals the export anew)
        if path.is_file() and not TRAINING_STATE_FILES.match(path.name) and path.name != DIRECTORY_SEAL
    ]
    with output_space(destination, lambda: sum(path.stat().st_size for path in files), "the model's files"):
        for source in files:
            try:
                os.link(source, staging / source.name)
            except OSError:  # another filesystem, or no hardlinks there
                shutil.copy2(source, staging / source.name)
        publish_directory(staging, destination)


def jsonl_rows(
    path: str | os.PathLike[str], *, tolerate_torn_tail: bool = False
) -> Iterator[tuple[int, dict[str, Any] | str]]:
    """Stream a JSONL file line by line: ``(line number, row)`` per non-blank line, or ``(line number, problem)``
    (a string) for a line that is not a JSON object, so that a check can name every bad line at once.

    With ``tolerate_torn_tail`` a final line without its newline (a write cut by a kill) that does not parse ends
    the rows instead. A missing file, and a file that does not match its seal (``pipeline.core.seal``: cut, even at
    a line boundary, or changed), is an InputError naming it.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: file not found")
    if problem := seal_problem(path):
        raise InputError(damage_message(path, problem))
    with open(path, encoding="utf-8", newline="\n") as handle:  # lines end at "\n" only, as JSONL's
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                if tolerate_torn_tail and not line.endswith("\n"):
                    return
                yield number, f"not valid JSON ({error.msg})"
                continue
            yield number, row if isinstance(row, dict) else f"expected a JSON object, got {type(row).__name__}"


def read_jsonl(path: str | os.PathLike[str], *, tolerate_torn_tail: bool = False) -> list[dict[str, Any]]:
    """Read a JSONL file (``jsonl_rows``); a malformed line raises InputError naming the file and line number, and
    so does a damaged file.

    With ``tolerate_torn_tail`` a final line without its newline (a write cut by a kill) is dropped instead.
    """
    rows: list[dict[str, Any]] = []
    for number, row in jsonl_rows(path, tolerate_torn_tail=tolerate_torn_tail):
        if isinstance(row, str):
            raise InputError(f"{Path(path)}:{number}: {row}")
        rows.append(row)
    return rows


def load_spec(text: str) -> Any:
    """A structured CLI argument: inline JSON (starting with '{' or '[') or a path to a JSON/YAML file."""
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        try:
            return json.loads(stripped)
        except json.JSONDecodeError as error:
            raise InputError(f"inline JSON argument is not valid JSON: {error.msg}") from None
    path = Path(stripped)
    if not path.is_file():
        raise InputError(f"{path}: spec file not found")
    text = path.read_text(encoding="utf-8")
    # YAML 1.1 reads JSON's "3e-05" as a string, so JSON files are parsed as JSON.
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            raise InputError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from None
    try:
        return read_yaml(text)
    except yaml.YAMLError as error:
        raise InputError(f"{path}: not valid YAML ({error})") from None


# libyaml's scanner and parser where PyYAML was built with it (the safe constructors and resolver stay PyYAML's, so
# the values are the same): about 8x faster on configs/schema.yaml, which every Snakemake process reads.
SAFE_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(stream: Any) -> Any:
    """``yaml.safe_load`` of ``stream`` (text or an open file) with ``SAFE_YAML_LOADER``."""
    return yaml.load(stream, Loader=SAFE_YAML_LOADER)


def exit_status(code: object) -> int:
    """The process exit status of ``SystemExit(code)``: None is 0, an int itself, anything else (a message) 1."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def run_cli(main: Callable[[list[str] | None], None], argv: list[str] | None = None) -> None:
    """Run a stage's ``main``; an InputError becomes a one-line message on stderr and exit status 2, a full disk
    (``OutputSpaceError``, or any ``ENOSPC`` that reaches here: ``pipeline.core.disk_full``) one naming the path and
    the space, and exit status 73.

    The exit status is also recorded for a supervising ``pipeline.launch`` (``pipeline.runtime.preemption``), which passes
    it on where ``accelerate launch`` would report any failure as 1. A final status (``pipeline.core.exit_codes``) leaves
    a marker next to the job's log, and a retry of the job in the same Snakemake invocation repeats that status
    before ``main`` runs. In a Snakemake job the stage ends with its parent (``pipeline.core.orphans``), and refuses
    to run when the controller that started it no longer holds the study (``pipeline.core.locks``).
    """
    die_with_parent()
    spec = getattr(sys.modules["__main__"], "__spec__", None)  # python -m pipeline.<stage>: its module
    repeated = repeat_final_exit(spec.name if spec else "stage")
    if repeated is not None:
        record_exit_status(repeated)
        raise SystemExit(repeated)
    status = 1  # an uncaught exception
    try:
        if problem := controller_problem():
            raise InputError(problem)
        main(argv)
        status = 0
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        status = INPUT_ERROR_EXIT_CODE
        raise SystemExit(INPUT_ERROR_EXIT_CODE) from None
    except (OutputSpaceError, OSError) as error:
        if not isinstance(error, OutputSpaceError) and not is_out_of_space(error):
            raise
        message = error if isinstance(error, OutputSpaceError) else unnamed_space_error(error)
        print(f"error: {message}; free space there and run the stage again", file=sys.stderr)
        status = SAVE_FAILED_EXIT_CODE
        raise SystemExit(SAVE_FAILED_EXIT_CODE) from None
    except SystemExit as stop:
        status = exit_status(stop.code)
        raise
    finally:
        record_exit_status(status)
        record_final_exit(status)


def canonical_json(value: Any) -> str:
    """Deterministic JSON (sorted keys): what the rules pass as specs, so equal configs give equal params."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
