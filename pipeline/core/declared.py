"""Settings declared once: a config section is a frozen dataclass whose fields carry their type (the annotation),
default, range and help, and everything else is derived from it.

    @dataclass(frozen=True)
    class WatchdogConfig:
        '''The stall watchdog: ... (the first paragraph is the section's help)'''

        stall_floor_s: float = setting(1200.0, "the least bound (seconds) ...", Range(exclusive_minimum=0))

        def __post_init__(self) -> None:
            refuse_out_of_range(self, "watchdog")

- ``section_schema(cls)`` is the section's JSON schema (configs/schema.yaml's ``$defs`` entry, which
  ``python -m tools.schema`` writes from it and a test holds current): ``type`` from the annotation (bool ->
  boolean, int -> integer, float -> number, str -> string, ``X | None`` adds null, a ``Literal`` is an enum), the
  default, the range's keywords (minimum, maximum, exclusiveMinimum, exclusiveMaximum) and the help as
  ``description``; the class docstring's first paragraph describes the section. docs/parameters.md is rendered
  from the schema, so it follows too.
A section that only some studies read (``data.deepmath``) sets ``filled_by_default: ClassVar[bool] = False``: its
schema entry has no default, so a study that leaves it out has no such key. A setting declared with ``REQUIRED``
for its default has none: the schema lists it under ``required``, and building the section without it is refused
by name (``pipeline.core.specs.dataclass_from_mapping``).
- ``refuse_out_of_range(instance, where)`` checks every field against its range when the section is built (a stage
  run on its own gets the same check as a planned study).

The credit methods declare their options the same way (``pipeline.credit.method``: ``metadata["help"]`` and
``metadata["range"]``).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import types
import typing
from dataclasses import dataclass
from typing import Any

from pipeline.core.io import InputError

# the default of a setting that has none: the section must give it
REQUIRED: Any = dataclasses.MISSING


@dataclass(frozen=True)
class Range:
    """An interval of allowed values; ``None`` is unbounded. Exclusive ends are open."""

    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None
    exclusive_maximum: float | None = None

    def problem(self, value: float) -> str | None:
        """Why ``value`` is outside the range (e.g. "must be > 0"), or None when it is inside."""
        bounds = [
            (self.minimum, ">=", lambda b: value >= b),
            (self.exclusive_minimum, ">", lambda b: value > b),
            (self.maximum, "<=", lambda b: value <= b),
            (self.exclusive_maximum, "<", lambda b: value < b),
        ]
        for bound, sign, holds in bounds:
            if bound is not None and not (isinstance(value, int | float) and not math.isnan(value) and holds(bound)):
                return f"must be {sign} {bound}"
        return None

    def schema(self) -> dict[str, float]:
        """The JSON schema keywords of this range."""
        keywords = {
            "minimum": self.minimum,
            "maximum": self.maximum,
            "exclusiveMinimum": self.exclusive_minimum,
            "exclusiveMaximum": self.exclusive_maximum,
        }
        return {keyword: bound for keyword, bound in keywords.items() if bound is not None}


def setting(
    default: Any,
    help: str,
    range: Range | None = None,
    *,
    non_empty: bool = False,
    shared: str | None = None,
    json: dict[str, Any] | None = None,
    schema_default: bool = True,
) -> Any:
    """A dataclass field declaring one setting: its default, its help, where numeric its allowed range, for a
    string whether it may be empty, ``shared``: the schema's ``$defs`` entry of a type several sections use
    (``prompt_template``, ``grading``: its choices and their meaning written once there), and ``json``: the JSON
    schema of a value its annotation cannot say (a choice or a list; ``final`` or a step), which the validation of a
    planned study checks. ``schema_default=False``: the schema gives no default, so a study that leaves the key out
    has no such key (the study resolves it, e.g. from another section; ``default`` stands for it in code).
    ``default=REQUIRED``: no default, the key must be given."""
    metadata: dict[str, Any] = {"help": help}
    if not schema_default:
        metadata["schema_default"] = False
    if json is not None:
        metadata["json"] = json
    if range is not None:
        metadata["range"] = range
    if non_empty:
        metadata["non_empty"] = True
    if shared is not None:
        metadata["shared"] = shared
    return dataclasses.field(default=default, metadata=metadata)


def refuse_out_of_range(instance: Any, where: str) -> None:
    """InputError naming the first field of ``instance`` outside its declared range (``where.name``)."""
    for option in dataclasses.fields(instance):
        declared = option.metadata.get("range")
        value = getattr(instance, option.name)
        if declared is not None and value is not None and (problem := declared.problem(value)):
            raise InputError(f"{where}.{option.name}: invalid value {value!r} ({problem})")
        if option.metadata.get("non_empty") and value == "":
            raise InputError(f"{where}.{option.name}: must not be empty")


def annotation_schema(annotation: Any) -> dict[str, Any]:
    """The JSON schema type of a setting's annotation (bool, int, float, str, a Literal, or one of them | None)."""
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return {"enum": list(arguments)}
    if origin is dict:
        return {"type": "object"}
    if origin in (typing.Union, types.UnionType):
        members = [annotation_schema(member) for member in arguments if member is not type(None)]
        if len(members) != 1 or "type" not in members[0] or len(arguments) != 2:
            raise TypeError(f"a setting's annotation is one type or one type | None, not {annotation!r}")
        return {"type": [members[0]["type"], "null"]}
    names = {bool: "boolean", int: "integer", float: "number", str: "string"}
    if annotation not in names:
        raise TypeError(f"no JSON schema type for a setting annotated {annotation!r}")
    return {"type": names[annotation]}


