"""The study's own input files, checked when the study is planned (``load_study``), before any job runs.

Every config key that names a local file or directory of the user's (configs/schema.yaml):

    benchmarks.NAME.path             a JSONL file in its kind's format: exists, every line a JSON object, ids unique,
                                     at least one usable row (``check_file``: the benchmark stage's own row check)
    benchmarks.NAME.subset_ids_file  when it exists: a list of ids, each in the benchmark's local file
    benchmarks.NAME.hub_id           a hub id, else a local dataset directory that exists
    data.deepmath.hub_id             the same
    models.NAME.path                 a local model directory with a config.json, else a hub id (``name`` or
                                     ``owner/name``) pinned by ``models.NAME.revision``

With ``strict_revisions``, every hub revision (pipeline.study.hub_references) must be a commit, not a branch or
tag; the fix is ``PIN_COMMAND`` after ``hf download``.

Rows a benchmark stage skips (a missing or empty problem or answer: public sources have such rows, and the stage
lists them in its audit) are warned about here, with file and line; they refuse the file only beside a problem.
The files are read line by line, once per plan (the Snakefile checks only in the controller, not in each job).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.core.io import InputError
from pipeline.models.hub_cache import download_command, is_commit
from pipeline.models.loading import looks_like_hub_id
from pipeline.study.config import Study
from pipeline.study.hub_references import hub_references
from pipeline.study.sections import ModelConfig
from pipeline.tasks.benchmarks import SOURCE_FORMATS, check_file, read_subset_ids


def model_problems(model: ModelConfig) -> list[str]:
    """Why ``models.NAME.path`` names neither a model directory (with a config.json) nor a pinned hub id."""
    if model.path is None:
        return []
    key, directory = f"models.{model.name}.path", Path(model.path).expanduser()
    if directory.is_dir():
        if (directory / "config.json").is_file():
            return []
        return [f"{key}: {model.path}: a model directory, but without a config.json"]
    if not looks_like_hub_id(model.path):
        return [f"{key}: {model.path}: no such model directory"]
    if model.revision is None:
        return [
            f"{key}: {model.path}: no such model directory; as a hub id it needs models.{model.name}.revision"
            " (a commit, tag or branch)"
        ]
    return []


def dataset_problems(key: str, hub_id: Any) -> list[str]:
    """Why a ``hub_id`` names neither a hub id's form nor an existing local dataset directory."""
    if hub_id is None or looks_like_hub_id(str(hub_id)) or Path(str(hub_id)).expanduser().is_dir():
        return []
    return [f"{key}: {hub_id}: no such dataset directory (nor a hub id: name or owner/name)"]


def benchmark_problems(name: str, spec: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(problems, warnings) of benchmark ``name``'s local files (module docstring)."""
    problems = dataset_problems(f"benchmarks.{name}.hub_id", spec.get("hub_id"))
    ids_file = Path(spec["subset_ids_file"]) if "subset_ids_file" in spec else None
    recorded = None
    if ids_file is not None and ids_file.is_file():
        try:
            recorded = read_subset_ids(ids_file)
        except InputError as error:
            problems.append(f"benchmarks.{name}.subset_ids_file: {error}")
    if "path" not in spec or spec["kind"] not in SOURCE_FORMATS:
        return problems, []
    key, path = f"benchmarks.{name}.path", str(spec["path"])
    if not Path(path).is_file():
        return [*problems, f"{key}: {path}: file not found"], []
    check = check_file(path, SOURCE_FORMATS[spec["kind"]], spec.get("gold", "clean"))
    skipped = [f"{key}: {path}:{place}: {reason} (the stage skips this row)" for place, _, reason in check.skipped]
    problems += [f"{key}: {message}" for message in check.messages()]
    if not check.items:
        problems.append(f"{key}: {path}: no usable rows")
    if recorded is not None:
        found = {item["id"] for item in check.items}
        if missing := [item for item in recorded if item not in found]:
            problems.append(
                f"benchmarks.{name}.subset_ids_file: {ids_file}: ids not in {path}: {', '.join(missing[:5])}"
            )
    return (problems + skipped, []) if problems else ([], skipped)


PIN_COMMAND = "python -m pipeline.pin_revisions --configfile CONFIG --write"


def revision_problems(study: Study) -> list[str]:
    """Under ``strict_revisions``, every hub reference whose revision is not a 40-hex commit, with its key."""
    if not study.strict_revisions:
        return []
    return [
        f"{reference.key_name}: {reference.repo_id} at {reference.revision!r}: strict_revisions needs a commit, not"
        f" a branch or tag; after `{download_command(reference.repo_id, reference.repo_type, reference.revision)}`"
        f" run `{PIN_COMMAND}`"
        for reference in hub_references(study)
        if not is_commit(reference.revision)
    ]


def input_problems(study: Study) -> tuple[list[str], list[str]]:
    """(problems, warnings) of every local input of the study, each naming its config key, file and line."""
    problems: list[str] = []
    warnings: list[str] = []
    for name, spec in study.benchmarks.items():
        found, warned = benchmark_problems(name, spec)
        problems += found
        warnings += warned
    problems += dataset_problems("data.deepmath.hub_id", study.data.get("deepmath", {}).get("hub_id"))
    for model in study.models.values():
        problems += model_problems(model)
    problems += revision_problems(study)
    return problems, warnings


def check_inputs(study: Study) -> None:
    """One InputError listing every problem of the study's local inputs; the warnings go to stderr."""
    problems, warnings = input_problems(study)
    if problems:
        raise InputError(f"the study's inputs have {len(problems)} problem(s):\n  " + "\n  ".join(problems))
    for warning in warnings:
        print(f"input check: {warning}", file=sys.stderr)
