"""The schema of a study config (configs/schema.yaml) and the --config overrides: every bad key named at once, with
its dotted path (``models.tiny.warmup.steps``), and the text Snakemake hands over for nested overrides turned
into the schema's types. Defaults are filled by Snakemake's own validator.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from pipeline.core.io import InputError, read_yaml
from pipeline.core.repo import SCHEMA_PATH
from pipeline.core.specs import annotation_accepts


def load_schema(path: str | Path = SCHEMA_PATH) -> dict[str, Any]:
    """The JSON Schema (YAML) as a dict."""
    with open(path, encoding="utf-8") as handle:
        return read_yaml(handle)


def _dotted(path: Iterable[Any]) -> str:
    return ".".join(str(part) for part in path) or "<top level>"


def _leaf_errors(error: ValidationError) -> Iterator[ValidationError]:
    """The most specific errors under ``error`` (allOf/anyOf wrap the useful ones in their context)."""
    if error.validator in {"allOf", "anyOf", "oneOf"} and error.context:
        deepest = max(len(child.absolute_path) for child in error.context)
        for child in error.context:
            if len(child.absolute_path) == deepest:
                yield from _leaf_errors(child)
    else:
        yield error


def _known_properties(schema: Mapping[str, Any], root: Mapping[str, Any]) -> set[str]:
    """Property names a (sub)schema allows, following local ``$ref``s and ``allOf`` branches."""
    reference = schema.get("$ref", "")
    if reference.startswith("#/"):
        node: Any = root
        for part in reference[2:].split("/"):
            node = node[part]
        schema = {**node, **{k: v for k, v in schema.items() if k != "$ref"}}
    known = set(schema.get("properties", {}))
    for branch in schema.get("allOf", []):
        known |= _known_properties(branch, root)
    return known


def _describe(error: ValidationError, root: Mapping[str, Any]) -> str | None:
    """``config key `a.b`: message`` for one schema error; unknown keys are named themselves.

    None for an "unevaluated property" that the schema does know: jsonschema reports it when the branch that
    declares it failed, and that branch's own error is the one worth reading.
    """
    path = list(error.absolute_path)
    if error.validator in {"additionalProperties", "unevaluatedProperties"} and isinstance(error.instance, dict):
        known = _known_properties(error.schema, root)
        unknown = sorted(set(error.instance) - known)
        if not unknown:
            return None
        allowed = ", ".join(sorted(known)) or "none"
        return "; ".join(
            f"config key `{_dotted([*path, key])}`: unknown key (allowed here: {allowed})" for key in unknown
        )
    return f"config key `{_dotted(path)}`: {error.message}"


def schema_errors(config: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Every schema violation of ``config`` as one message naming its key, in document order."""
    validator = Draft202012Validator(schema)
    messages: list[str] = []
    for top in sorted(validator.iter_errors(config), key=lambda error: list(map(str, error.absolute_path))):
        for error in _leaf_errors(top):
            message = _describe(error, schema)
            if message is not None and message not in messages:
                messages.append(message)
    return messages


def check_config_schema(config: Mapping[str, Any], schema_path: str | Path = SCHEMA_PATH) -> None:
    """Raise InputError listing every schema violation (each naming its key); return quietly when valid."""
    errors = schema_errors(config, load_schema(schema_path))
    if errors:
        raise InputError(error_block("the config does not match configs/schema.yaml", errors))


def error_block(headline: str, errors: list[str]) -> str:
    return headline + ":\n" + "\n".join(f"  - {error}" for error in errors)


def fill_defaults(config: dict[str, Any], schema_path: str | Path = SCHEMA_PATH) -> dict[str, Any]:
    """Fill the schema's defaults in place with Snakemake's own validator (what the Snakefile does)."""
    from snakemake.utils import validate

    validate(config, str(schema_path))
    return config


def _leaf_paths(value: Any, path: tuple = ()) -> Iterator[tuple]:
    """Paths of the scalar leaves of nested mappings and lists."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _leaf_paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _leaf_paths(item, (*path, index))
    else:
        yield path


def _refuse_constant(name: str) -> Any:
    raise ValueError(name)


def _scalar_from_text(text: str) -> Any:
    """The JSON scalar ``text`` spells (number, true, false, null), or ``text`` itself; NaN and infinities stay
    text (no schema range would refuse them)."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except ValueError:
        return text
    return value if value is None or isinstance(value, bool | int | float) else text


def coerce_overrides(
    config: dict[str, Any], overrides: Mapping[str, Any], schema_path: str | Path = SCHEMA_PATH
) -> None:
    """Give the values of ``snakemake --config`` overrides their schema types in ``config``, in place.

    Snakemake reads ``--config 'evaluation={temperature: 0.7}'`` with YAML's base loader, so every nested value
    arrives as a string ('0.7'). A string the schema refuses at its key, that spells a JSON number, boolean or
    null the schema accepts there, becomes that value; anything else ('0.7x') is left for the schema check to
    refuse by name. A method's ``credit_options`` take the types of its options dataclass the same way. Values
    from config files are never changed.
    """
    validator = Draft202012Validator(load_schema(schema_path))

    def refused_at(path: tuple) -> bool:
        for top in validator.iter_errors(config):
            for error in _leaf_errors(top):
                if tuple(error.absolute_path)[: len(path)] == path:
                    return True
        return False

    for path in _leaf_paths(overrides):
        parent: Any = config
        try:
            for part in path[:-1]:
                parent = parent[part]
            text = parent[path[-1]]
        except (KeyError, IndexError, TypeError):
            continue
        if not isinstance(text, str) or (value := _scalar_from_text(text)) is text:
            continue
        if (option_type := _credit_option_type(config, path)) is not None:
            if not annotation_accepts(option_type, text) and annotation_accepts(option_type, value):
                parent[path[-1]] = value
            continue
        if not refused_at(path):
            continue
        parent[path[-1]] = value
        if refused_at(path):
            parent[path[-1]] = text


def _credit_option_type(config: Mapping[str, Any], path: tuple) -> Any:
    """The annotation of the option at ``methods.<name>.credit_options.<key>`` in its method's options dataclass
    (the schema does not type ``credit_options``), or None for any other path or a method that does not load
    (the config check names that)."""
    if len(path) != 4 or path[0] != "methods" or path[2] != "credit_options":
        return None
    from pipeline.credit.method import credit_method

    try:
        options = credit_method(config["methods"][path[1]]["credit"]).options
    except (InputError, KeyError, TypeError):
        return None
    return typing.get_type_hints(options).get(path[3])
