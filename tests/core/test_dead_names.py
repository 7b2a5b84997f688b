"""No dead module constants: every upper-case name a package module assigns at its top level is read somewhere.

Linters cannot see this (ruff's unused-name rules stop at a module's boundary, and a module constant is public),
and a dead constant misleads: it reads like a setting that something honours. Two were found in review (issue 55:
``GSM_SYMBOLIC_KEYS``, ``DEFAULT_WATCHDOG``).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline",)
READERS = ("pipeline", "tests", "benchmarks", "scripts", "tools")


def module_constants(path: Path) -> list[str]:
    """Upper-case names assigned at a module's top level (plain or annotated assignments)."""
    names = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        names += [target.id for target in targets if isinstance(target, ast.Name) and target.id.isupper()]
    return names


def upper_case_words() -> Counter[str]:
    """How often each upper-case word occurs in the repository's code (this file left out: it names dead ones)."""
    files = [REPO / "Snakefile"] + [
        path
        for folder in READERS
        if (REPO / folder).is_dir()
        for path in (REPO / folder).rglob("*")
        if path.suffix in {".py", ".smk", ".sh"} and path.resolve() != Path(__file__).resolve()
    ]
    return Counter(word for path in files for word in re.findall(r"\w+", path.read_text(encoding="utf-8")))


def test_every_module_constant_is_read_somewhere() -> None:
    words = upper_case_words()
    dead = [
        f"{path.relative_to(REPO)}: {name}"
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        for name in module_constants(path)
        if words[name] < 2  # the assignment itself is one
    ]
    assert not dead, "constants assigned and never read:\n" + "\n".join(dead)
