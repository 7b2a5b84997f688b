"""The architecture of ARCHITECTURE.md, held against the code: the import contracts that `lint-imports` checks (and
that a broken one fails), the entry modules on top, the tools beside the package, the reasons of the long modules,
and the generated diagram."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tools import docs_architecture

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "pipeline"
TOOLS = REPO / "tools"
MODULE_LINES = 500


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the package, the tools and pyproject.toml under ``root`` (its own graph, no cache)."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=root,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)},
        timeout=300,
    )


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("house")
    shutil.copytree(PACKAGE, root / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(TOOLS, root / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def test_the_contracts_hold(package_copy: Path) -> None:
    result = lint_imports(package_copy)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "Contracts: 6 kept, 0 broken." in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("pipeline/report.py", "from pipeline import significance", "No entry module imports another entry module"),
        ("pipeline/core/io.py", "from pipeline.study import config", "the subpackages import only downward"),
        ("pipeline/stats/metrics.py", "from pipeline.training import tracking", "the subpackages import only downward"),
        ("pipeline/tasks/boxed.py", "from pipeline.tasks import rewards", "No import cycles"),
        ("pipeline/core/io.py", "import tools.docs_numbers.summary", "The pipeline never imports the tools"),
    ],
    ids=["entry imports entry", "upward import", "sibling import", "cycle", "pipeline imports tools"],
)
def test_a_broken_contract_fails(package_copy: Path, tmp_path: Path, module: str, line: str, broken: str) -> None:
    root = tmp_path / "house"
    shutil.copytree(package_copy, root)
    with open(root / module, "a", encoding="utf-8") as handle:
        handle.write(f"\n{line}  # noqa\n")
    result = lint_imports(root)
    assert result.returncode != 0, result.stdout[-2000:]
    assert broken in result.stdout.split("Broken contracts")[-1], result.stdout[-3000:]


def test_the_top_level_holds_only_entry_modules() -> None:
    """Every module at the top of the package runs as ``python -m`` and is in the entry-module contracts."""
    settings = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    (independence,) = [c for c in settings["contracts"] if c["id"] == "entries"]
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert sorted(name.removeprefix("pipeline.") for name in independence["modules"]) == top
    assert sorted(docs_architecture.contract_layers()[0]) == top
    for name in top:
        source = (PACKAGE / f"{name}.py").read_text(encoding="utf-8")
        assert 'if __name__ == "__main__":' in source, f"pipeline/{name}.py is not something python -m runs"


def test_the_tools_are_commands_in_their_contract() -> None:
    """Every module or package at the top of tools/ runs as ``python -m tools.NAME`` and is in the ``tools``
    contract (no tool imports another)."""
    modules = [p.stem for p in TOOLS.glob("*.py") if p.name != "__init__.py"]
    top = sorted(modules + [p.name for p in TOOLS.iterdir() if (p / "__init__.py").is_file()])
    assert sorted(docs_architecture.tool_names()) == top
    for name in top:
        main = TOOLS / name / "__main__.py" if (TOOLS / name).is_dir() else TOOLS / f"{name}.py"
        assert 'if __name__ == "__main__":' in main.read_text(encoding="utf-8"), f"tools/{name} is not a command"


def test_no_module_is_over_500_lines() -> None:
    """Every module of the package and of tools/ is at most 500 lines, with no exception: a longer one is split
    into modules of one concern each (issue 55)."""
    long = [
        f"{path.relative_to(REPO)}: {lines} lines"
        for folder in (PACKAGE, TOOLS)
        for path in sorted(folder.rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MODULE_LINES
    ]
    assert not long, f"over {MODULE_LINES} lines:\n" + "\n".join(long)


def test_the_diagram_is_the_code_s() -> None:
    page = docs_architecture.PAGE.read_text(encoding="utf-8")
    assert docs_architecture.rendered(page) == page, "rerun: python -m tools.docs_architecture"
    assert "    study -->|" in page and "    core -->" not in page  # the ground floor imports nothing above it
