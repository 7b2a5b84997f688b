"""What a cluster run adds to the DAG: site flags composed with the study's, and the one image path.

No third-party imports: the Snakefile imports this module at parse time, on the login node and in every job.
"""

from __future__ import annotations

import os
import shlex
from urllib.parse import urlsplit

# `containers/build.sh apptainer` writes this file, relative to the repository; configs/schema.yaml's
# `container_image` default names it (tests/clusters/test_image_path.py holds the three together).
SIF_IMAGE = "containers/grail.sif"
SIF_BUILD_COMMAND = "containers/build.sh gpu && containers/build.sh apptainer"
# Apptainer's flag that binds the host's NVIDIA driver and devices into the container.
APPTAINER_GPU_FLAG = "--nv"


def join_flags(*parts: str | None) -> str:
    """The flags of every part in order, each flag once: the study's first, then the site's.

    ``join_flags("--signal=USR1@600", "--exclusive")`` is ``"--signal=USR1@600 --exclusive"``; a flag that a
    later part repeats exactly is kept once (the jobs re-read the same settings, so composing twice is a no-op).
    A site flag that names the same option with another value follows the study's, and sbatch honours the last.
    """
    flags: list[str] = []
    for part in parts:
        for flag in shlex.split(part or ""):
            if flag not in flags:
                flags.append(flag)
    return shlex.join(flags)


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


def with_gpu_flag(apptainer_args: str) -> str:
    """Apptainer's arguments with ``--nv`` added once: GPU jobs see the node's GPUs (a CPU node only warns)."""
    return join_flags(apptainer_args, APPTAINER_GPU_FLAG)
