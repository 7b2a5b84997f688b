"""Code digests: what runs changes them, how it is written does not; imports, parents and extra roots are covered."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pipeline.core.repo import PACKAGE_DIR
from pipeline.core.source_digest import (
    changed_modules,
    coverage_table,
    covered_modules,
    module_digests,
    normalized_source,
    parse_source_digest,
    rule_roots,
    source_digest,
)

REPO = Path(__file__).resolve().parents[2]

SOURCE = '''"""Module docstring."""

import math


class Box:
    """Class docstring."""

    def area(self, side):
        """Method docstring."""
        return side * side  # squared


async def fetch():
    "Async docstring."
    return math.pi
'''


def write_package(root: Path, name: str, files: dict[str, str]) -> Path:
    package = root / name
    for relative, text in files.items():
        (package / relative).parent.mkdir(parents=True, exist_ok=True)
        (package / relative).write_text(text)
    return package


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s.replace("# squared", "# the square"),
        lambda s: s.replace('"""Method docstring."""', '"""Another text,\n\n        over lines."""'),
        lambda s: s.replace('"Async docstring."', '"""Reworded."""'),
        lambda s: s.replace('"""Module docstring."""', '"""Module docstring, edited."""'),
        lambda s: s.replace("side * side", "side  *  side").replace("\n\n\n", "\n\n\n\n"),
    ],
)
def test_comments_docstrings_and_formatting_do_not_change_the_tree(edit) -> None:
    assert normalized_source(edit(SOURCE)) == normalized_source(SOURCE)


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s.replace("side * side", "side * side * 1"),
        lambda s: s.replace("return math.pi", "return math.e"),
        lambda s: s.replace("import math", "import math\nimport os"),
        lambda s: s.replace('"Async docstring."', '"Async docstring."\n    print("a log line")'),
    ],
)
def test_executable_changes_change_the_tree(edit) -> None:
    assert normalized_source(edit(SOURCE)) != normalized_source(SOURCE)


def test_digest_follows_imports_parents_and_ignores_unrelated_modules(tmp_path: Path) -> None:
    package = write_package(
        tmp_path,
        "pkg",
        {
            "__init__.py": "",
            "stage.py": "from pkg.helper import f\n",
            "helper.py": "from pkg import sibling\n\n\ndef f():\n    import pkg.sub.deep\n",
            "sub/__init__.py": "A = 1\n",
            "sub/deep.py": "X = 1\n",
            "sibling.py": "Z = 1\n",
            "other.py": "Y = 1\n",
        },
    )
    assert covered_modules("pkg.stage", package_dir=package) == [
        "pkg",
        "pkg.helper",
        "pkg.sibling",
        "pkg.stage",
        "pkg.sub",
        "pkg.sub.deep",
    ]
    before = source_digest("pkg.stage", package_dir=package)
    (package / "other.py").write_text("Y = 2\n")
    (package / "sibling.py").write_text('"""Now documented."""\n\nZ = 1  # one\n')
    assert source_digest("pkg.stage", package_dir=package) == before
    for path, text, module in [
        ("sibling.py", "Z = 2\n", "pkg.sibling"),  # imported as `from pkg import sibling`
        ("sub/deep.py", "X = 2\n", "pkg.sub.deep"),  # inside a function, two levels down
        ("sub/__init__.py", "A = 2\n", "pkg.sub"),  # run before pkg.sub.deep
    ]:
        old = parse_source_digest(source_digest("pkg.stage", package_dir=package))
        (package / path).write_text(text)
        new = parse_source_digest(source_digest("pkg.stage", package_dir=package))
        assert changed_modules(old, new) == {module: "changed"}
    assert module_digests("pkg.missing", package_dir=package)["pkg.missing"] == "absent"


def test_extra_roots_cover_an_out_of_tree_module_and_its_relative_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = write_package(tmp_path, "pkg", {"__init__.py": "", "stage.py": "X = 1\n", "util.py": "U = 1\n"})
    write_package(
        tmp_path / "site",
        "mylab",
        {
            "__init__.py": "",
            "method.py": "from . import helpers\nfrom pkg.util import U\n",
            "helpers.py": "H = 1\n",
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    covered = covered_modules("pkg.stage", "mylab.method", package_dir=package)
    assert covered == ["mylab", "mylab.helpers", "mylab.method", "pkg", "pkg.stage", "pkg.util"]
    assert "mylab" not in sys.modules  # found, not imported
    before = parse_source_digest(source_digest("pkg.stage", "mylab.method", package_dir=package))
    (tmp_path / "site" / "mylab" / "helpers.py").write_text("H = 2\n")
    after = parse_source_digest(source_digest("pkg.stage", "mylab.method", package_dir=package))
    assert changed_modules(before, after) == {"mylab.helpers": "changed"}


def test_changed_modules_and_parsing() -> None:
    assert changed_modules({"a": "1", "b": "2"}, {"a": "1", "b": "3", "c": "4"}) == {"b": "changed", "c": "added"}
    assert changed_modules({"a": "1"}, {}) == {"a": "removed"}
    assert parse_source_digest("0123abcd") is None
    digests = module_digests("pipeline.core.layout")
    # pipeline/__init__ imports pipeline.core.kernels (the CPU kernel pin), pipeline.core.orphans (with what it
    # imports) and pipeline.core.distributions (with pipeline.core.kept), so every module's digest covers them
    first = ("pipeline", "pipeline.core", "pipeline.core.distributions", "pipeline.core.kept", "pipeline.core.kernels")
    first += ("pipeline.core.orphans", "pipeline.core.locks")
    assert parse_source_digest(source_digest("pipeline.core.layout")) == {
        name: digests[name] for name in (*first, "pipeline.core.exit_codes", "pipeline.core.layout")
    }


def test_docs_list_the_modules_each_rule_covers() -> None:
    """docs/reruns.md holds exactly what ``python -m tools.code_digest`` prints for the Snakefile."""
    page = (REPO / "docs" / "reruns.md").read_text()
    documented = page.split("<!-- coverage: begin -->\n", 1)[1].split("\n<!-- coverage: end -->", 1)[0]
    assert documented == coverage_table(REPO / "Snakefile", PACKAGE_DIR), "rerun: python -m tools.code_digest"
    rules = rule_roots(REPO / "Snakefile")
    assert rules["train"] == ["pipeline.train", "pipeline.launch"] and len(rules) == 13
    assert "pipeline.tasks.grading" not in covered_modules(*rules["prepare_data"])
    assert "pipeline.tasks.grading" not in covered_modules(*rules["warmup"])
