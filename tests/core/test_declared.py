"""Settings declared once (pipeline.core.declared): the schema entry of a declared section follows from its
dataclass, configs/schema.yaml holds it current, and a key added to the declaration reaches the schema, the
documentation and the validation of a study with no other edit."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import pytest

from pipeline.core.declared import REQUIRED, Range, refuse_out_of_range, section_schema, setting
from pipeline.core.io import InputError
from pipeline.core.specs import dataclass_from_mapping

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Example:
    """What the example section does, on one line
    when read.

    Implementation notes after the first paragraph stay out of the help."""

    steps: int = setting(8, "how many", Range(minimum=2))
    ratio: float = setting(0.5, "a share", Range(exclusive_minimum=0, maximum=1))
    mode: Literal["fast", "exact"] = setting("exact", "which way")
    path: str | None = setting(None, "where (null: nowhere)")
    enabled: bool = setting(True, "false switches it off")

    def __post_init__(self) -> None:
        refuse_out_of_range(self, "example")


def test_a_sections_schema_follows_from_its_declaration() -> None:
    assert section_schema(Example) == {
        "type": "object",
        "additionalProperties": False,
        "default": {},
        "description": "What the example section does, on one line when read.",
        "properties": {
            "steps": {"type": "integer", "minimum": 2, "default": 8, "description": "how many"},
            "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 0.5, "description": "a share"},
            "mode": {"enum": ["fast", "exact"], "default": "exact", "description": "which way"},
            "path": {"type": ["string", "null"], "default": None, "description": "where (null: nowhere)"},
            "enabled": {"type": "boolean", "default": True, "description": "false switches it off"},
        },
    }


@dataclass(frozen=True)
class OnlySometimes:
    """Read by some studies only."""

    filled_by_default: ClassVar[bool] = False
    seconds: float = setting(30.0, "an integral float default")
    name: str = setting("x", "a name", non_empty=True)


def test_an_integral_float_default_is_written_as_an_integer_and_a_section_may_have_no_default() -> None:
    schema = section_schema(OnlySometimes)
    assert "default" not in schema  # a study that leaves the section out gets no key filled in
    assert schema["properties"]["seconds"]["default"] == 30 and type(schema["properties"]["seconds"]["default"]) is int
    assert schema["properties"]["name"]["minLength"] == 1
    with pytest.raises(InputError, match=r"only\.name: must not be empty"):
        refuse_out_of_range(OnlySometimes(name=""), "only")


@dataclass(frozen=True)
class WithRequired:
    """A section two of whose keys must be given."""

    count: int = setting(REQUIRED, "how many", Range(minimum=1))
    seed: int = setting(REQUIRED, "which draw")
    label: str = setting("x", "a label")


def test_a_required_setting_is_listed_without_a_default_and_refused_by_name_when_missing() -> None:
    schema = section_schema(WithRequired)
    assert schema["required"] == ["count", "seed"]
    assert "default" not in schema  # a section with required keys cannot be filled in empty
    assert "default" not in schema["properties"]["count"] and schema["properties"]["label"]["default"] == "x"
    with pytest.raises(InputError, match=r"^where: missing required key\(s\) \['seed'\]$"):
        dataclass_from_mapping(WithRequired, {"count": 2}, "where")
    assert dataclass_from_mapping(WithRequired, {"count": 2, "seed": 0}, "where") == WithRequired(2, 0)


@pytest.mark.parametrize(("values", "message"), [({"steps": 1}, r"example\.steps: invalid value 1 \(must be >= 2\)"),
                                                 ({"ratio": 0.0}, r"example\.ratio: invalid value 0.0 \(must be > 0\)")])  # fmt: skip
def test_a_value_outside_its_declared_range_is_refused_by_name(values: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        Example(**values)


def test_the_trl_fields_a_study_sets_carry_trls_help_and_a_name_trl_lacks_is_refused(monkeypatch) -> None:
    from tools import schema as schema_tool

    node = schema_tool.grpo_fields()["properties"]
    assert node["learning_rate"] == {
        "type": "number",
        "exclusiveMinimum": 0,
        "description": "The initial learning rate for AdamW.",
    }
    assert node["ddp_timeout"]["description"].startswith("seconds a collective")  # the table's own help wins
    assert schema_tool.first_sentence("Keep, e.g. this. Not this.") == "Keep, e.g. this."
    monkeypatch.setitem(schema_tool.STUDY_TRL_FIELDS, "learning_rat", {"type": "number"})
    with pytest.raises(SystemExit, match=r"GRPOConfig does not have: \['learning_rat'\]"):
        schema_tool.grpo_fields()


def test_the_schemas_declared_entries_are_current() -> None:
    done = subprocess.run([sys.executable, "-m", "tools.schema", "--check"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_required_top_level_setting_is_written_into_the_schemas_required_list() -> None:
    """``seeds`` (StudySettings, ``REQUIRED``): the schema's top-level ``required`` list gets it from the declaration."""
    from tools import schema as schema_tool

    text = (REPO / "configs" / "schema.yaml").read_text(encoding="utf-8")
    stale = text.replace(
        "required: [data, benchmarks, models, methods, seeds]\n", "required: [data, benchmarks, models, methods]\n"
    )
    assert stale != text
    assert schema_tool.rendered(stale) == text


