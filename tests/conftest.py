"""Suite-wide settings: Hypothesis without its per-example deadline (a loaded 2-core CI machine runs some examples
past 200 ms, which says nothing about correctness), and derandomized under CI so that a CI run is reproducible."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("local", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "local")
