"""Every hub model and dataset a study reads, each with the config key that sets its revision.

    models.NAME.revision          a model whose ``path`` is a hub id (not an existing directory)
    data.deepmath.revision        the training data, when ``data.source`` is deepmath
    benchmarks.NAME.revision      a hub benchmark (its kind's pinned source, or its ``hub_id``) without a ``path``

A revision the config does not set is the default the stage would use (the kind's pinned revision of
pipeline/tasks/benchmarks.py, ``main`` for the training data), still under the key that would set it. The preflight
checks these references against the hub cache, ``strict_revisions`` requires each to be a commit and
``pipeline.pin_revisions`` writes their cached commits into the config.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.core.specs import dataclass_from_mapping
from pipeline.study.config import Study
from pipeline.tasks.benchmarks import SOURCE_FORMATS
from pipeline.tasks.training_sources import DeepMathSource


@dataclass(frozen=True)
class HubReference:
    """One hub repository at one revision, and where in the config its revision is set."""

    key: tuple[str, ...]  # the config path of the revision, e.g. ("models", "qwen3_4b", "revision")
    repo_id: str
    repo_type: str  # model or dataset
    revision: str

    @property
    def key_name(self) -> str:
        """The revision's config key as the docs write it, ``models.NAME.revision``."""
        return ".".join(self.key)


def hub_references(study: Study) -> list[HubReference]:
    """The study's hub references (module docstring), in config order."""
    references = [
        HubReference(("models", model.name, "revision"), model.path, "model", model.revision or "main")
        for model in study.models.values()
        if model.path and not Path(model.path).exists()
    ]
    if study.data.get("source") == "deepmath":
        deepmath = dataclass_from_mapping(DeepMathSource, study.data.get("deepmath"), "data.deepmath")
        references.append(HubReference(("data", "deepmath", "revision"), deepmath.hub_id, "dataset", deepmath.revision))
    for name, spec in study.benchmarks.items():
        source = SOURCE_FORMATS.get(spec.get("kind", ""))
        hub_id = spec.get("hub_id", source.hub_id if source else None)
        if hub_id and "path" not in spec:
            revision = str(spec.get("revision", (source.revision if source else None) or "main"))
            references.append(HubReference(("benchmarks", name, "revision"), hub_id, "dataset", revision))
    return references
