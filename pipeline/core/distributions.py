"""One scan of the installed distributions per process.

transformers and TRL each call ``importlib.metadata.packages_distributions()`` when they are imported (the
module-level ``PACKAGE_DISTRIBUTION_MAPPING`` of ``transformers.utils.import_utils`` and of ``trl.import_utils``),
which reads the file list of every installed distribution: about 1.3 s of CPU each on CI's 2-core machine with this
project's environment, and every training stage imports both. Nothing installs packages into a running stage, so
the second scan can reuse the first one's answer; each caller still gets its own copy to keep."""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Callable

_ORIGINAL: Callable[[], dict[str, list[str]]] = importlib.metadata.packages_distributions


@functools.cache
def _scanned_once() -> dict[str, list[str]]:
    return _ORIGINAL()


def packages_distributions() -> dict[str, list[str]]:
    """``importlib.metadata.packages_distributions()``, computed on the first call of the process: a fresh copy of the
    mapping from top-level import names to the distributions that provide them."""
    return {name: list(distributions) for name, distributions in _scanned_once().items()}


def scan_distributions_once() -> None:
    """Make ``importlib.metadata.packages_distributions`` this module's cached version (idempotent); before
    transformers or TRL is imported."""
    importlib.metadata.packages_distributions = packages_distributions
