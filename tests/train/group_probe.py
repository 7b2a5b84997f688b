"""docs/examples/group_contrast.py's method, recording what each call is handed and returns: one file per call and
process, ``call<k>-rank<r>.pt`` under ``$GROUP_PROBE_DIR`` (tests/train/test_group_layouts.py reads them)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch
from examples.group_contrast import GroupContrast

from pipeline.credit.method import CreditResult, GroupInputs


class RecordedGroupContrast(GroupContrast):
    name = "group_probe"
    token_statistics = True  # recorded too: the sampling policy's log-probs and entropies of the gathered batch

    def group_advantages(self, inputs: GroupInputs) -> CreditResult:
        result = super().group_advantages(inputs)
        directory = Path(os.environ["GROUP_PROBE_DIR"])
        directory.mkdir(parents=True, exist_ok=True)
        call = len(list(directory.glob(f"call*-rank{self.args.process_index}.pt")))
        record = {field.name: getattr(inputs, field.name) for field in dataclasses.fields(inputs)}
        record |= {"logps": record["statistics"].logps, "entropies": record.pop("statistics").entropies}
        torch.save(record | {"result": result.advantages}, directory / f"call{call}-rank{self.args.process_index}.pt")
        return result


METHOD = RecordedGroupContrast
