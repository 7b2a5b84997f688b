"""Command: write the config sections that are declared in code into configs/schema.yaml.

    python -m tools.schema            # rewrite each generated $defs entry from its declaration
    python -m tools.schema --check    # exit 1 when one is stale

A declared section (``pipeline.core.declared``) is one frozen dataclass; its ``$defs`` entry in the schema sits
between two marker lines and is never edited by hand:

    # declared: pipeline.runtime.watchdog.WatchdogConfig (python -m tools.schema writes this entry)
    watchdog:
      ...
    # /declared

The settings of a dataclass that are one section's keys beside others (``EvalSpec``: the evaluate stage's keys of
``evaluation``, whose other keys plan jobs) are written as property lines between their own markers:

    # declared settings: pipeline.evaluation.eval_spec.EvalSpec (python -m tools.schema writes these lines)
    backend: {...}
    # /declared

A marker may also name a function of this module that returns an entry (``tools.schema.credit_fields``: the credit
options of a method section, declared by ``GrailGRPOConfig`` and the built-in methods' option dataclasses;
``tools.schema.grpo_fields``: the TRL fields a study sets, with TRL's help;
``tools.schema.resources``: a rule's request, ``Resources``' defaults for every rule, one key per rule the Snakefile
asks resources for).

After it, `python -m tools.docs_parameters` renders docs/parameters.md from the schema (docs/contributing.md,
"Adding a setting").
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import re
import sys
import textwrap
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.declared import is_required, section_schema, setting_schema, settings_schema
from pipeline.core.repo import REPO_DIR, SCHEMA_PATH
from pipeline.credit.settings import SharedCreditOptions
from pipeline.study.sections import Resources
from pipeline.training.grpo_config import MODEL_LOADING_OPTIONS, STUDY_TRL_FIELDS, GrailGRPOConfig, GRPOConfig
from pipeline.training.grpo_config import credit_fields as declared_credit_fields

BLOCK = re.compile(
    r"^(?P<indent> *)# declared: (?P<target>[\w.]+) \(python -m tools\.schema writes this entry\)\n"
    r"(?P<body>.*?)"
    r"^(?P=indent)# /declared\n",
    re.MULTILINE | re.DOTALL,
)
SETTINGS_BLOCK = re.compile(
    r"^(?P<indent> *)# declared settings: (?P<target>[\w.]+) \(python -m tools\.schema writes these lines\)\n"
    r"(?P<body>.*?)"
    r"^(?P=indent)# /declared\n",
    re.MULTILINE | re.DOTALL,
)
WIDTH = 116
# the end of a help text's first sentence: a full stop before a space or the end, not the one of "e.g." or "i.e."
SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)\.(?:\s|$)")


def declaration(target: str) -> type | Callable[[], dict[str, Any]]:
    """The dataclass ``module.Class``, or the function returning an entry, that a marker names."""
    module, _, name = target.rpartition(".")
    return getattr(importlib.import_module(module), name)


def credit_fields() -> dict[str, Any]:
    """``$defs/credit_fields``: every credit option a method section takes, as ``GrailGRPOConfig`` declares it
    (the options every method shares first, then the built-in methods'). No defaults: an option a method leaves
    unset takes its declared default when the training config is built, and the study's filled-in config (every
    method's params) stays as written."""
    hints = typing.get_type_hints(GrailGRPOConfig)
    shared = SharedCreditOptions.__annotations__ | GrailGRPOConfig.__annotations__
    options = sorted(declared_credit_fields(), key=lambda option: option.name not in shared)
    return {
        "type": "object",
        "required": ["credit"],
        "description": "The credit options of a method section (pipeline.training.grpo_config.GrailGRPOConfig).",
        "properties": {
            option.name: setting_schema(option, hints[option.name], with_default=False) for option in options
        },
    }


def first_sentence(text: str) -> str:
    """The first sentence of a help text, on one line."""
    text = " ".join(text.split())
    end = SENTENCE_END.search(text)
    return text[: end.start() + 1] if end else text


def grpo_fields() -> dict[str, Any]:
    """``$defs/grpo_fields``: the TRL fields a study may set (``STUDY_TRL_FIELDS``: the values the pipeline supports,
    described by the first sentence of TRL's own help unless the table gives a description), then the
    model-loading options. No defaults: a method's spec holds only what it overrides."""
    trl_help = {option.name: option.metadata.get("help", "") for option in dataclasses.fields(GRPOConfig)}
    unknown = sorted(set(STUDY_TRL_FIELDS) - set(trl_help))
    if unknown:
        raise SystemExit(f"STUDY_TRL_FIELDS names fields TRL's GRPOConfig does not have: {unknown}")
    properties = {
        name: {**node, "description": node.get("description") or first_sentence(trl_help[name])}
        for name, node in STUDY_TRL_FIELDS.items()
    }
    properties |= {name: option.schema for name, option in MODEL_LOADING_OPTIONS.items()}
    return {
        "type": "object",
        "description": "The TRL GRPOConfig fields a study sets (pipeline.training.grpo_config.STUDY_TRL_FIELDS) and "
        "the model-loading options; no defaults here, so that a method's spec only holds what it overrides.",
        "properties": properties,
    }


def flow(value: Any) -> str:
    """A value as one line of YAML flow text (PyYAML's writer: a float such as 1e-06 keeps the dot YAML 1.1 needs to
    read it back as a float, ``1.0e-06``)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf, sort_keys=False, allow_unicode=True)
    return text.removesuffix("\n...\n").strip()  # a scalar is written as a document, with its end marker


def resources() -> dict[str, Any]:
    """``$defs/resources``: ``default``, whose values are ``Resources``' defaults, and one key per rule whose
    resources the Snakefile reads (its ``resources_of("RULE"`` calls, in order), each a ``$defs/resource``."""
    rules = dict.fromkeys(re.findall(r'resources_of\("(\w+)"', (REPO_DIR / "Snakefile").read_text(encoding="utf-8")))
    request = {"$ref": "#/$defs/resource"}
    defaults = {
        option.name: {"default": option.default}
        for option in dataclasses.fields(Resources)
        if option.default is not None
    }
    return {
        "type": "object",
        "additionalProperties": False,
        "default": {},
        "description": "Per rule; `default` applies to every rule, a rule's entry overrides it, "
        "models.<name>.resources overrides both.",
        "properties": {
            "default": {"allOf": [request], "default": {}, "properties": defaults},
            **{rule: request for rule in rules},
        },
    }


def entry_text(name: str, schema: dict[str, Any], indent: str) -> str:
    """The YAML of one ``$defs`` entry: the section's keys, its description folded, one line per property."""
    inner = indent + "  "
    lines = [f"{indent}{name}:"]
    lines += [
        f"{inner}{key}: {flow(schema[key])}"
        for key in ("type", "additionalProperties", "required", "default")
        if key in schema
    ]
    lines.append(f"{inner}description: >")
    lines += textwrap.wrap(schema["description"], WIDTH, initial_indent=inner + "  ", subsequent_indent=inner + "  ")
    lines.append(f"{inner}properties:")
    lines += [f"{inner}  {option}: {flow(node)}" for option, node in schema["properties"].items()]
    return "\n".join(lines) + "\n"


def rendered(text: str) -> str:
    """The schema text with every declared entry written from its declaration."""

    def block(match: re.Match[str]) -> str:
        indent, target = match["indent"], match["target"]
        name = match["body"].split(":", 1)[0].strip()
        declared = declaration(target)
        schema = section_schema(declared) if isinstance(declared, type) else declared()
        entry = entry_text(name, schema, indent)
        return f"{indent}# declared: {target} (python -m tools.schema writes this entry)\n{entry}{indent}# /declared\n"

    def settings_block(match: re.Match[str]) -> str:
        indent, target = match["indent"], match["target"]
        lines = [f"{indent}{name}: {flow(node)}\n" for name, node in settings_schema(declaration(target)).items()]
        marker = f"{indent}# declared settings: {target} (python -m tools.schema writes these lines)\n"
        return marker + "".join(lines) + f"{indent}# /declared\n"

    text = SETTINGS_BLOCK.sub(settings_block, BLOCK.sub(block, text))
    for match in reversed(list(SETTINGS_BLOCK.finditer(text))):
        text = with_required(text, match, declaration(match["target"]))
    return text


def with_required(text: str, match: re.Match[str], declared: Any) -> str:
    """``text`` with the block's required settings (``REQUIRED``) added to the ``required`` list of the object whose
    properties hold the block (its other names are the object's own: a key the schema requires that code defaults);
    an object without a ``required`` line may hold no required setting."""
    wanted = [option.name for option in dataclasses.fields(declared) if is_required(option)]
    outer = " " * (len(match["indent"]) - 2)
    lines = text[: match.start()].splitlines(keepends=True)
    for index in range(len(lines) - 1, -1, -1):
        line = lines[index]
        depth = len(line) - len(line.lstrip(" "))
        if line.strip() and depth < len(outer):
            break
        if depth == len(outer) and line.startswith(f"{outer}required: ["):
            names = [name.strip() for name in line.strip()[len("required: [") : -1].split(",") if name.strip()]
            names += [name for name in wanted if name not in names]
            lines[index] = f"{outer}required: [{', '.join(names)}]\n"
            return "".join(lines) + text[match.start() :]
    if wanted:
        raise SystemExit(f"{match['target']}: required settings {wanted} but its object has no `required:` line")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.schema", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a declared entry is stale")
    parser.add_argument("--schema", type=Path, default=SCHEMA_PATH, help="the schema file (default: %(default)s)")
    args = parser.parse_args(argv)
    text = args.schema.read_text(encoding="utf-8")
    new = rendered(text)
    if args.check:
        if new != text:
            print(f"{args.schema}: a declared entry is stale; rerun: python -m tools.schema", file=sys.stderr)
            return 1
        return 0
    if new != text:
        args.schema.write_text(new, encoding="utf-8")
        print(f"{args.schema}: declared entries written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
