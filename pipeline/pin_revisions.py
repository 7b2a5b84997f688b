"""Write the hub cache's commits into a study config in place of branch names, so that the study reruns on exactly
the models and data sets that were downloaded.

    hf download Qwen/Qwen3-4B --revision main            # ... every command the preflight's hub check names
    python -m pipeline.pin_revisions --configfile configs/paper.yaml            # print the change as a diff
    python -m pipeline.pin_revisions --configfile configs/paper.yaml --write    # make it

Every hub reference of the study (pipeline.study.hub_references: ``models.NAME.revision``,
``data.deepmath.revision``, ``benchmarks.NAME.revision``) whose revision is a branch or tag is resolved in the local
hub cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``: pipeline.models.hub_cache.cached_commit) and its commit is
written under that key: the value replaced where the file sets it, else added to the mapping that holds it (a
benchmark's kind may default to a branch). A reference that is not in the cache is named with the ``hf download``
command that fetches it, and the command exits with status 2 after writing the others.

The file is rewritten line by line, only the revision values, so that its comments and layout stay as they are
(ruamel.yaml, which could round-trip YAML, is not a dependency). Every rewrite is checked: the new file must parse
to the old config with exactly those revisions changed, else nothing is written and the keys to set by hand are
named. One config file: the one that sets the study's hub references.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.io import InputError, atomic_write_text, run_cli
from pipeline.models.hub_cache import cached_commit, download_command, hub_cache_dir, is_commit
from pipeline.study.hub_references import HubReference, hub_references
from pipeline.study.load import load_study

KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?P<rest>.*)$")
BLOCK_VALUE = re.compile(r"^(?P<before>\s*)(?:\"[^\"]*\"|'[^']*'|[^\s#]+)(?P<after>.*)$")
FLOW_MAPPING = re.compile(r"^(?P<before>\s*\{.*?)(?P<close>\s*\})(?P<after>\s*(?:#.*)?)$")


def key_lines(lines: list[str]) -> dict[tuple[str, ...], int]:
    """The line index of every block-mapping key of a YAML text, by its path of keys (indentation decides nesting;
    comments, blank lines, list items and flow contents are passed over)."""
    stack: list[tuple[int, str]] = []
    found = {}
    for index, line in enumerate(lines):
        match = KEY_LINE.match(line)
        if match is None:
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"]))
        found[tuple(key for _, key in stack)] = index
    return found


def child_indent(lines: list[str], parent: int) -> str:
    """The indentation of the first key below line ``parent``, else the parent's plus two spaces."""
    parent_indent = len(lines[parent]) - len(lines[parent].lstrip(" "))
    for line in lines[parent + 1 :]:
        if line.strip() and not line.lstrip().startswith("#"):
            indent = len(line) - len(line.lstrip(" "))
            return " " * indent if indent > parent_indent else " " * (parent_indent + 2)
    return " " * (parent_indent + 2)


def yaml_string(value: str) -> str:
    """``value`` as a YAML string scalar: plain where YAML reads it back as that string, else double-quoted (a
    commit of digits only would read as an integer)."""
    return value if yaml.safe_load(value) == value else json.dumps(value)


def set_value(lines: list[str], key: tuple[str, ...], text: str) -> bool:
    """Set ``key`` to the string ``text`` in ``lines`` (in place): replace the value of its block line, or add it to
    its parent's one-line flow mapping (``name: {kind: x}``) or block mapping. False when the parent is not found."""
    value = yaml_string(text)
    found = key_lines(lines)
    if key in found:
        index = found[key]
        match = KEY_LINE.match(lines[index])
        assert match is not None  # found by key_lines
        value_match = BLOCK_VALUE.match(match["rest"])
        if value_match is None:
            return False
        lines[index] = f"{match['indent']}{match['key']}:{value_match['before']}{value}{value_match['after']}"
        return True
    if key[:-1] not in found:
        return False
    parent = found[key[:-1]]
    match = KEY_LINE.match(lines[parent])
    assert match is not None
    flow = FLOW_MAPPING.match(match["rest"])
    if flow is not None:
        entry = re.compile(rf"(?P<lead>[{{,]\s*{re.escape(key[-1])}:\s*)[^,}}\s]+")
        if entry.search(flow["before"]):
            before = entry.sub(lambda m: m["lead"] + value, flow["before"], count=1)
        else:
            before = f"{flow['before']}, {key[-1]}: {value}"
        lines[parent] = f"{match['indent']}{match['key']}:{before}{flow['close']}{flow['after']}"
        return True
    lines.insert(parent + 1, f"{child_indent(lines, parent)}{key[-1]}: {value}")
    return True


