"""One scan of the installed distributions per environment, not per process.

transformers and TRL each call ``importlib.metadata.packages_distributions()`` when they are imported (the
module-level ``PACKAGE_DISTRIBUTION_MAPPING`` of ``transformers.utils.import_utils`` and of ``trl.import_utils``),
which reads the file list of every installed distribution: 0.9-1.3 s of CPU on CI's 2-core machine with this
project's environment, and every stage that imports either pays it (the test suite starts hundreds of such
processes). Nothing installs packages into a running stage, so the second call of a process reuses the first one's
answer; each caller still gets its own copy to keep.

Across processes the answer is kept on disk (``pipeline.core.kept``: ``~/.cache/grail-pipeline/packages/``). The
key is the Python version and, for every ``sys.path`` entry holding distribution metadata, that entry with the name
and modification time of each metadata directory (``*.dist-info``, ``*.egg-info``, ``*.egg``). Installing, upgrading or
removing a distribution creates or removes such a directory (pip writes a new one and removes the old), so the key
changes and a kept answer is never that of another set of installed packages; an entry without metadata (a stage's
working directory on ``sys.path``) leaves the key alone. Computing the key lists the directories on ``sys.path``
(a few milliseconds). The standard library offers no such cache, hence this module.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import sys
from collections.abc import Callable
from typing import Any

from pipeline.core.kept import kept_answer

_ORIGINAL: Callable[[], dict[str, list[str]]] = importlib.metadata.packages_distributions
METADATA_SUFFIXES = (".dist-info", ".egg-info", ".egg")
KEPT_ANSWERS = 16  # answers kept on disk (one per environment and set of installed packages), the newest


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


def _well_formed(answer: Any) -> bool:
    return isinstance(answer, dict) and all(
        isinstance(names, list) and all(isinstance(name, str) for name in names) for names in answer.values()
    )


@functools.cache
def _scanned_once() -> dict[str, list[str]]:
    # _ORIGINAL looked up at the call, not bound here: the tests put a counting scan in its place
    return kept_answer("packages", installed_key(sys.path), lambda: _ORIGINAL(), _well_formed, KEPT_ANSWERS)


def packages_distributions() -> dict[str, list[str]]:
    """``importlib.metadata.packages_distributions()``, computed once per set of installed packages: a fresh copy of
    the mapping from top-level import names to the distributions that provide them."""
    return {name: list(distributions) for name, distributions in _scanned_once().items()}


def scan_distributions_once() -> None:
    """Make ``importlib.metadata.packages_distributions`` this module's cached version (idempotent); before
    transformers or TRL is imported."""
    importlib.metadata.packages_distributions = packages_distributions
