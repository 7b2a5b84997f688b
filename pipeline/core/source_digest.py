"""What a stage's code is, for deciding what to rerun: one digest per module, of its syntax tree without docstrings.

Every rule of the Snakefile carries ``code=source_digest("pipeline.<stage>")`` as a param, so Snakemake reruns a
job when the code it runs changes, and records the digests with the job's other params in its metadata:

    covered    = the root modules, every module of their packages they import (module level or inside a
                 function, transitively) and the parent packages of each (Python runs ``pkg/__init__.py``
                 before ``pkg.mod``)
    digest(m)  = SHA-256 of ast.dump(ast.parse(source of m) with the docstrings of the module, its classes and
                 its functions removed), first 16 hex digits
    param      = CODE_TAG + canonical JSON {module: digest(m) for m in covered}

Comments, docstrings, blank lines and formatting are not in that dump, so editing them reruns nothing; any change
to what runs (a statement, an expression, a string constant such as a log message, an import) changes it. The dump
is Python's: a study planned by another Python minor version sees other digests. A module without a source file
digests as ``absent`` (a job importing it then fails with Python's own "No module named" error).

Extra roots: any importable module, in or out of this package (an out-of-tree credit method named by import path):
``source_digest("pipeline.train", "mylab.credit.tempered")`` also covers that module and what it imports from its
own top-level package and from this one. Out-of-tree files are found through ``importlib.util.find_spec`` of the
top-level package only, so no module is imported to digest it.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import re
import sys
from functools import cache
from pathlib import Path
from typing import Any

from pipeline.core.kept import kept_answer
from pipeline.core.repo import PACKAGE_DIR

CODE_TAG = "code "  # the param's prefix: marks the code digests among a job's recorded params
ABSENT = "absent"


class _WithoutDocstrings(ast.NodeTransformer):
    """Drops the leading string statement (the docstring) of modules, classes and functions."""

    def _strip(self, node: ast.AST) -> ast.AST:
        self.generic_visit(node)
        body = node.body  # type: ignore[attr-defined]
        first = body[0] if body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            node.body = body[1:]  # type: ignore[attr-defined]
        return node

    visit_Module = visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = _strip


def normalized_source(source: str) -> str:
    """``ast.dump`` of ``source`` without docstrings, line numbers or columns (comments never reach the tree)."""
    return _normalized(ast.parse(source))


def _normalized(tree: ast.AST) -> str:
    return ast.dump(_WithoutDocstrings().visit(tree))


def module_digest(path: Path | None) -> str:
    """First 16 hex digits of SHA-256 over the normalized source of ``path``; ``absent`` for no file."""
    if path is None:
        return ABSENT
    return _source_facts(path.read_text(encoding="utf-8"))["digest"]


# Cached per source text (reading a file is cheap, parsing it is not): one plan digests each rule's roots (16 rules,
# about 380 module digests of 25-60 distinct files), and parsing them again for every rule was most of a dry run.
# Kept on disk too (pipeline.core.kept), keyed by the source text, this module's own source (which decides the
# answer with the source) and the Python build (whose ast.dump it is): every Snakemake start and every training run
# parsed the same 110 files again, about 1.5 s of CPU on CI's machine.
KEPT_SOURCES = 4096  # a few code versions of every module


@cache
def _own_source_key() -> str:
    return hashlib.sha256(f"{sys.version}\0".encode() + Path(__file__).read_bytes()).hexdigest()


def _facts(source: str) -> dict[str, Any]:
    tree = ast.parse(source)
    imports = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            imports.append([node.level, node.module, [alias.name for alias in node.names]])
        elif isinstance(node, ast.Import):
            imports.append([0, None, [alias.name for alias in node.names]])
    digest = hashlib.sha256(_normalized(tree).encode()).hexdigest()[:16]  # after the walk: it drops docstrings
    return {"digest": digest, "imports": imports}


def _well_formed(facts: Any) -> bool:
    return (
        isinstance(facts, dict)
        and isinstance(facts.get("digest"), str)
        and isinstance(facts.get("imports"), list)
        and all(
            isinstance(entry, list)
            and len(entry) == 3
            and isinstance(entry[0], int)
            and (entry[1] is None or isinstance(entry[1], str))
            and isinstance(entry[2], list)
            and all(isinstance(name, str) for name in entry[2])
            for entry in facts["imports"]
        )
    )


@cache
def _source_facts(source: str) -> dict[str, Any]:
    """``{"digest": digest of the source (module docstring), "imports": [[level, module, [names]], ...]}``, the
    import statements as ``ast`` gives them: ``import a.b`` is ``[0, None, ["a.b"]]``."""
    key = hashlib.sha256(_own_source_key().encode() + source.encode()).hexdigest()[:32]
    return kept_answer("source-digests", key, lambda: _facts(source), _well_formed, KEPT_SOURCES)


def _package_dirs(top: str, package_dir: Path) -> list[Path]:
    """The directories of top-level package ``top`` (this package: ``package_dir``), found without importing it."""
    if top == package_dir.name:
        return [package_dir]
    spec = importlib.util.find_spec(top)
    return [Path(location) for location in spec.submodule_search_locations or []] if spec else []


def module_file(module: str, package_dir: Path = PACKAGE_DIR) -> Path | None:
    """The source file of ``module`` (a package: its ``__init__.py``), or None when there is none."""
    top, *parts = module.split(".")
    for directory in _package_dirs(top, package_dir):
        base = directory.joinpath(*parts)
        for candidate in (base / "__init__.py", base.with_suffix(".py")) if parts else (base / "__init__.py",):
            if candidate.is_file():
                return candidate
    if not parts and top != package_dir.name:  # a top-level module that is one file
        spec = importlib.util.find_spec(top)
        if spec is not None and spec.origin and spec.origin.endswith(".py") and not spec.submodule_search_locations:
            return Path(spec.origin)
    return None


def imported_modules(module: str, packages: set[str], package_dir: Path = PACKAGE_DIR) -> set[str]:
    """Modules of ``packages`` that ``module`` imports (module level or inside functions, absolute or relative)
    and that have a source file."""
    path = module_file(module, package_dir)
    if path is None:
        return set()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for level, module_name, names in _source_facts(path.read_text(encoding="utf-8"))["imports"]:
        if level == 0 and module_name is None:  # import a.b
            found |= {name for name in names if name.split(".")[0] in packages}
            continue
        base = package[: len(package) - level + 1] if level else []
        target = ".".join([*base, *([module_name] if module_name else [])])
        if target.split(".")[0] in packages:
            found.add(target)
            found |= {f"{target}.{name}" for name in names}
    return {name for name in found if module_file(name, package_dir) is not None}


def _with_parents(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:end]) for end in range(1, len(parts) + 1)}


def covered_modules(*roots: str, package_dir: Path = PACKAGE_DIR) -> list[str]:
    """The modules the digest of ``roots`` covers (module docstring), sorted."""
    packages = {package_dir.name} | {root.split(".")[0] for root in roots}
    seen: set[str] = set()
    pending = [name for root in roots for name in _with_parents(root)]
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            for imported in imported_modules(name, packages, package_dir):
                pending.extend(_with_parents(imported) - seen)
    return sorted(seen)


def module_digests(*roots: str, package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """``{module: digest}`` for every module the digest of ``roots`` covers."""
    return {
        name: module_digest(module_file(name, package_dir)) for name in covered_modules(*roots, package_dir=package_dir)
    }


def source_digest(*roots: str, package_dir: Path = PACKAGE_DIR) -> str:
    """A rule's ``code`` param: ``CODE_TAG`` + canonical JSON of ``module_digests(*roots)``."""
    digests = module_digests(*roots, package_dir=package_dir)
    return CODE_TAG + json.dumps(digests, sort_keys=True, separators=(",", ":"))


