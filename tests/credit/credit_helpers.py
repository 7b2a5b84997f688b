"""Padding helpers shared by the credit tests (TRL layout: prompts left-padded, completions right-padded)."""

from __future__ import annotations

import torch


def left_pad(rows: list[list[int]], pad: int) -> torch.Tensor:
    width = max(map(len, rows))
    return torch.tensor([[pad] * (width - len(row)) + row for row in rows])


def right_pad(rows: list[list[int]], pad: int) -> torch.Tensor:
    width = max(map(len, rows))
    return torch.tensor([row + [pad] * (width - len(row)) for row in rows])
