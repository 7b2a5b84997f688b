"""Secrets and trust: credentials from the environment never reach an output, models run no remote code unless
their spec asks, and no config value reaches a shell command unquoted.

The whole small study (prepare_benchmarks, prepare_data, warmup, train, evaluate, aggregate, significance, report)
runs under the real `snakemake` with fake HF_TOKEN / WANDB_API_KEY / AWS_SECRET_ACCESS_KEY set, with both trackers
on (TensorBoard, and W&B offline with its config and cache directories in the working directory), and with a
``results_dir`` full of shell metacharacters; then every file in the working directory (outputs, logs, tracker
files, benchmark files, Snakemake's own records) is searched for the fake values.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from fault_support import REPO, small_study, snakemake_command, stage_env, write_study

from pipeline.core.io import InputError
from pipeline.evaluation import eval_spec, vllm_backend
from pipeline.models.loading import load_model, load_tokenizer
from pipeline.training import grpo_config

FAKE_SECRETS = {
    "HF_TOKEN": "hf_FAKEtokenDoNotLeak0123456789",
    "WANDB_API_KEY": "wandbFAKEkey0123456789abcdef0123456789ab",
    "AWS_SECRET_ACCESS_KEY": "awsFAKEsecret/0123456789+abcdefghijklmnopq",
}
HOSTILE_RESULTS_DIR = "res $(touch PWNED) `touch PWNED2`;x"


@pytest.mark.slow
def test_no_secret_reaches_any_output_and_hostile_paths_stay_quoted(tmp_path: Path) -> None:
    config = small_study()
    config["results_dir"] = HOSTILE_RESULTS_DIR
    config["training"].update(max_steps=2)
    config["evaluation"].update(checkpoints=["final"], batch_size=8)
    config["tracking"] = {"report_to": ["tensorboard", "wandb"], "study": "secrets"}
    write_study(tmp_path, config)
    wandb_dirs = {name: str(tmp_path / "wandb_home" / name) for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR")}
    process = subprocess.run(
        snakemake_command(tmp_path),
        cwd=tmp_path,
        env=stage_env(**FAKE_SECRETS, WANDB_MODE="offline", **wandb_dirs),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert process.returncode == 0, process.stdout[-5000:] + process.stderr[-5000:]
    results = tmp_path / HOSTILE_RESULTS_DIR
    assert (results / "report.md").is_file()
    assert not list(tmp_path.rglob("PWNED*")) and not list(REPO.glob("PWNED*"))  # no command substitution ran
    assert list((results / "tracking" / "tensorboard" / "tiny" / "grpo" / "seed0").glob("events.out.tfevents.*"))
    assert list((results / "tracking" / "wandb").glob("offline-run-*/run-*.wandb"))

    written = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert len(written) > 30
    leaks = [
        f"{path}: {name}"
        for path in written
        for name, value in FAKE_SECRETS.items()
        if value.encode() in path.read_bytes()
    ]
    leaks += [
        f"snakemake output: {name}" for name, value in FAKE_SECRETS.items() if value in process.stdout + process.stderr
    ]
    assert leaks == []


def test_models_are_loaded_without_remote_code(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What the training and evaluation stages pass to transformers and vLLM: trust_remote_code is never true
    unless the model's training spec sets it."""
    calls: list[dict] = []

    def record(*_args, **kwargs):
        calls.append(kwargs)
        raise OSError("recorded")

    for name in ("AutoTokenizer", "AutoModelForCausalLM", "AutoConfig"):
        monkeypatch.setattr(f"transformers.{name}.from_pretrained", record)
    loaders = [
        lambda: load_tokenizer(str(tmp_path)),
        lambda: load_model(str(tmp_path)),
    ]
    for load in loaders:
        with pytest.raises(InputError):
            load()
    assert len(calls) == len(loaders) and all(call.get("trust_remote_code", False) is False for call in calls)
    assert vllm_backend.vllm_engine_kwargs("m", eval_spec.EvalSpec(), 0, "cpu")["trust_remote_code"] is False
    _, loading = grpo_config.split_options({"credit": "grpo"}, {"credit": "method spec"})
    assert loading.get("trust_remote_code", False) is False
    _, loading = grpo_config.split_options({"trust_remote_code": True}, {"trust_remote_code": "training spec"})
    assert loading["trust_remote_code"] is True


UNQUOTED_PARAM = re.compile(r"\{params\.(\w+)\}")
# Params used unquoted in shell commands, and why that is safe (checked below against their definitions):
NUMERIC_PARAMS = {
    "seed",
    "export_steps",
    "resamples",
    "confidence",
    "per_outcome",
    "max_rollouts",
    "batch_size",
}  # integers / numbers by configs/schema.yaml
SHLEX_JOINED_PARAMS = {
    "model",
    "metrics",
    "checkpoints",
    "rollouts",
    "token_viewer",
    "credit_placement",
    "arguments",
    "code_changes",
    "credits",
    "state_flags",
    "calibration",
}  # built with shlex.join: every token already quoted


def test_snakefile_passes_config_values_only_quoted() -> None:
    snakefile = (REPO / "Snakefile").read_text(encoding="utf-8")
    shells = re.findall(r"shell:\n((?:\s+\".*\"\n)+)", snakefile)
    assert len(shells) >= 9
    unquoted = {name for shell in shells for name in UNQUOTED_PARAM.findall(shell)}
    assert unquoted <= NUMERIC_PARAMS | SHLEX_JOINED_PARAMS, unquoted - NUMERIC_PARAMS - SHLEX_JOINED_PARAMS
    # every other config-derived value (input/output/log paths, specs, run dirs) carries :q
    for shell in shells:
        for field in re.findall(r"\{((?:input|output|log|params)[^}]*)\}", shell):
            name = field.split(":")[0].split(".")[-1]
            assert field.endswith(":q") or name in NUMERIC_PARAMS | SHLEX_JOINED_PARAMS, field
    for name in SHLEX_JOINED_PARAMS:
        assert re.search(rf"\n\s+{name}=.*(shlex\.join|_argument|_checkpoints)", snakefile), name
