"""Shared helpers of the cluster tests: paths, a command runner that reports its wall time, config loading."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
TINY_WORKFLOW = Path(__file__).resolve().parent / "workflow" / "Snakefile"


def run_command(
    command: list[str], *, cwd: Path, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``command``, print its wall time (pytest -s / the CI log), return stdout+stderr as ``stdout``."""
    start = time.monotonic()
    result = subprocess.run(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
    )
    print(f"[{time.monotonic() - start:6.1f} s] {' '.join(command[:4])} ... (exit {result.returncode})")
    return result


def study(config_path: Path) -> Any:
    """The project's Study for a config file, loaded as the Snakefile loads it (pipeline.study.load)."""
    from pipeline.study.load import load_study

    return load_study([config_path])


# The site-shaped test scheduler's names (scripts/slurm-single-node.sh, SITE=1), one per SITE SETTINGS line of
# profiles/slurm/config.yaml: a line added to that block without a value here fails `site_profile`.
SITE_VALUES = {
    ("slurm-qos",): "grail-gpu",
    ("slurm-reservation",): "grail-resv",
    ("default-resources", "slurm_account"): "grail-lab",
    ("default-resources", "slurm_partition"): "gpu",
    ("set-resources", "train", "gpu_model"): "a100",
    ("set-resources", "train", "constraint"): "gpu80gb",
    ("set-resources", "train", "slurm_extra"): "'--exclusive'",
    ("set-resources", "evaluate", "gpu_model"): "a100",
}


def site_settings(text: str) -> dict[str, Any]:
    """The SITE SETTINGS block of a profile's config.yaml, every line uncommented, as YAML."""
    block = text.split("# SITE SETTINGS", 1)[1].split("\n# ---", 1)[1].split("\n", 1)[1]
    return yaml.safe_load("\n".join(line.removeprefix("# ") for line in block.splitlines() if line.startswith("# ")))


def leaves(tree: dict[str, Any], path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    return {
        key: value
        for name, child in tree.items()
        for key, value in (leaves(child, (*path, name)) if isinstance(child, dict) else {(*path, name): child}).items()
    }


def site_profile(directory: Path, **overrides: Any) -> Path:
    """profiles/slurm with every SITE SETTINGS line uncommented and filled in with the site scheduler's names
    (``overrides``: further profile keys, e.g. ``retries``), written to ``directory``/config.yaml."""
    text = (REPO / "profiles" / "slurm" / "config.yaml").read_text()
    settings = site_settings(text)
    assert set(leaves(settings)) == set(SITE_VALUES), "SITE SETTINGS and SITE_VALUES name different lines"
    for path, value in SITE_VALUES.items():
        node = settings
        for name in path[:-1]:
            node = node[name]
        node[path[-1]] = value
    profile = {**yaml.safe_load(text), **settings, **overrides}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.yaml").write_text(yaml.safe_dump(profile))
    return directory
