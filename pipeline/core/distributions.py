"""One scan of the installed distributions per environment, not per process.

transformers and TRL each call ``importlib.metadata.packages_distributions()`` when they are imported (the
module-level ``PACKAGE_DISTRIBUTION_MAPPING`` of ``transformers.utils.import_utils`` and of ``trl.import_utils``),
which reads the file list of every installed distribution: 0.9-1.3 s of CPU on CI's 2-core machine with this
project's environment, and every stage that imports either pays it (the test suite starts hundreds of such
processes). Nothing installs packages into a running stage, so the second call of a process reuses the first one's
answer; each caller still gets its own copy to keep.

Across processes the answer is kept on disk, in ``cache_directory()`` as ``packages-<key>.json``. The key is the
Python version and, for every ``sys.path`` entry holding distribution metadata, that entry with the name and
modification time of each metadata directory (``*.dist-info``, ``*.egg-info``, ``*.egg``). Installing, upgrading or
removing a distribution creates or removes such a directory (pip writes a new one and removes the old), so the key
changes and a kept answer is never that of another set of installed packages; an entry without metadata (a stage's
working directory on ``sys.path``) leaves the key alone. Computing the key lists the directories on ``sys.path``
(a few milliseconds). The standard library offers no such cache, hence this module. A cache that cannot be read or
written (a read-only home in a container) only means scanning, as the standard library does.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

_ORIGINAL: Callable[[], dict[str, list[str]]] = importlib.metadata.packages_distributions
METADATA_SUFFIXES = (".dist-info", ".egg-info", ".egg")
KEPT_ANSWERS = 16  # answers kept on disk (one per environment and set of installed packages), the newest


def cache_directory() -> Path:
    """``$XDG_CACHE_HOME/grail-pipeline`` (default ``~/.cache/grail-pipeline``)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "grail-pipeline"


def installed_key(path: list[str]) -> str:
    """The Python version and the distribution metadata directories on ``path`` (module docstring), hashed."""
    digest = hashlib.sha256(sys.version.encode())
    for entry in path:
        location = os.path.abspath(entry or os.curdir)
        try:
            with os.scandir(location) as entries:
                found = sorted(
                    (item.name, item.stat().st_mtime_ns) for item in entries if item.name.endswith(METADATA_SUFFIXES)
                )
        except OSError:  # a zip file, a missing directory: no metadata directory of its own
            continue
        if found:
            digest.update(repr((location, found)).encode())
    return digest.hexdigest()[:32]


def _read(answer_file: Path) -> dict[str, list[str]] | None:
    try:
        answer = json.loads(answer_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    well_formed = isinstance(answer, dict) and all(
        isinstance(names, list) and all(isinstance(name, str) for name in names) for names in answer.values()
    )
    return answer if well_formed else None


def _keep(answer_file: Path, answer: dict[str, list[str]]) -> None:
    """Write ``answer`` whole or not at all (a temporary sibling renamed into place), then drop all but the
    ``KEPT_ANSWERS`` newest answers of the directory. Not ``pipeline.core.io``'s atomic writes: a cache is no stage
    output, and a process whose controller is gone (which they refuse to publish for) may still keep it."""
    try:
        answer_file.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=answer_file.parent, prefix=".packages-", suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(answer, out)
        os.replace(temporary, answer_file)
        answers = sorted(answer_file.parent.glob("packages-*.json"), key=lambda path: path.stat().st_mtime_ns)
        for old in answers[:-KEPT_ANSWERS]:
            old.unlink(missing_ok=True)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)


@functools.cache
def _scanned_once() -> dict[str, list[str]]:
    answer_file = cache_directory() / f"packages-{installed_key(sys.path)}.json"
    kept = _read(answer_file)
    if kept is not None:
        return kept
    answer = _ORIGINAL()
    _keep(answer_file, answer)
    return answer


def packages_distributions() -> dict[str, list[str]]:
    """``importlib.metadata.packages_distributions()``, computed once per set of installed packages: a fresh copy of
    the mapping from top-level import names to the distributions that provide them."""
    return {name: list(distributions) for name, distributions in _scanned_once().items()}


def scan_distributions_once() -> None:
    """Make ``importlib.metadata.packages_distributions`` this module's cached version (idempotent); before
    transformers or TRL is imported."""
    importlib.metadata.packages_distributions = packages_distributions
