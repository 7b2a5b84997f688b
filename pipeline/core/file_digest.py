"""What a file or a model directory holds, by content: the identity that resumable state is checked against.

    file_digest(f)      = SHA-256 of the bytes of f (hex)
    directory_digest(d) = SHA-256 over (relative path, file_digest) of every file under d, sorted by path

Names, sizes and modification times are not enough: a model retrained with other settings has the same names and
sizes, and a copy or an rsync keeps the old times. Reading every byte costs about a second per GB; the stages that
use it read the model anyway. No third-party imports.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK_BYTES = 1 << 20


def file_digest(path: Path) -> str:
    """SHA-256 (hex) of the file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def directory_digest(directory: Path) -> str:
    """SHA-256 (hex) over every file under ``directory``: its path relative to it and its content digest."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(directory).as_posix()}\0{file_digest(path)}\n".encode())
    return digest.hexdigest()


def model_identity(model: str, revision: str | None = None) -> dict[str, str]:
    """A model by content: a local directory's ``directory_digest``; a hub id with its revision as given (the hub
    serves one revision's files, a branch's may move: pin a commit to make it an identity)."""
    path = Path(model)
    if path.is_dir():
        return {"content": directory_digest(path)}
    return {"hub_id": model, "revision": revision or "default"}
