"""Answers kept on disk between processes, for computations whose answer is a function of their key alone.

A study starts many short processes (a Snakemake start per plan, a stage per job), and each used to compute the
same things again: the installed distributions' map (``pipeline.core.distributions``), the syntax trees of the
code it digests (``pipeline.core.source_digest``). Each answer is one JSON file,
``cache_directory()/<kind>/<key>.json``, written whole or not at all (a temporary sibling renamed into place). A
file that does not parse or fails the caller's check is no answer: the caller computes it again and keeps it anew.
A cache that cannot be read or written (a read-only home in a container) only means computing, as without it. Not
``pipeline.core.io``'s atomic writes: a cache is no stage output, and a process whose controller is gone (for which
those refuse to publish) may still keep an answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

Answer = TypeVar("Answer")


def cache_directory() -> Path:
    """``$XDG_CACHE_HOME/grail-pipeline`` (default ``~/.cache/grail-pipeline``)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "grail-pipeline"


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _keep(path: Path, answer: Any, limit: int) -> None:
    """``answer`` written to ``path`` whole or not at all; then all but the ``limit`` newest answers of its kind
    dropped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(answer, out)
        os.replace(temporary, path)
        answers = sorted(path.parent.glob("*.json"), key=lambda kept: kept.stat().st_mtime_ns)
        for old in answers[:-limit]:
            old.unlink(missing_ok=True)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)


def kept_answer(kind: str, key: str, compute: Callable[[], Answer], valid: Callable[[Any], bool], limit: int) -> Answer:
    """The answer kept for ``key`` among ``kind``'s when there is one that ``valid`` accepts, else ``compute()``,
    kept (at most ``limit`` answers of a kind, the newest). ``compute`` must return what JSON gives back (dicts,
    lists, strings, numbers), so that a kept answer and a computed one are alike."""
    path = cache_directory() / kind / f"{key}.json"
    answer = _read(path)
    if answer is not None and valid(answer):
        return answer
    answer = compute()
    _keep(path, answer, limit)
    return answer
