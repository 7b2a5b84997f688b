"""The GPU stack's floor: the oldest NVIDIA driver and GPU architecture the image's CUDA release runs on.

The GPU image's torch is PyPI's 2.13.0, the CUDA 13.0 build (containers/requirements-gpu.txt; CUDA 12 builds of
torch live only on the PyTorch index). CUDA 13.0 needs an NVIDIA driver of the 580 branch or newer (580.65.06 is
its release's minimum on Linux) and compiles for compute capability 7.5 (Turing) and newer: its release notes drop
Maxwell (5.x), Pascal (6.x) and Volta (7.0, 7.2). docs/cluster.md ("The GPU stack's floor") says how to build for
an older site.

The compute-node test job of the preflight runs ``GPU_QUERY`` (``nvidia-smi``'s CSV query: one line a GPU,
``driver_version, compute_cap, name``); ``gpu_stack_problems`` judges its output against the floor.
"""

from __future__ import annotations

from dataclasses import dataclass

IMAGE_CUDA = "13.0"
DRIVER_FLOOR = "580.65.06"
COMPUTE_CAPABILITY_FLOOR = "7.5"
GPU_QUERY = "nvidia-smi --query-gpu=driver_version,compute_cap,name --format=csv,noheader"
FLOOR_TEXT = (
    f"the image's CUDA {IMAGE_CUDA} needs an NVIDIA driver >= {DRIVER_FLOOR} and compute capability >= "
    f"{COMPUTE_CAPABILITY_FLOOR} (Turing or newer; Volta and older are dropped)"
)


@dataclass(frozen=True)
class NodeGpu:
    """One GPU as ``GPU_QUERY`` reports it."""

    driver: str
    compute_capability: str
    name: str


def version_tuple(text: str) -> tuple[int, ...]:
    """``"580.65.06"`` -> ``(580, 65, 6)``; ValueError for anything else."""
    return tuple(int(part) for part in text.strip().split("."))


def parse_gpu_query(text: str) -> list[NodeGpu]:
    """The GPUs of ``GPU_QUERY``'s output (``580.95.05, 9.0, NVIDIA H100 80GB HBM3``, one line each); ValueError
    naming the line that is not such a row (nvidia-smi's own error message, for one)."""
    gpus = []
    for line in filter(str.strip, text.splitlines()):
        fields = [field.strip() for field in line.split(",", 2)]
        if len(fields) != 3:
            raise ValueError(f"not a GPU row: {line.strip()!r}")
        version_tuple(fields[0]), version_tuple(fields[1])  # both numeric, or ValueError
        gpus.append(NodeGpu(*fields))
    return gpus


def gpu_stack_problems(gpus: list[NodeGpu]) -> list[str]:
    """What keeps the image's CUDA from running on these GPUs: a driver or a compute capability below the floor."""
    problems = []
    for gpu in dict.fromkeys(gpus):
        if version_tuple(gpu.driver) < version_tuple(DRIVER_FLOOR):
            problems.append(f"driver {gpu.driver} is older than {DRIVER_FLOOR}")
        if version_tuple(gpu.compute_capability) < version_tuple(COMPUTE_CAPABILITY_FLOOR):
            problems.append(f"{gpu.name} has compute capability {gpu.compute_capability}")
    return list(dict.fromkeys(problems))


def describe(gpus: list[NodeGpu]) -> str:
    """``4x NVIDIA H100 80GB HBM3 (compute capability 9.0), driver 580.95.05``, one part per distinct GPU."""
    counts: dict[NodeGpu, int] = {}
    for gpu in gpus:
        counts[gpu] = counts.get(gpu, 0) + 1
    return "; ".join(
        f"{count}x {gpu.name} (compute capability {gpu.compute_capability}), driver {gpu.driver}"
        for gpu, count in counts.items()
    )
