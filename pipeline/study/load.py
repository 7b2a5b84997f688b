"""The one study loader: config files and ``--config`` overrides -> a checked ``Study``.

    study = load_study(["configs/default.yaml"], {"seeds": [0, 1]})

The Snakefile, every stage and command that reads a study, the preflight and the planner call it, so a study is
read one way everywhere:

1. the config files, each updating the ones before it key by key (Snakemake's ``--configfile`` semantics,
   ``snakemake.utils.update_config``);
2. the overrides, the same way, their nested values given the schema's types (``coerce_overrides``: Snakemake
   hands ``--config`` values over as text);
3. the schema check, every bad key named at once; the schema's defaults filled by Snakemake's own validator;
4. the cross-key checks (``Study.from_config``);
5. the study's own input files (``pipeline.study.inputs``: benchmark files, model directories, dataset
   directories), every problem named with its file and line; ``check_inputs=False`` skips them (a cluster job's
   Snakemake re-reads a study that its controller checked).

The result keeps the merged config (``Study.config``), which the report records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.io import InputError, read_yaml
from pipeline.study import inputs
from pipeline.study.config import Study
from pipeline.study.schema import check_config_schema, coerce_overrides, fill_defaults


def read_config_file(path: str | Path) -> dict[str, Any]:
    """One config file's top-level mapping; InputError naming the file otherwise."""
    try:
        with open(path, encoding="utf-8") as handle:
            config = read_yaml(handle)
    except (OSError, yaml.YAMLError) as error:
        raise InputError(f"{path}: cannot read the study config: {error}") from error
    if not isinstance(config, dict):
        raise InputError(f"{path}: the config must be a mapping of top-level keys")
    return config


def load_study(
    config_files: Sequence[str | Path], overrides: Mapping[str, Any] | None = None, *, check_inputs: bool = True
) -> Study:
    """Steps 1-5 of the module docstring; InputError lists every problem of the first step that finds any."""
    from snakemake.utils import update_config

    config: dict[str, Any] = {}
    for path in config_files:
        update_config(config, read_config_file(path))
    if overrides:
        update_config(config, dict(overrides))
        coerce_overrides(config, overrides)
    check_config_schema(config)
    fill_defaults(config)
    study = Study.from_config(config)
    if check_inputs:
        inputs.check_inputs(study)
    return study
