"""Free disk space before a checkpoint is saved: a save that cannot fit stops the run with an error naming the path,
the space needed and the space free, instead of a ``torch.save`` traceback that names neither (the message, the free
space and the exit status are every stage's: ``pipeline.core.disk_full``).

The space a checkpoint needs is the size of the newest one on disk (same model, same optimizer: the same size), or,
before the first, the preflight's estimate for the model's parameter count (``first_checkpoint_bytes``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.disk_full import OutputSpaceError

if TYPE_CHECKING:  # the preflight and planning use this module on a login node without torch
    import torch


class CheckpointSaveError(OutputSpaceError):
    """A checkpoint does not fit on the disk, or writing it failed; the message names the path and the free space."""


def directory_bytes(directory: Path) -> int:
    """Total size of the files under ``directory``."""
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


def first_checkpoint_bytes(model: torch.nn.Module, bf16: bool) -> int:
    """The space of a first checkpoint: the preflight's formula (``pipeline.study.cost.checkpoint_bytes``: weights, the
    fp32 master copy of bf16 training, AdamW's two fp32 moments) for the model's parameter count."""
    return checkpoint_bytes(sum(parameter.numel() for parameter in model.parameters()), bf16)


def model_bytes(model: torch.nn.Module) -> int:
    """The bytes of a model's saved weights: every parameter at its element size (tied weights once), the most of
    a model directory (its tokenizer and config files add kilobytes to a few megabytes)."""
    return sum(parameter.numel() * parameter.element_size() for parameter in model.parameters())


def checkpoint_bytes(parameters: int, bf16: bool) -> int:
    """One resumable checkpoint. In bf16 (DeepSpeed ZeRO-2, the paper's engine) 16 bytes a parameter: the weights
    twice, in ``model.safetensors`` (2) and in DeepSpeed's ``mp_rank_00_model_states.pt`` (2), the fp32 master copy
    (4) and AdamW's two fp32 moments (8) in the ``*_optim_states.pt`` partitions. Measured: a ZeRO-2 checkpoint of
    two CPU processes held both weight files (docs/cluster.md, "What the study costs"). Else 12: fp32 weights (4)
    and the two moments (8)."""
    return parameters * ((2 + 2 + 4) if bf16 else 4) + parameters * 8
