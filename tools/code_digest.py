"""Command: which modules each rule's code digest covers, as the Markdown table of docs/reruns.md.

    python -m tools.code_digest > table.md

The digests themselves are ``pipeline.core.source_digest``'s.
"""

from __future__ import annotations

from pipeline.core.repo import REPO_DIR
from pipeline.core.source_digest import coverage_table

if __name__ == "__main__":
    print(coverage_table(REPO_DIR / "Snakefile"))
