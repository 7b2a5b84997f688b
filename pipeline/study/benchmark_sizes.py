"""How many items each benchmark of a study evaluates, known before any job runs: the cost estimate, the planner and
the sizing of evaluation jobs (``pipeline.study.gpu_sizing``) read it.
"""

from __future__ import annotations

from typing import Any

from pipeline.core.repo import REPO_DIR
from pipeline.tasks.benchmarks import SOURCE_FORMATS, read_subset_ids


def benchmark_items(name: str, spec: dict[str, Any]) -> int | None:
    """Items a benchmark evaluates: generated count, subset ids, the source's subset size or its row count."""
    if spec.get("kind") == "generated":
        return int(spec["generated"]["count"])
    ids_file = REPO_DIR / spec["subset_ids_file"] if spec.get("subset_ids_file") else None
    if ids_file is not None and ids_file.is_file():
        return len(read_subset_ids(ids_file))
    local = REPO_DIR / "eval_data" / f"{name}.jsonl"
    if local.exists():
        return sum(1 for _ in local.open())
    source = SOURCE_FORMATS.get(spec.get("kind", ""))
    if source is None:
        return None
    size = spec.get("subset_size", source.subset_size)
    return min(size, source.rows) if size and source.rows else size or source.rows
