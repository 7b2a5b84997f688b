"""The warm-up stage: spec parsing, SFT examples and masking, the CLI output, and the accuracy it reaches."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline import warmup
from pipeline.core.io import InputError
from pipeline.evaluation import eval_spec, sampling
from pipeline.models.tiny_model import TinyModelSpec, build_tokenizer
from pipeline.tasks.generation import problem_from_prompt
from pipeline.tasks.prompts import build_prompt
from tests.evaluate.conftest import benchmark_rows, training_rows, write_jsonl


def test_spec_splits_architecture_and_settings():
    model_spec, settings = warmup.parse_warmup_spec({"hidden_size": 64, "head_dim": 16, "steps": 5}, seed=9)
    assert model_spec == TinyModelSpec(hidden_size=64, head_dim=16, seed=9)
    assert settings == warmup.SFTSettings(steps=5)


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"hidden": 64}, "unknown key(s) ['hidden']"),
        ({"seed": 1}, "unknown key(s) ['seed']"),
        ({"steps": 2.5}, "warmup spec.steps: expected int"),
        ({"hidden_size": "128"}, "warmup spec.hidden_size: expected int"),
        ({"learning_rate": 0}, "warmup spec.learning_rate: invalid value 0.0 (must be > 0)"),
        ({"max_length": 1}, "warmup spec.max_length: invalid value 1 (must be >= 2)"),
        ({"num_hidden_layers": 0}, "warmup spec.num_hidden_layers: invalid value 0 (must be >= 1)"),
        ([1, 2], "expected a mapping, got list"),
    ],
)
def test_bad_spec_is_refused_by_key(mapping, message):
    with pytest.raises(InputError) as error:
        warmup.parse_warmup_spec(mapping, seed=0)
    assert message in str(error.value)


@pytest.mark.parametrize("template", ["clean", "upstream", "bare"])
def test_problem_is_recovered_from_either_prompt_template(template):
    prompt = [{"role": "user", "content": build_prompt("3+4=?", template)}]
    assert problem_from_prompt(prompt, "row 1") == "3+4=?"


def test_targets():
    assert warmup.sft_target("3+4=?", "7") == "3+4=7. \\boxed{7}"
    assert warmup.sft_target("3-9=?", "-6") == "3-9=-6. \\boxed{-6}"
    assert warmup.sft_target("What is 2 squared?", "4") == "\\boxed{4}"
    # chains: one worked step per operation, left to right, before the box
    assert warmup.sft_target("3+4+2=?", "9") == "3+4=7. 7+2=9. \\boxed{9}"
    assert warmup.sft_target("2*3*-4=?", "-24") == "2*3=6. 6*-4=-24. \\boxed{-24}"


def test_collate_masks_prompt_and_padding():
    examples = [warmup.Example([1, 2, 3], [4, 5]), warmup.Example([6], [7])]
    batch = warmup.collate(examples, pad_token_id=0)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5], [6, 7, 0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert batch["labels"].tolist() == [[-100, -100, -100, 4, 5], [-100, 7, -100, -100, -100]]


def test_examples_end_with_eos_and_use_the_rows_prompt(tmp_path):
    tokenizer = build_tokenizer()
    content = build_prompt("3+4=?")
    path = write_jsonl(
        tmp_path / "train.jsonl",
        [{"id": "a", "prompt": [{"role": "user", "content": content}], "solution": " 7 ", "source": "generated"}],
    )
    example = warmup.load_examples(path, tokenizer)[0]
    assert tokenizer.decode(example.completion_ids) == "3+4=7. \\boxed{7}<|im_end|>"
    assert tokenizer.decode(example.prompt_ids) == f"<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"id": "a", "prompt": [{"role": "user", "content": "1+1=?"}], "solution": ""}, "row 1: field 'solution'"),
        ({"id": "a", "prompt": [{"role": "user", "content": "1+1=?"}], "solution": 2}, "row 1: field 'solution'"),
        ({"id": "a", "prompt": "1+1=?", "solution": "2"}, "row 1: 'prompt' must be a non-empty list"),
        ({"id": "a", "prompt": [], "solution": "2"}, "row 1: 'prompt' must be a non-empty list"),
    ],
)
def test_bad_training_rows_name_the_row(tmp_path, row, message):
    path = write_jsonl(tmp_path / "train.jsonl", [row])
    with pytest.raises(InputError) as error:
        warmup.load_examples(path, build_tokenizer())
    assert message in str(error.value)


def test_cli_writes_a_loadable_seeded_model(tmp_path):
    data = write_jsonl(tmp_path / "train.jsonl", training_rows(40))
    spec = json.dumps({"steps": 4, "batch_size": 8, "hidden_size": 64, "head_dim": 16, "intermediate_size": 128})
    for name in ("a", "b"):
        warmup.main(["--spec", spec, "--data", str(data), "--seed", "1", "--out", str(tmp_path / name)])
    log = json.loads((tmp_path / "a" / "warmup_log.json").read_text())
    assert log["examples"] == 40 and len(log["losses"]) == 4
    assert log["losses"][-1] < log["losses"][0]
    model_a = AutoModelForCausalLM.from_pretrained(tmp_path / "a")
    model_b = AutoModelForCausalLM.from_pretrained(tmp_path / "b")
    assert model_a.config.hidden_size == 64
    for (name, a), (_, b) in zip(model_a.state_dict().items(), model_b.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert AutoTokenizer.from_pretrained(tmp_path / "a").chat_template
    assert not list(tmp_path.glob(".a.*"))  # no temporary sibling left behind


@pytest.mark.slow
def test_default_warmup_gives_a_sampled_accuracy_strictly_between_0_and_1(tmp_path):
    data = write_jsonl(tmp_path / "train.jsonl", training_rows(2000))
    warmup.main(["--spec", "{}", "--data", str(data), "--seed", "0", "--out", str(tmp_path / "start")])
    held_out = write_jsonl(tmp_path / "held_out.jsonl", benchmark_rows(50, seed=123))
    spec = eval_spec.parse_eval_spec(
        {
            "backend": "hf",
            "n_samples": 2,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": 0,
            "max_new_tokens": 24,
            "batch_size": 100,
        }
    )
    rows = sampling.evaluate(str(tmp_path / "start"), held_out, spec, 0, tmp_path / "eval.jsonl")
    accuracy = sum(row["correct"] for row in rows) / len(rows)
    assert 0.1 < accuracy < 0.9


def test_a_given_model_takes_only_sft_keys():
    model_spec, settings = warmup.parse_warmup_spec({"steps": 3, "max_length": 512}, seed=0, pretrained=True)
    assert model_spec is None and settings == warmup.SFTSettings(steps=3, max_length=512)
    with pytest.raises(InputError) as error:
        warmup.parse_warmup_spec({"steps": 3, "hidden_size": 64}, seed=0, pretrained=True)
    assert "architecture key(s) ['hidden_size']" in str(error.value)


def test_a_rows_worked_solution_is_the_target_and_long_examples_are_left_out(tmp_path):
    tokenizer = build_tokenizer()
    worked = "Half of 8 is 4.\nThe final answer is \\boxed{4}."
    rows = [
        {"id": "a", "prompt": [{"role": "user", "content": "Half of 8?"}], "solution": "4", "worked_solution": worked},
        {"id": "b", "prompt": [{"role": "user", "content": "1+1=?" * 40}], "solution": "2", "source": "generated"},
    ]
    examples = warmup.load_examples(write_jsonl(tmp_path / "train.jsonl", rows), tokenizer)
    assert tokenizer.decode(examples[0].completion_ids) == worked + "<|im_end|>"
    assert warmup.within_length(examples, 100) == examples[:1]
    with pytest.raises(InputError, match="max_length=10 leaves none of the 2 examples"):
        warmup.within_length(examples, 10)
    unboxed = [{**rows[0], "worked_solution": "Half of 8 is 4."}]
    with pytest.raises(InputError, match="row 1: field 'worked_solution' must be a string with a"):
        warmup.load_examples(write_jsonl(tmp_path / "bad.jsonl", unboxed), tokenizer)


@pytest.mark.slow
def test_warmup_of_smollm2_from_its_directory_lowers_the_loss(tmp_path, smol_source_dir):
    """Two SFT steps of the real converted SmolLM2 on the same two GSM-Symbolic rows: the second step's loss is
    lower, and the result is a model directory with the source's tokenizer."""
    from pipeline.prepare_data import prepare_data

    rows, _ = prepare_data({"source": "gsm_symbolic", "gsm_symbolic": {"count": 2, "seed": 0}}, [])
    data = write_jsonl(tmp_path / "train.jsonl", rows)
    spec = json.dumps({"steps": 2, "batch_size": 2, "learning_rate": 1e-4, "max_length": 512})
    out = tmp_path / "start"
    warmup.main(
        ["--model", str(smol_source_dir), "--spec", spec, "--data", str(data), "--seed", "0", "--out", str(out)]
    )
    log = json.loads((out / "warmup_log.json").read_text())
    assert log["model"] == str(smol_source_dir) and log["examples"] == 2 and log["examples_over_max_length"] == 0
    assert log["losses"][1] < log["losses"][0]
    assert AutoTokenizer.from_pretrained(out).eos_token == "<|im_end|>"
    assert AutoModelForCausalLM.from_pretrained(out).num_parameters() == 134_515_008
