"""Seals: the completeness record a stage writes beside each output that a later stage reads, so that a damaged or
incomplete output is found (by its readers, and when the study is planned) instead of being used.

A file ``F`` is sealed by ``F.seal.json``; a directory ``D`` (a model) by ``D/seal.json``, covering every other
file under ``D``. A seal records, per file, its size in bytes and, for a file of at most ``HASH_LIMIT`` bytes,
its SHA-256 and line count (the rows of a JSONL file):

    {"format": "grail-seal/1", "files": {"<relative path>": {"bytes": B, "lines": L, "sha256": H}}}

(a file's seal has the one entry ``"."``). An output whose seal exists and does not match (a file cut at a line
boundary or mid-line, a missing shard, an overwritten row) is damaged; an output without a seal (written before
seals, or by hand) is unsealed and taken as it is. Files above ``HASH_LIMIT`` (weight shards, optimizer states) are
checked by size only: a cut or an incomplete copy changes the size, a same-size corruption does not, and hashing
gigabytes at every plan would cost minutes (Snakemake's own input checksums stop at 1 MB, for the same reason).

The writer seals a file after its atomic rename and a directory before its publishing rename; either way a crash in
between leaves an output that is missing, unsealed, or damaged against a stale seal, never one sealed as whole.
No third-party imports: the Snakefile imports this module.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

SEAL_FORMAT = "grail-seal/1"
FILE_SEAL_SUFFIX = ".seal.json"
DIRECTORY_SEAL = "seal.json"
HASH_LIMIT = 64 * 2**20
_CHUNK = 2**20


def file_seal_path(path: Path) -> Path:
    """Where the seal of file ``path`` lives: ``path`` + ``.seal.json``."""
    return path.with_name(path.name + FILE_SEAL_SUFFIX)


def seal_path(output: Path) -> Path:
    """The seal of an output: ``D/seal.json`` for a directory, ``F.seal.json`` for a file."""
    return output / DIRECTORY_SEAL if output.is_dir() else file_seal_path(output)


def file_record(path: Path) -> dict[str, Any]:
    """``{"bytes"[, "lines", "sha256"]}`` of one file: its size and, when it is at most ``HASH_LIMIT`` bytes, its
    count of newline bytes and its SHA-256 (a larger file is not read: its size is its record)."""
    size = path.stat().st_size
    if size > HASH_LIMIT:
        return {"bytes": size}
    lines = 0
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            lines += chunk.count(b"\n")
            digest.update(chunk)
    return {"bytes": size, "lines": lines, "sha256": digest.hexdigest()}


def directory_files(directory: Path) -> list[Path]:
    """Every file under ``directory`` but its seal, as relative paths, sorted."""
    return sorted(
        path.relative_to(directory)
        for path in directory.rglob("*")
        if path.is_file() and path.relative_to(directory) != Path(DIRECTORY_SEAL)
    )


def seal_record(output: Path) -> dict[str, Any]:
    """The seal of ``output`` as it is now (a file, or every file under a directory)."""
    if output.is_dir():
        files = {str(name): file_record(output / name) for name in directory_files(output)}
    else:
        files = {".": file_record(output)}
    return {"format": SEAL_FORMAT, "files": files}


def write_seal(output: Path) -> None:
    """Seal ``output`` (a complete file or directory), durably and atomically."""
    target = seal_path(output)
    record = seal_record(output)  # before the temporary file exists: a directory's seal must not list it
    temporary = target.with_name(f".{target.name}.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=1, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, target)


def _size(record: dict[str, Any]) -> str:
    """``N lines, B bytes`` (or ``B bytes`` for a file sealed by size)."""
    lines = f"{record['lines']} lines, " if "lines" in record else ""
    return f"{lines}{record['bytes']} bytes"


def _difference(name: str, sealed: dict[str, Any], actual: dict[str, Any]) -> str | None:
    """What differs between a file's sealed record and its record now, for a message; None when they match."""
    label = "" if name == "." else f"{name}: "
    if actual["bytes"] != sealed["bytes"] or actual.get("lines") != sealed.get("lines"):
        return f"{label}{_size(actual)}, but sealed with {_size(sealed)}"
    if actual.get("sha256") != sealed.get("sha256"):
        return f"{label}same size, but its SHA-256 differs from the sealed one"
    return None


def seal_problem(output: Path) -> str | None:
    """Why ``output`` does not match its seal (files missing, cut, changed); None when it matches or is unsealed.

    Only the sizes and line counts are compared before a hash is computed, so a cut file costs one ``stat`` and one
    read at most."""
    seal = seal_path(output)
    if not seal.is_file():
        return None
    try:
        sealed = json.loads(seal.read_text(encoding="utf-8"))
        entries = sealed["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"its seal {seal} is unreadable"
    problems = []
    for name, record in sorted(entries.items()):
        path = output if name == "." else output / name
        if not path.is_file():
            problems.append(f"{name}: missing" if name != "." else "missing")
            continue
        difference = _difference(name, record, file_record(path))
        if difference:
            problems.append(difference)
    return "; ".join(problems) or None


def damage_message(output: Path, problem: str) -> str:
    """The one line that names a damaged output, what is wrong, and what repairs it."""
    return (
        f"{output}: damaged: {problem} (seal {seal_path(output)}); a plain `snakemake` run writes it again, with"
        " everything that read it"
    )
