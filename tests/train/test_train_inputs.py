"""Bad inputs to ``pipeline.train``: each is refused before training with an error naming what is wrong."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from train_support import TRAINING_SPEC, training_rows
from transformers import BertConfig, BertModel

from pipeline.core.io import InputError, run_cli
from pipeline.core.specs import annotation_accepts
from pipeline.models.tiny_model import build_tokenizer
from pipeline.train import main
from pipeline.training.grpo_config import config_field_types, merge_specs


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rows") / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in training_rows(4, seed=0)), encoding="utf-8")
    return path


def argv(
    model: Path | str, data: Path, out: Path, training: dict | None = None, method: dict | None = None, *extra: str
) -> list[str]:
    return [
        "--model", str(model), "--training-spec", json.dumps(TRAINING_SPEC if training is None else training),
        "--method-spec", json.dumps(method or {}), "--data", str(data), "--seed", "0", "--out", str(out), *extra,
    ]  # fmt: skip


def refused(arguments: list[str]) -> str:
    with pytest.raises(InputError) as error:
        main(arguments)
    return str(error.value)


def test_unknown_method_key_exits_2_naming_key_and_spec(untrained_model, rows_file, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, argv(untrained_model, rows_file, tmp_path / "run", method={"grail_stdd": 0.5}))
    assert exit_info.value.code == 2
    message = capsys.readouterr().err
    assert "method spec: unknown key 'grail_stdd'" in message
    assert not (tmp_path / "run").exists()


def test_unknown_training_key_named(untrained_model, rows_file, tmp_path):
    message = refused(
        argv(untrained_model, rows_file, tmp_path / "run", {**TRAINING_SPEC, "overwrite_output_dir": True})
    )
    assert message.startswith("training spec: unknown key 'overwrite_output_dir'")


@pytest.mark.parametrize(
    "key", ["output_dir", "seed", "save_only_model", "resume_from_checkpoint", "report_to", "logging_nan_inf_filter"]
)
def test_reserved_key_refused(untrained_model, rows_file, tmp_path, key):
    message = refused(argv(untrained_model, rows_file, tmp_path / "run", method={key: True}))
    assert message.startswith(f"method spec: key '{key}' may not be set")


def test_bad_config_value_refused(untrained_model, rows_file, tmp_path):
    message = refused(argv(untrained_model, rows_file, tmp_path / "run", method={"credit": "nope"}))
    # The registry (pipeline.credit.method) refuses it while the config is built, before any model is loaded.
    assert message.startswith("training/method spec: credit must be one of ['answer_only', 'grail', ")
    assert message.endswith("cannot import 'nope': No module named 'nope'")


def test_trust_remote_code_must_be_boolean(untrained_model, rows_file, tmp_path):
    message = refused(argv(untrained_model, rows_file, tmp_path / "run", method={"trust_remote_code": "yes"}))
    assert message == "method spec: key 'trust_remote_code' must be bool, got str 'yes'"


@pytest.mark.parametrize(
    ("training", "method", "message"),
    [
        ({"max_steps": "two"}, {}, "training spec: key 'max_steps' must be int, got str 'two'"),
        ({}, {"max_steps": 2.5}, "method spec: key 'max_steps' must be int, got float 2.5"),
        ({}, {"max_steps": True}, "method spec: key 'max_steps' must be int, got bool True"),
        ({"learning_rate": "1e-6"}, {}, "training spec: key 'learning_rate' must be float, got str '1e-6'"),
        ({}, {"grail_std": "0.5"}, "method spec: key 'grail_std' must be float, got str '0.5'"),
        ({}, {"bf16": [True]}, "method spec: key 'bf16' must be bool | None, got list [True]"),
        ({}, {"credit": None}, "method spec: key 'credit' must be str, got NoneType None"),
        ({}, {"reward_weights": ["1"]}, "method spec: key 'reward_weights' must be list[float] | None, got list ['1']"),
        ({}, {"dtype": 16}, "method spec: key 'dtype' must be str, got int 16"),
    ],
)
def test_mistyped_spec_value_refused_naming_key_type_and_value(
    untrained_model, rows_file, tmp_path, training, method, message
):
    arguments = argv(untrained_model, rows_file, tmp_path / "run", {**TRAINING_SPEC, **training}, method)
    assert refused(arguments) == message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("learning_rate", 1),  # an int for a float
        ("max_completion_length", None),  # None for an optional int
        ("scale_rewards", False),  # TRL's widening of a str field
        ("lr_scheduler_type", "cosine"),  # an enum's value
        ("lr_scheduler_kwargs", {"num_cycles": 0.5}),
        ("fsdp", True),  # transformers' widening of a str field
    ],
)
def test_well_typed_values_fit_their_field(key, value):
    assert annotation_accepts(config_field_types()[key], value)


@given(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=3)))
def test_a_union_accepts_exactly_what_a_member_accepts(value):
    members = (int, float, bool, str, type(None))
    for first, second in itertools.combinations(members, 2):
        union = first | second
        assert annotation_accepts(union, value) == (
            annotation_accepts(first, value) or annotation_accepts(second, value)
        )
    assert [member for member in members if annotation_accepts(member, value)] == {
        type(None): [type(None)], bool: [bool], int: [int, float], float: [float], str: [str]
    }[type(value)]  # fmt: skip


def test_spec_must_be_a_mapping(untrained_model, rows_file, tmp_path):
    arguments = argv(untrained_model, rows_file, tmp_path / "run")
    arguments[arguments.index("--method-spec") + 1] = "[1, 2]"
    assert refused(arguments) == "method spec: expected a mapping of option names to values, got list"


def test_export_step_beyond_max_steps_refused(untrained_model, rows_file, tmp_path):
    message = refused([*argv(untrained_model, rows_file, tmp_path / "run"), "--export-steps", "2", "5"])
    assert message == "--export-steps: step 5 is outside 1..max_steps (4)"


def test_row_missing_prompt_names_file_and_line(untrained_model, tmp_path):
    rows = training_rows(3, seed=0)
    del rows[1]["prompt"]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    assert refused(argv(untrained_model, data, tmp_path / "run")) == f"{data}:2: field 'prompt' missing"


def test_row_line_number_counts_blank_lines(untrained_model, tmp_path):
    rows = training_rows(2, seed=0)
    rows[1]["solution"] = 7
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n", encoding="utf-8")
    assert refused(argv(untrained_model, data, tmp_path / "run")) == (
        f"{data}:3: field 'solution' must be a str, got int"
    )


@pytest.mark.parametrize("solution", ["", "  \n"])
def test_row_with_empty_solution_refused(untrained_model, tmp_path, solution):
    rows = training_rows(3, seed=0)
    rows[2]["solution"] = solution
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    assert refused(argv(untrained_model, data, tmp_path / "run")) == (
        f"{data}:3: field 'solution' is empty (prepare_data skips such rows: this file is not its output)"
    )


def test_row_with_malformed_messages_refused(untrained_model, tmp_path):
    row = {**training_rows(1, seed=0)[0], "prompt": [{"role": "user"}]}
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps(row) + "\n", encoding="utf-8")
    message = refused(argv(untrained_model, data, tmp_path / "run"))
    assert message.startswith(f"{data}:1: field 'prompt' must be a non-empty list")


def test_invalid_json_row_names_file_and_line(untrained_model, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps(training_rows(1, seed=0)[0]) + "\n{not json\n", encoding="utf-8")
    assert refused(argv(untrained_model, data, tmp_path / "run")).startswith(f"{data}:2: not valid JSON")


def test_missing_data_file(untrained_model, tmp_path):
    data = tmp_path / "absent.jsonl"
    assert refused(argv(untrained_model, data, tmp_path / "run")) == f"{data}: file not found"


def test_missing_model_path(rows_file, tmp_path):
    model = tmp_path / "no" / "such-model"
    assert refused(argv(model, rows_file, tmp_path / "run")) == f"{model}: model directory not found"


def test_model_that_is_not_a_causal_lm(rows_file, tmp_path):
    model_dir = tmp_path / "bert"
    config = BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32)  # fmt: skip
    BertModel(config).save_pretrained(model_dir)
    build_tokenizer().save_pretrained(model_dir)  # a chat template, so only the model is wrong
    assert refused(argv(model_dir, rows_file, tmp_path / "run")) == (
        f"{model_dir}: not a causal language model (BertModel)"
    )


def test_tokenizer_without_chat_template(untrained_model, rows_file, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(untrained_model, model_dir)
    (model_dir / "chat_template.jinja").unlink(missing_ok=True)
    tokenizer_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template", None)
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    assert refused(argv(model_dir, rows_file, tmp_path / "run")) == (
        f"{model_dir}: the tokenizer has no chat template (every stage prompts through it)"
    )


def test_merge_specs_method_wins_and_remembers_origin():
    merged, origin = merge_specs({"learning_rate": 1.0, "max_steps": 3}, {"learning_rate": 2.0})
    assert merged == {"learning_rate": 2.0, "max_steps": 3}
    assert origin == {"learning_rate": "method spec", "max_steps": "training spec"}