def section_help(cls: type) -> str:
    """The section's help: the first paragraph of its class docstring, on one line."""
    return " ".join(inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].split())


def setting_schema(option: dataclasses.Field[Any], annotation: Any, *, with_default: bool = True) -> dict[str, Any]:
    """The JSON schema of one declared setting: its type, range, default (``with_default``) and help."""
    if "help" not in option.metadata:
        raise TypeError(f"{option.name}: declared without help (use setting())")
    shared = option.metadata.get("shared")
    if "json" in option.metadata:
        node = dict(option.metadata["json"])
    else:
        node = {"$ref": f"#/$defs/{shared}"} if shared else annotation_schema(annotation)
    if "range" in option.metadata:
        node |= option.metadata["range"].schema()
    if option.metadata.get("non_empty"):
        node["minLength"] = 1
    if with_default and option.metadata.get("schema_default", True) and not is_required(option):
        # an integral float as an integer: the filled-in config (and every param made from it) stays what the
        # hand-written schema gave before its section was declared
        default = option.default
        node["default"] = int(default) if isinstance(default, float) and default.is_integer() else default
    node["description"] = option.metadata["help"]
    return node


def is_required(option: dataclasses.Field[Any]) -> bool:
    """Whether a declared setting has no default (``REQUIRED``)."""
    return option.default is dataclasses.MISSING and option.default_factory is dataclasses.MISSING


def settings_schema(cls: type) -> dict[str, dict[str, Any]]:
    """The JSON schema of each setting of a declared dataclass, by name; a field that is a section of its own
    (``metadata={"section": True}``, e.g. ``EvalSpec.vllm``) has its own entry and is left out."""
    annotations = typing.get_type_hints(cls)
    return {
        option.name: setting_schema(option, annotations[option.name])
        for option in dataclasses.fields(cls)
        if not option.metadata.get("section")
    }


def section_schema(cls: type) -> dict[str, Any]:
    """The JSON schema of a declared section (module docstring)."""
    properties = settings_schema(cls)
    schema: dict[str, Any] = {"type": "object", "additionalProperties": False}
    required = [option.name for option in dataclasses.fields(cls) if option.name in properties and is_required(option)]
    if required:
        schema["required"] = required
    if getattr(cls, "filled_by_default", True) and not required:
        schema["default"] = {}
    return schema | {"description": section_help(cls), "properties": properties}