def parse_source_digest(value: object) -> dict[str, str] | None:
    """The ``{module: digest}`` of a ``source_digest`` value; None for any other value."""
    if not isinstance(value, str) or not value.startswith(CODE_TAG):
        return None
    try:
        digests = json.loads(value.removeprefix(CODE_TAG))
    except json.JSONDecodeError:
        return None
    return digests if isinstance(digests, dict) else None


def changed_modules(before: dict[str, str], after: dict[str, str]) -> dict[str, str]:
    """``{module: "changed" | "added" | "removed"}`` for every module whose digest differs between the two."""
    changes = {name: "changed" for name in before.keys() & after.keys() if before[name] != after[name]}
    changes |= {name: "added" for name in after.keys() - before.keys()}
    changes |= {name: "removed" for name in before.keys() - after.keys()}
    return dict(sorted(changes.items()))


def rule_roots(snakefile: Path) -> dict[str, list[str]]:
    """``{rule: root modules}`` of every rule whose params carry ``source_digest("...", ...)`` in ``snakefile``
    (the quoted module names of the call, which may span lines; a root computed from the config, such as the
    train rule's credit method, is not in the table). A rule defined in a loop (``rule:`` with a computed
    ``name:``) names the rules it defines in a comment after that name: ``EVALUATE.name  # evaluate, ...``."""
    roots: dict[str, list[str]] = {}
    for block in re.split(r"^(?=\s*rule(?: \w+)?:$)", snakefile.read_text(encoding="utf-8"), flags=re.MULTILINE):
        named = re.match(r"rule (\w+):", block)
        looped = re.match(r"\s*rule:\n\s*name:\n[^#\n]*#\s*([\w, ]+)$", block, flags=re.MULTILINE)
        names = [named.group(1)] if named else looped.group(1).replace(",", " ").split() if looped else []
        call = re.search(r"source_digest\(([^)]*)\)", block)
        for name in names if call else []:
            roots[name] = re.findall(r"\"([\w.]+)\"", call.group(1))
    return roots


def coverage_table(snakefile: Path, package_dir: Path = PACKAGE_DIR) -> str:
    """A Markdown table: per rule, the modules its code digest covers (``pipeline.`` left out)."""
    lines = ["| rule | modules | covered |", "|---|---|---|"]
    for rule, roots in rule_roots(snakefile).items():
        covered = covered_modules(*roots, package_dir=package_dir)
        names = ", ".join(name.removeprefix(f"{package_dir.name}.") for name in covered)
        lines.append(f"| {rule} | {len(covered)} | {names} |")
    return "\n".join(lines)
