"""Helpers for the training-stage tests: the test training spec, training rows, a short warm-up of the tiny model
(so GRPO gets reward signal), and running ``python -m pipeline.train`` as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.tasks.arith import ArithmeticSpec, arithmetic_problems

REPO_ROOT = Path(__file__).resolve().parents[2]
ZERO2_CONFIG = REPO_ROOT / "configs" / "accelerate" / "zero2.yaml"
# Small enough for seconds per run on two CPU cores; num_iterations 2 makes a generation round span two steps,
# so a checkpoint at an odd step falls inside a round (exercises the saved generation buffer).
TRAINING_SPEC = {
    "max_steps": 4,
    "save_steps": 2,
    "per_device_train_batch_size": 4,
    "num_generations": 4,
    "num_iterations": 2,
    "max_completion_length": 12,
    "logging_steps": 1,
    "learning_rate": 3e-3,
    "bf16": False,
    "gradient_checkpointing": False,
    "dataloader_pin_memory": False,
}


def training_rows(count: int, seed: int) -> list[dict]:
    """Rows in the ARCHITECTURE.md training schema: sums of two bits, so that a briefly warmed-up tiny model is
    right about half the time and most groups of completions have mixed rewards (GRPO gets gradients)."""
    return [
        {
            "id": problem["id"],
            "prompt": [{"role": "user", "content": problem["problem"]}],
            "solution": problem["answer"],
            "source": "arith",
        }
        for problem in arithmetic_problems(ArithmeticSpec(count=count, seed=seed, low=0, high=1))
    ]


def write_one_question_jsonl(path: Path, copies: int) -> Path:
    """``copies`` copies of the training row that asks ``1+1=?``: a data set where only sampling varies."""
    row = next(row for row in training_rows(16, seed=1) if row["prompt"][0]["content"] == "1+1=?")
    path.write_text((json.dumps(row) + "\n") * copies, encoding="utf-8")
    return path


def warm_up(model_dir: Path, steps: int = 30, batch_size: int = 16) -> None:
    """Teacher-forced steps towards the completion "\\boxed{answer}" (loss on completion tokens only)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rows = training_rows(4 * batch_size, seed=99)
    prompts = [tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True) for row in rows]
    texts = [
        f"{prompt}\\boxed{{{row['solution']}}}{tokenizer.eos_token}" for prompt, row in zip(prompts, rows, strict=True)
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    for index, prompt in enumerate(prompts):
        labels[index, : len(tokenizer(prompt)["input_ids"])] = -100
    for step in range(steps):
        chunk = slice((step % 4) * batch_size, (step % 4 + 1) * batch_size)
        loss = model(
            input_ids=batch["input_ids"][chunk], attention_mask=batch["attention_mask"][chunk], labels=labels[chunk]
        ).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(model_dir)


def train_command(
    model: Path | str,
    data: Path,
    out: Path,
    *extra: str,
    training_spec: dict | None = None,
    method_spec: dict | None = None,
    seed: int = 3,
) -> list[str]:
    """The stage's command line with the test training spec (or ``training_spec``)."""
    return [
        sys.executable,
        "-m",
        "pipeline.train",
        "--model",
        str(model),
        "--training-spec",
        json.dumps(TRAINING_SPEC if training_spec is None else training_spec),
        "--method-spec",
        json.dumps(method_spec or {}),
        "--data",
        str(data),
        "--seed",
        str(seed),
        "--out",
        str(out),
        *extra,
    ]


def stage_argv(model: Path, data: Path, out: Path) -> list[str]:
    """The arguments of ``pipeline.train.main`` for an in-process run with the test training spec."""
    return train_command(model, data, out)[3:]  # without "python -m pipeline.train"


def launch_two(train: list[str]) -> list[str]:
    """``python -m pipeline.launch --gpus 2 --nodes 1 -- pipeline.train ...`` for a stage command line."""
    python, _, module, *args = train
    return [python, "-m", "pipeline.launch", "--gpus", "2", "--nodes", "1", "--", module, *args]


def launch_zero2(train: list[str]) -> list[str]:
    """``launch_two`` with the DeepSpeed ZeRO-2 accelerate config (the study's ``training_engine: zero2``)."""
    command = launch_two(train)
    separator = command.index("--")
    return [*command[:separator], "--accelerate-config", str(ZERO2_CONFIG), *command[separator:]]


def launch_node(train: list[str], machine_rank: int, main_port: int) -> list[str]:
    """One machine's launcher of a run on 2 machines x 1 process that rendezvous on localhost through the
    launcher's own arguments (``--main-process-ip``, ``--machine-rank``, ``--main-port``): the node mode."""
    python, _, module, *args = train
    return [
        python, "-m", "pipeline.launch", "--gpus", "1", "--nodes", "2", "--main-process-ip", "127.0.0.1",
        "--machine-rank", str(machine_rank), "--main-port", str(main_port), "--", module, *args,
    ]  # fmt: skip


def subprocess_env(*hooks: dict[str, str]) -> dict[str, str]:
    """The stage's environment, with the entries of each of ``hooks`` (``tests.hold_stage``) added."""
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    for hook in hooks:
        environment.update(hook)
    return environment


def run_train(command: list[str], *hooks: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=REPO_ROOT, env=subprocess_env(*hooks), capture_output=True, text=True, timeout=timeout, check=False
    )
