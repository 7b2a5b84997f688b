"""The developers' tools: the generators of the documentation (``python -m tools.NAME`` from the repository root).

They read the repository itself (the tests' reference numbers, README.md, docs/, the Snakefile, pyproject.toml), so
they are not part of the installed package: pyproject.toml installs ``pipeline*`` only. They may import the
pipeline; the pipeline never imports them (the ``tools-outside`` import contract, pyproject.toml).
"""
