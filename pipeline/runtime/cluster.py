"""What a cluster run adds to the DAG: site flags composed with the study's, the one image path, and the check that
a job runs the config its controller planned.

Planned config: a cluster job starts Snakemake again, which reads the config files by path (Snakemake 9.27,
snakemake/spawn_jobs.py: ``--configfiles``), so a file edited while the study runs would give later jobs settings
the controller never recorded. The controller puts the content digest of each config file it read in the
environment (``PLANNED_CONFIG_VARIABLE``; the Slurm executor submits with ``--export=ALL``); a job whose files now
differ refuses (exit 2, naming them). A file the job cannot see is not checked (an executor without a shared file
system deploys a copy of the sources made when the study started).

No third-party imports: the Snakefile imports this module at parse time, on the login node and in every job.
"""

from __future__ import annotations

import hashlib
import json
import os
from urllib.parse import urlsplit

# `containers/build.sh apptainer` writes this file, relative to the repository; configs/schema.yaml's
# `container_image` default names it (tests/clusters/test_image_path.py holds the three together).
SIF_IMAGE = "containers/grail.sif"
SIF_BUILD_COMMAND = "containers/build.sh gpu && containers/build.sh apptainer"
PLANNED_CONFIG_VARIABLE = "GRAIL_PLANNED_CONFIG"
# Apptainer's flag that binds the host's NVIDIA driver and devices into the container.
APPTAINER_GPU_FLAG = "--nv"
# Rules whose retry resumes from the last checkpoint (pipeline.training.run_state): their time limit stays the one
# configured, and time windows (pipeline.runtime.time_windows) carry a run longer than one limit.
RESUMING_RULES = ("train",)


def attempt_runtime(rule: str, runtime: int, attempt: int) -> int:
    """The time limit (minutes) of a rule's ``attempt``: ``attempt x runtime``, a resuming rule's ``runtime``
    whatever the attempt, so that a retry never asks past a site's wall (partition MaxTime, QoS MaxWall)."""
    return runtime if rule in RESUMING_RULES else runtime * attempt


def is_local_image(image: str) -> bool:
    """True for an image file path (``containers/grail.sif``); False for ``docker://...``, ``oras://...`` etc."""
    return not urlsplit(image).scheme


def resolve_image(image: str, repository: str) -> str:
    """A relative image file is relative to the repository; URIs (pulled by Apptainer) stay as they are."""
    if is_local_image(image) and not os.path.isabs(image):
        return os.path.join(repository, image)
    return image


def missing_image_error(image: str) -> str | None:
    """The error for `--sdm apptainer` with an image file that does not exist (None when it exists or is a URI)."""
    if not is_local_image(image) or os.path.exists(image):
        return None
    return (
        f"config key `container_image`: the image file {image} does not exist; build it with "
        f"`{SIF_BUILD_COMMAND}` (or set `container_image` to an image you built, e.g. docker://REGISTRY/NAME:TAG-gpu)"
    )


def config_file_digests(paths: list[str]) -> str:
    """The ``PLANNED_CONFIG_VARIABLE`` value: JSON ``{absolute path: SHA-256 of its bytes}`` of each config file."""
    digests = {}
    for path in paths:
        with open(path, "rb") as handle:
            digests[os.path.abspath(path)] = hashlib.sha256(handle.read()).hexdigest()
    return json.dumps(digests, sort_keys=True)


def changed_config_files(planned: str) -> list[str]:
    """The files of a ``config_file_digests`` value whose content differs now (a file not found is skipped)."""
    changed = []
    for path, digest in json.loads(planned).items():
        if os.path.isfile(path) and json.loads(config_file_digests([path]))[path] != digest:
            changed.append(path)
    return changed
