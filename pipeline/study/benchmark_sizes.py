"""How many items each benchmark of a study evaluates, known before any job runs: the cost estimate, the planner and
the sizing of evaluation jobs (``pipeline.study.gpu_sizing``) read it through ``Study.benchmark_sizes``.

Paths resolve as the Snakefile's do: against the working directory (where Snakemake runs the study), the benchmark
files under the study's ``eval_data_dir``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.tasks.benchmarks import SOURCE_FORMATS, read_subset_ids


def benchmark_items(name: str, spec: dict[str, Any], eval_data_dir: Path) -> int | None:
    """Items a benchmark evaluates: generated count, subset ids, the prepared file's rows (``eval_data_dir``), or
    the source's subset size or row count."""
    if spec.get("kind") == "generated":
        return int(spec["generated"]["count"])
    ids_file = Path(spec["subset_ids_file"]) if spec.get("subset_ids_file") else None
    if ids_file is not None and ids_file.is_file():
        return len(read_subset_ids(ids_file))
    prepared = eval_data_dir / f"{name}.jsonl"
    if prepared.exists():
        with prepared.open(encoding="utf-8") as rows:
            return sum(1 for _ in rows)
    source = SOURCE_FORMATS.get(spec.get("kind", ""))
    if source is None:
        return None
    size = spec.get("subset_size", source.subset_size)
    return min(size, source.rows) if size and source.rows else size or source.rows
