"""A study config naming an out-of-tree credit method by import path: its options are checked from its options
dataclass before any job, and its source is part of the train rule's code digest."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.code_digest import source_digest
from pipeline.config import MethodConfig, Study, load_schema
from pipeline.io import InputError

REPO = Path(__file__).resolve().parents[2]


def train_digest(credit: str) -> str:
    """The train rule's code param for a method whose ``credit`` is this (the Snakefile's call)."""
    return source_digest("pipeline.train", "pipeline.launch", MethodConfig("m", {"credit": credit}).credit_module)


def study_config(credit_options: dict) -> dict:
    from pipeline.config import fill_defaults

    config = yaml.safe_load((REPO / "configs" / "default.yaml").read_text())
    config["methods"]["halfway"] = {"credit": "examples.halfway", "credit_options": credit_options}
    return fill_defaults(copy.deepcopy(config))


def test_bad_option_is_refused_naming_method_and_key(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "docs"))
    Study.from_config(study_config({"late_weight": 2.0}))
    with pytest.raises(InputError, match=r"methods\.halfway`: credit halfway: late_weight must be >= 0, got -1\.0"):
        Study.from_config(study_config({"late_weight": -1.0}))


def test_method_source_is_in_its_code_digest(tmp_path, monkeypatch):
    (tmp_path / "mylab").mkdir()
    shutil.copy(REPO / "docs" / "examples" / "halfway.py", tmp_path / "mylab" / "halfway.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = train_digest("mylab.halfway")
    with (tmp_path / "mylab" / "halfway.py").open("a") as file:
        file.write("\n# a comment changes nothing\n")
    assert train_digest("mylab.halfway") == before
    with (tmp_path / "mylab" / "halfway.py").open("a") as file:
        file.write("\nLATE = 1\n")
    assert train_digest("mylab.halfway") != before
    # a built-in method's file too, although no import of pipeline.train leads to it
    assert '"pipeline.credit.methods.answer_only"' in train_digest("answer_only")
    assert '"pipeline.credit.methods.answer_only"' not in train_digest("grpo")
    assert "credit_options" in load_schema()["$defs"]["credit_fields"]["properties"]
