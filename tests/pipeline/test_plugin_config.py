"""A study config naming an out-of-tree credit method by import path: its options are checked from its options
dataclass before any job, and its source is part of the train rule's code digest."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.core.io import InputError
from pipeline.core.source_digest import source_digest
from pipeline.credit.method import credit_method
from pipeline.study.config import Study
from pipeline.study.schema import load_schema
from pipeline.study.sections import MethodConfig

REPO = Path(__file__).resolve().parents[2]


def train_digest(credit: str) -> str:
    """The train rule's code param for a method whose ``credit`` is this (the Snakefile's call)."""
    return source_digest("pipeline.train", "pipeline.launch", MethodConfig("m", {"credit": credit}).credit_module)


def study_config(credit_options: dict, credit: str = "examples.halfway") -> dict:
    from pipeline.study.schema import fill_defaults

    config = yaml.safe_load((REPO / "configs" / "default.yaml").read_text())
    config["methods"]["halfway"] = {"credit": credit, "credit_options": credit_options}
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


def test_a_top_level_module_is_an_import_path(tmp_path, monkeypatch):
    """`credit: late_halfway`, a module that is no package's (docs/credit-methods.md): checked at plan time, in
    the train rule's code digest."""
    shutil.copy(REPO / "docs" / "examples" / "halfway.py", tmp_path / "late_halfway.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    study = Study.from_config(study_config({"late_weight": 2.0}, credit="late_halfway"))
    assert study.methods["halfway"].credit_module == "late_halfway"
    with pytest.raises(InputError, match=r"methods\.halfway`: credit halfway: late_weight must be >= 0"):
        Study.from_config(study_config({"late_weight": -1.0}, credit="late_halfway"))
    before = train_digest("late_halfway")
    with (tmp_path / "late_halfway.py").open("a") as file:
        file.write("\nLATE = 1\n")
    assert train_digest("late_halfway") != before


@pytest.mark.parametrize("credit", ["late_tokens.py", "mylab/late_tokens", "late-tokens", "mylab..late_tokens"])
def test_a_credit_that_is_no_import_path_says_what_one_looks_like(credit):
    with pytest.raises(InputError, match=r"or the import path of a module on the PYTHONPATH \(Python names joined"):
        credit_method(credit)


def test_a_module_that_does_not_import_is_named():
    with pytest.raises(InputError, match=r"cannot import 'no_such_credit_module': No module named"):
        credit_method("no_such_credit_module")
