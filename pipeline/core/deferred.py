"""A module imported at its first use, for the modules that the study's planning loads but whose functions alone
need the module: the credit methods name torch at their top, and the config validation (the Snakefile, the
preflight, ``pin_revisions``, ``power``) loads them for their options only. So a login node plans the study with
no torch installed (``pip install -e '.[slurm]'``, docs/cluster.md).

Written here rather than taken from ``importlib.util.LazyLoader``: that loader needs the module's spec up front,
so it fails where the module is not installed, which is the login node's case.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class DeferredModule(ModuleType):
    """Stands for module ``name``; its first attribute read imports the module, and each attribute read is kept."""

    def __init__(self, name: str) -> None:
        super().__init__(name)

    def __getattr__(self, attribute: str) -> Any:
        value = getattr(importlib.import_module(self.__name__), attribute)
        setattr(self, attribute, value)
        return value
