"""The layer diagram of ARCHITECTURE.md, generated from the code's own imports and the import contracts.

    python -m tools.docs_architecture            # rewrite the diagram in ARCHITECTURE.md
    python -m tools.docs_architecture --check    # exit 1 when the diagram is out of date

The layers are those of the ``layers`` contract in pyproject.toml (``[tool.importlinter]``, which ``lint-imports``
checks in CI); the arrows are the imports between the subpackages as grimp (import-linter's graph builder) reads
them, each labelled with its number of importing modules, and the entry modules as one box; the documentation
tools (``tools/``, the ``tools`` contract's modules) are one box above them, with their arrows into the package.
The picture is a Mermaid flowchart, which GitHub and the documentation site draw.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from collections import Counter
from typing import Any

from pipeline.core.io import atomic_write_text
from pipeline.core.repo import REPO_DIR

PAGE = REPO_DIR / "ARCHITECTURE.md"
BLOCK = re.compile(r"(<!-- layers: generated -->\n)(.*?)(<!-- /layers -->)", re.DOTALL)
ENTRIES = "entries"
TOOLS = "tools"


def contract(contract_id: str) -> dict[str, Any]:
    """The import contract ``contract_id`` of pyproject.toml's ``[tool.importlinter]``."""
    settings = tomllib.loads((REPO_DIR / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    (found,) = [c for c in settings["contracts"] if c["id"] == contract_id]
    return found


def contract_layers() -> list[list[str]]:
    """The ``layers`` contract's layers, top first, each a list of the pipeline's child modules in it."""
    return [[name.strip() for name in re.split(r"[|:]", layer)] for layer in contract("layers")["layers"]]


def tool_names() -> list[str]:
    """The documentation tools (the ``tools`` contract's modules), without the ``tools.`` prefix."""
    return [name.removeprefix(f"{TOOLS}.") for name in contract(TOOLS)["modules"]]


def package_of(module: str, entries: set[str]) -> str | None:
    """The box a module is drawn in: its subpackage, ``ENTRIES`` for an entry module, ``TOOLS`` for a module of the
    tools tree, None for the package itself."""
    parts = module.split(".")
    if parts[0] == TOOLS:
        return TOOLS
    if len(parts) < 2:
        return None
    return ENTRIES if parts[1] in entries else parts[1]


def imports_between(entries: set[str]) -> Counter[tuple[str, str]]:
    """``{(importer box, imported box): importing modules}`` over the package's and the tools' direct imports."""
    import grimp

    graph = grimp.build_graph("pipeline", TOOLS)
    arrows: Counter[tuple[str, str]] = Counter()
    for module in sorted(graph.modules):
        source = package_of(module, entries)
        targets = {package_of(imported, entries) for imported in graph.find_modules_directly_imported_by(module)}
        for target in sorted(t for t in targets if t not in (None, source)):
            if source is not None:
                arrows[(source, target)] += 1
    return arrows


def diagram() -> str:
    """The Mermaid flowchart (module docstring)."""
    layers = contract_layers()
    entries = set(layers[0])
    lines = ["```mermaid", "flowchart TB"]
    lines.append(f'    {TOOLS}["documentation tools ({len(tool_names())}): python -m tools.NAME"]')
    lines.append(f'    {ENTRIES}["entry modules ({len(entries)}): python -m pipeline.NAME"]')
    for number, layer in enumerate(layers[1:], start=2):
        lines.append(f'    subgraph layer{number}["layer {number}"]')
        lines += [f"        {name}" for name in layer]
        lines.append("    end")
    for (source, target), count in sorted(imports_between(entries).items()):
        lines.append(f"    {source} -->|{count}| {target}")
    lines.append("```")
    return "\n".join(lines) + "\n"


def rendered(page: str) -> str:
    """``page`` with its generated block replaced by the current diagram."""
    if not BLOCK.search(page):
        raise SystemExit(f"{PAGE}: no <!-- layers: generated --> ... <!-- /layers --> block")
    return BLOCK.sub(lambda match: match.group(1) + diagram() + match.group(3), page)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.docs_architecture", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when ARCHITECTURE.md's diagram is out of date")
    args = parser.parse_args(argv)
    page = PAGE.read_text(encoding="utf-8")
    current = rendered(page)
    if args.check:
        if current != page:
            print(f"{PAGE.name}: the layer diagram is out of date: rerun python -m tools.docs_architecture")
            sys.exit(1)
        return
    atomic_write_text(PAGE, current)


if __name__ == "__main__":
    main()
