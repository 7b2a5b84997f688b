"""Which commit a hub reference is in the local Hugging Face cache: the one answer every stage records in its
provenance, the pin command (``pipeline.pin_revisions``) writes into a config and strict studies require.

The cache is huggingface_hub's layout (``HF_HUB_CACHE``, else ``HF_HOME/hub``):
``{models,datasets}--OWNER--NAME/refs/<branch or tag>`` holds the commit a branch pointed at when it was
downloaded, ``snapshots/<commit>/`` that commit's files. A revision that is already a commit is its own answer
once its snapshot is there.

Every job reads the cache the preflight checked: the Snakefile sets ``HF_HOME`` for every job to the study's
``hf_home`` (``job_hf_home``; unset: the controller's own), so a job inside an image finds it too. The image sets
no ``HF_HOME`` of its own: under Apptainer an image's variable takes precedence over the host's of the same name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

COMMIT_PATTERN = re.compile(r"[0-9a-f]{40}")


def is_commit(revision: str) -> bool:
    """Whether ``revision`` is a full hub commit hash (40 lowercase hex digits), not a branch or tag."""
    return COMMIT_PATTERN.fullmatch(revision) is not None


def hf_home(env: Mapping[str, str] = os.environ) -> Path:
    """``HF_HOME`` as huggingface_hub resolves it (``HF_HOME``, else ``XDG_CACHE_HOME/huggingface``, else
    ``~/.cache/huggingface``). Resolved here, not read from its constants: those are fixed when it is first imported,
    and the preflight sets the study's ``HF_HOME`` after that."""
    return Path(env.get("HF_HOME") or Path(env.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface").expanduser()


def hub_cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    """The hub cache huggingface_hub reads: ``HF_HUB_CACHE`` (or its older name), else ``HF_HOME/hub``."""
    configured = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    return Path(configured).expanduser() if configured else hf_home(env) / "hub"


def job_hf_home(study_hf_home: str | None, env: MutableMapping[str, str] = os.environ) -> Path:
    """Set ``HF_HOME`` in ``env`` (this process's, which every job inherits) to the study's ``hf_home``, else to
    the one ``env`` resolves to, as an absolute path: the cache every job reads, in the image or not. The path set."""
    home = Path(study_hf_home).expanduser() if study_hf_home else hf_home(env)
    env["HF_HOME"] = str(home.absolute())
    return home.absolute()


def repo_cache_dir(repo_id: str, repo_type: str) -> Path:
    """The cache folder of one hub repository, named as huggingface_hub names it (``models--OWNER--NAME``)."""
    from huggingface_hub.file_download import repo_folder_name

    return hub_cache_dir() / repo_folder_name(repo_id=repo_id, repo_type=repo_type)


def cached_commit(repo_id: str, repo_type: str, revision: str) -> str | None:
    """The commit that ``revision`` of hub repository ``repo_id`` (``model`` or ``dataset``) is in the local cache:
    the commit in ``refs/<revision>`` for a branch or tag, ``revision`` itself for a commit; None when that
    revision's snapshot is not cached."""
    folder = repo_cache_dir(repo_id, repo_type)
    if is_commit(revision):
        commit: str | None = revision
    else:
        try:
            commit = (folder / "refs" / revision).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            commit = None
    return commit if commit and (folder / "snapshots" / commit).is_dir() else None


def hub_record(repo_id: str, repo_type: str, revision: str) -> dict[str, Any]:
    """What a stage records of a hub reference it loaded: ``{repo_id, repo_type, revision, commit}`` (commit None
    when the cache does not hold it, e.g. a custom ``cache_dir``)."""
    return {
        "repo_id": repo_id,
        "repo_type": repo_type,
        "revision": revision,
        "commit": cached_commit(repo_id, repo_type, revision),
    }


def dataset_commit(hub_id: str, revision: str, cache_dir: str | None) -> str | None:
    """The commit a hub dataset loaded by ``datasets.load_dataset`` was read at: ``cached_commit`` in the hub
    cache, which ``datasets`` downloads hub files into; None for a local dataset directory and for a custom
    ``cache_dir`` (there ``datasets`` keeps its own layout, without the hub's refs)."""
    if cache_dir is not None or Path(hub_id).expanduser().is_dir():
        return None
    return cached_commit(hub_id, "dataset", revision)


def download_command(repo_id: str, repo_type: str, revision: str) -> str:
    """The ``hf download`` command that puts ``revision`` of a hub repository into the cache."""
    kind = " --repo-type dataset" if repo_type == "dataset" else ""
    return f"hf download {repo_id}{kind} --revision {revision}"
