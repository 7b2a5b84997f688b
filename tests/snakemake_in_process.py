"""A Snakemake workflow loaded in the test's own process, as the planner and ``why_rerun`` load one: what that
leaves behind in module globals is what a later in-process vLLM engine start must survive."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.why_rerun import planned_workflow


def load_a_snakemake_workflow(directory: Path) -> None:
    """Build the DAG of a one-rule Snakefile in ``directory`` with Snakemake's API, in this process."""
    snakefile = directory / "Snakefile"
    snakefile.write_text('rule all:\n    output: "done.txt"\n    shell: "touch {output}"\n', encoding="utf-8")
    args = argparse.Namespace(snakefile=str(snakefile), directory=str(directory), config=[], configfile=[])
    with planned_workflow(args):
        pass
