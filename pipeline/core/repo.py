"""Where the project's own files are: the package, the checkout (or image tree) around it, its configs and schema.

Defined once here, so that a stage, a command and the Snakefile agree on the schema and configs they read.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]
REPO_DIR = PACKAGE_DIR.parent
CONFIGS_DIR = REPO_DIR / "configs"
SCHEMA_PATH = CONFIGS_DIR / "schema.yaml"