NEW_KEY = """    grace_s: float = setting(30.0, "seconds a new key gives", Range(minimum=0))

    def __post_init__(self) -> None:
        refuse_out_of_range(self, "watchdog")
"""
NEW_CREDIT_OPTION = """    grail_floor: float = field(default=0.0, metadata={"help": "a new GRAIL option", "range": Range(minimum=0)})
"""
# One process for the four validations: each study loaded with one override, its error or the value it holds.
VALIDATE = """
from pipeline.core.io import InputError
from pipeline.study.load import load_study
from pipeline.training.grpo_config import GrailGRPOConfig

def value(overrides, read):
    try:
        return read(load_study(["configs/default.yaml"], overrides, check_inputs=False))
    except InputError as error:
        return str(error)

print(value({"watchdog": {"grace_s": 12.5}}, lambda study: study.runtime.watchdog.grace_s))
print(value({"watchdog": {"grace_s": -1}}, lambda study: study.runtime.watchdog.grace_s).replace("\\n", " "))
print(value({"methods": {"grail": {"credit": "grail", "grail_floor": 0.25}}}, lambda study: study.methods["grail"].spec["grail_floor"]))
print(value({"methods": {"grail": {"credit": "grail", "grail_floor": -1}}}, lambda study: None).replace("\\n", " "))
print(GrailGRPOConfig(output_dir="out", credit="grail", use_cpu=True, bf16=False).grail_floor)
"""


def test_a_key_added_to_a_declaration_reaches_the_schema_the_docs_and_the_validation(tmp_path: Path) -> None:
    """docs/contributing.md's worked example, done on a scratch copy of the repository: one edit each (a field of
    WatchdogConfig, a section; a field of GrailOptions, a credit option every method section takes), then the two
    generators; the schema, docs/parameters.md and a study's validation agree."""
    copy = tmp_path / "repo"
    for part in ("pipeline", "tools", "configs", "docs", "eval_data"):
        shutil.copytree(REPO / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copyfile(REPO / "Snakefile", copy / "Snakefile")  # tools.schema reads the rules that ask resources
    watchdog = copy / "pipeline" / "runtime" / "watchdog.py"
    text = watchdog.read_text(encoding="utf-8")
    declared_end = """
    def __post_init__(self) -> None:
        refuse_out_of_range(self, "watchdog")
"""
    assert declared_end in text
    watchdog.write_text(text.replace(declared_end, "\n" + NEW_KEY, 1), encoding="utf-8")
    grail = copy / "pipeline" / "credit" / "methods" / "grail.py"
    text = grail.read_text(encoding="utf-8")
    first_option = "    grail_mean: float = field("
    assert first_option in text
    grail.write_text(text.replace(first_option, NEW_CREDIT_OPTION + first_option, 1), encoding="utf-8")

    def run(*arguments: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *arguments], cwd=copy, capture_output=True, text=True, env={"PYTHONPATH": str(copy)}
        )

    assert run("-m", "tools.schema", "--check").returncode == 1  # the schema is stale until regenerated
    assert run("-m", "tools.schema").returncode == 0
    assert run("-m", "tools.docs_parameters").returncode == 0
    schema = (copy / "configs" / "schema.yaml").read_text(encoding="utf-8")
    docs = (copy / "docs" / "parameters.md").read_text(encoding="utf-8")
    assert "grace_s: {type: number, minimum: 0, default: 30," in schema
    assert "| `watchdog.grace_s` | number (&gt;= 0) | `30` | seconds a new key gives |" in docs
    assert "grail_floor: {type: number, minimum: 0, description: a new GRAIL option}" in schema
    assert "| `methods.<name>.grail_floor` | number (&gt;= 0) |  | a new GRAIL option |" in docs
    validated = run("-c", VALIDATE)
    assert validated.returncode == 0, validated.stderr[-2000:]
    accepted, refused, accepted_option, refused_option, default = validated.stdout.splitlines()[-5:]
    assert accepted == "12.5" and "watchdog.grace_s" in refused, validated.stdout
    assert accepted_option == "0.25" and "methods.grail.grail_floor" in refused_option, validated.stdout
    assert default == "0.0"
