"""Suite-wide settings: Hypothesis without its per-example deadline (a loaded 2-core CI machine runs some examples
past 200 ms, which says nothing about correctness), and derandomized under CI so that a CI run is reproducible.
Tests marked ``vllm`` run a real vLLM engine: without vllm they skip, except under ``CI=true``, where CI installs it
(``scripts/install.sh --dev --vllm``) and a missing vllm fails them."""

from __future__ import annotations

import importlib.util
import os

import pytest
from hypothesis import settings

settings.register_profile("local", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "local")


@pytest.fixture(autouse=True)
def _vllm_installed_for_vllm_tests(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("vllm") is None or importlib.util.find_spec("vllm") is not None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail("vllm is not installed; CI installs it with `bash scripts/install.sh --dev --vllm`")
    pytest.skip("vllm is not installed (bash scripts/install.sh --vllm)")
