"""Where an option is still written twice, these tests fail when configs/schema.yaml, the recorded TRL defaults or a
stage's spec dataclass disagree with the declaration they mirror (keys, choices, ranges, defaults). A section
declared with ``pipeline.core.declared`` has its schema entry generated instead (tests/core/test_declared.py)."""

from __future__ import annotations

import typing

from trl import GRPOConfig

from pipeline.runtime.launching import TRAINING_ENGINES, TrainingEngine
from pipeline.study.checks import TRL_DEFAULTS
from pipeline.study.config import Study
from pipeline.study.schema import load_schema
from pipeline.tasks.prompts import PROMPT_TEMPLATES, PromptTemplate

SCHEMA = load_schema()


def resolved(node: dict) -> dict:
    """A schema node with a local ``$ref`` merged in."""
    reference = node.get("$ref", "")
    if not reference.startswith("#/"):
        return node
    target = SCHEMA
    for part in reference[2:].split("/"):
        target = target[part]
    return {**resolved(target), **{key: value for key, value in node.items() if key != "$ref"}}


def choices(annotation: typing.Any) -> set | None:
    """The values of a ``Literal`` annotation (also inside ``X | None``), or None for any other type."""
    if typing.get_origin(annotation) is typing.Literal:
        return set(typing.get_args(annotation))
    members = [choices(member) for member in typing.get_args(annotation)]
    found = [member for member in members if member is not None]
    return found[0] if found else None


def assert_choices_match(properties: dict, cls: type) -> None:
    """Every enum of ``properties`` is the Literal of the same-named field of ``cls``, and the other way round."""
    annotations = typing.get_type_hints(cls)
    for name, annotation in annotations.items():
        if name in properties:
            declared = choices(annotation)
            schema_enum = resolved(properties[name]).get("enum")
            assert (set(schema_enum) if schema_enum else None) == declared, f"{cls.__name__}.{name}"


def test_recorded_trl_defaults_are_grpo_configs(tmp_path):
    defaults = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    assert {name: getattr(defaults, name) for name in TRL_DEFAULTS} == TRL_DEFAULTS


def test_prompt_templates_are_the_literal_and_the_schema_enum():
    declared = set(typing.get_args(PromptTemplate))
    assert set(PROMPT_TEMPLATES) == declared == set(SCHEMA["$defs"]["prompt_template"]["enum"])


def test_training_engines_are_the_launchers_and_the_schema_enum():
    node = SCHEMA["properties"]["training_engine"]
    assert set(node["enum"]) == set(TRAINING_ENGINES) == set(typing.get_args(TrainingEngine))
    assert node["default"] == Study.__dataclass_fields__["training_engine"].default
    assert_choices_match(SCHEMA["properties"], Study)  # and library_changes, stale_checkpoints


def test_time_windows_default_is_the_studys():
    assert SCHEMA["properties"]["time_windows"]["default"] == Study.__dataclass_fields__["time_windows"].default
