"""The one spec type-checker: spec values (as JSON/YAML parse them) against type annotations, and spec dataclasses
built from mappings with every unknown key and mistyped value refused by name.

Used for ``GrailGRPOConfig`` (training), and the warm-up, evaluation and token-analysis specs.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pipeline.core.declared import is_required
from pipeline.core.io import InputError, load_spec

SpecT = TypeVar("SpecT")


def dataclass_from_mapping(cls: type[SpecT], mapping: Any, where: str) -> SpecT:
    """Build the dataclass ``cls`` from ``mapping``, refusing unknown keys and values its annotations refuse.

    A value must fit its field's annotation (``annotation_accepts``); a field without a default must be given; an
    int given for a float field becomes a float; a nested dataclass field is built recursively from a nested
    mapping. ``where`` names the spec in error messages (e.g. ``"evaluation spec"``).
    """
    if mapping is None:
        mapping = {}
    if not isinstance(mapping, Mapping):
        raise InputError(f"{where}: expected a mapping, got {type(mapping).__name__}")
    fields = {field.name: field for field in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(mapping) - set(fields))
    if unknown:
        raise InputError(f"{where}: unknown key(s) {unknown}; known keys: {sorted(fields)}")
    missing = [name for name, field in fields.items() if field.init and name not in mapping and is_required(field)]
    if missing:
        raise InputError(f"{where}: missing required key(s) {missing}")
    annotations = typing.get_type_hints(cls)
    values = {}
    for name, value in mapping.items():
        annotation, key = annotations[name], f"{where}.{name}"
        if dataclasses.is_dataclass(annotation):
            values[name] = dataclass_from_mapping(annotation, value, key)
        elif not annotation_accepts(annotation, value):
            raise InputError(f"{key}: expected {annotation_name(annotation)}, got {type(value).__name__} {value!r}")
        else:
            values[name] = float(value) if annotation is float else value
    return cls(**values)


def annotation_accepts(annotation: Any, value: Any) -> bool:
    """Whether a spec value (as JSON/YAML parses it) fits a type annotation.

    A union accepts what any member accepts; int and float never accept a bool, float accepts an int; an enum
    accepts its members and their values; ``list[X]`` and ``dict[K, V]`` check their elements; Any accepts all.
    """
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(annotation_accepts(member, value) for member in arguments)
    if origin is typing.Literal:
        return any(type(value) is type(option) and value == option for option in arguments)
    if origin is list:
        (item_type,) = arguments
        return isinstance(value, list) and all(annotation_accepts(item_type, item) for item in value)
    if origin is dict:
        key_type, item_type = arguments
        return isinstance(value, dict) and all(
            annotation_accepts(key_type, key) and annotation_accepts(item_type, item) for key, item in value.items()
        )
    if origin is not None:  # another generic alias (tuple[...], ...): its container type
        return isinstance(value, origin)
    if annotation is type(None):
        return value is None
    if annotation in (int, float) and isinstance(value, bool):
        return False
    if annotation is float:
        return isinstance(value, int | float)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return isinstance(value, annotation) or value in {member.value for member in annotation}
    return isinstance(annotation, type) and isinstance(value, annotation)


def annotation_name(annotation: Any) -> str:
    """A type annotation as written in Python: ``int``, ``dict | str | None``, ``list[str]``."""
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "None"
    if origin in (typing.Union, types.UnionType):
        return " | ".join(annotation_name(member) for member in arguments)
    if origin is typing.Literal:
        return " | ".join(repr(option) for option in arguments)
    if origin is not None:
        return f"{annotation_name(origin)}[{', '.join(annotation_name(argument) for argument in arguments)}]"
    return getattr(annotation, "__name__", repr(annotation))


def stage_spec(argv: Sequence[str]) -> dict[str, Any] | None:
    """The merged ``--training-spec`` and ``--method-spec`` (the method's win) of a training stage's command line,
    for the processes that act on them before the stage does (the launcher, the vLLM import); None when the
    command line has neither, or one does not load as a mapping (the stage itself names that problem)."""
    parser = argparse.ArgumentParser(add_help=False)
    for option in ("--training-spec", "--method-spec"):
        parser.add_argument(option, default=None)
    known, _ = parser.parse_known_args(list(argv))
    if known.training_spec is None and known.method_spec is None:
        return None
    try:
        loaded = [load_spec(text or "{}") for text in (known.training_spec, known.method_spec)]
    except InputError:
        return None
    if not all(isinstance(spec, dict) for spec in loaded):
        return None
    return {**loaded[0], **loaded[1]}