def with_value(config: dict[str, Any], key: tuple[str, ...], value: str) -> dict[str, Any]:
    """A copy of ``config`` with ``key`` set to ``value``."""
    changed = copy.deepcopy(config)
    mapping = changed
    for part in key[:-1]:
        mapping = mapping[part]
    mapping[key[-1]] = value
    return changed


def pin_text(text: str, pins: dict[tuple[str, ...], str]) -> tuple[str, list[tuple[str, ...]]]:
    """``text`` with each key of ``pins`` set to its commit, and the keys that could not be written line by line
    (the rewrite of each is checked against the parsed config: an unchecked rewrite is not kept)."""
    lines = text.split("\n")
    config = yaml.safe_load(text) or {}
    by_hand = []
    for key, commit in pins.items():
        trial = list(lines)
        expected = with_value(config, key, commit) if _parent_exists(config, key) else None
        if expected is not None and set_value(trial, key, commit) and parses_to(trial, expected):
            lines, config = trial, expected
        else:
            by_hand.append(key)
    return "\n".join(lines), by_hand


def parses_to(lines: list[str], expected: dict[str, Any]) -> bool:
    """Whether the YAML ``lines`` parse to ``expected``."""
    try:
        return yaml.safe_load("\n".join(lines)) == expected
    except yaml.YAMLError:
        return False


def _parent_exists(config: dict[str, Any], key: tuple[str, ...]) -> bool:
    mapping: Any = config
    for part in key[:-1]:
        if not isinstance(mapping, dict) or not isinstance(mapping.get(part), dict):
            return False
        mapping = mapping[part]
    return True


def resolve(references: list[HubReference]) -> tuple[dict[tuple[str, ...], str], list[HubReference]]:
    """(``{config key: cached commit}`` of the references named by a branch or tag, the references whose
    revision is not in the hub cache). A reference already at a commit is left alone."""
    pins, missing = {}, []
    for reference in references:
        if is_commit(reference.revision):
            continue
        commit = cached_commit(reference.repo_id, reference.repo_type, reference.revision)
        if commit is None:
            missing.append(reference)
        else:
            pins[reference.key] = commit
    return pins, missing


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configfile", required=True, type=Path, help="the study config that sets the revisions")
    parser.add_argument("--write", action="store_true", help="rewrite the file (default: print the change as a diff)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    study = load_study([args.configfile], check_inputs=False)
    pins, missing = resolve(hub_references(study))
    text = args.configfile.read_text(encoding="utf-8")
    pinned, by_hand = pin_text(text, pins)
    if pinned != text:
        if args.write:
            atomic_write_text(args.configfile, pinned)
        else:
            diff = difflib.unified_diff(
                text.splitlines(keepends=True), pinned.splitlines(keepends=True), str(args.configfile), "pinned"
            )
            sys.stdout.writelines(diff)
    written = len(pins) - len(by_hand)
    verb = "pinned" if args.write else "would pin"
    print(f"pin_revisions: {verb} {written} revision(s) in {args.configfile}", file=sys.stderr)
    problems = [f"{'.'.join(key)}: set it to {pins[key]} by hand (not written line by line)" for key in by_hand]
    problems += [
        f"{reference.key_name}: {reference.repo_id} at {reference.revision!r} is not in the hub cache "
        f"({hub_cache_dir()}): `{download_command(reference.repo_id, reference.repo_type, reference.revision)}`"
        for reference in missing
    ]
    if problems:
        raise InputError(f"{len(problems)} revision(s) not pinned:\n  " + "\n  ".join(problems))


if __name__ == "__main__":
    run_cli(main)
