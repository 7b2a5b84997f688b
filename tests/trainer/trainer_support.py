"""Helpers of the trainer tests: training rows, trainer builders, hand-written prepared batches."""

from __future__ import annotations

import random
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from pipeline.tasks.arith import ArithmeticSpec, arithmetic_problems
from pipeline.tasks.generation import chat_prompt_ids
from pipeline.tasks.prompts import build_prompt
from pipeline.training.grpo_config import GrailGRPOConfig
from pipeline.training.trainer import GrailGRPOTrainer


def arithmetic_rows(count: int, seed: int) -> list[dict]:
    """Training rows (conversational prompt + solution) for ``count`` generated problems."""
    return [
        {"prompt": [{"role": "user", "content": build_prompt(row["problem"])}], "solution": row["answer"]}
        for row in arithmetic_problems(ArithmeticSpec(count=count, seed=seed))
    ]


def random_reward(seed: int):
    """A reward function returning seeded random 0/1 values, so that groups are mixed."""
    rng = random.Random(seed)

    def reward(completions: list, **_: object) -> list[float]:
        return [float(rng.random() < 0.5) for _ in completions]

    return reward


COMMON = dict(
    per_device_train_batch_size=8,
    num_generations=8,
    max_completion_length=32,
    learning_rate=1e-3,
    logging_steps=1,
    report_to=[],
    use_cpu=True,
    seed=0,
    gradient_checkpointing=False,
    save_strategy="no",
    disable_tqdm=True,
    beta=0.0,
    loss_type="dr_grpo",
    scale_rewards="none",
)


def make_trainer(
    model_dir: Path, tmp_path: Path, trl_baseline: bool = False, dtype: torch.dtype = torch.float32, **overrides
) -> GRPOTrainer:
    """A GrailGRPOTrainer (or TRL's own GRPOTrainer) on the boxing model and 16 arithmetic prompts."""
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    options = {**COMMON, "output_dir": str(tmp_path / "out"), **overrides}
    config_class, trainer_class = (GRPOConfig, GRPOTrainer) if trl_baseline else (GrailGRPOConfig, GrailGRPOTrainer)
    trainer = trainer_class(
        model=model,
        reward_funcs=[random_reward(0)],
        args=config_class(**options),
        train_dataset=Dataset.from_list(arithmetic_rows(16, seed=2)),
        processing_class=tokenizer,
    )
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train(); compute_loss outside it needs it
    return trainer


def boxed_batch(tokenizer, completions: list[str], advantages: list[float]) -> dict[str, torch.Tensor]:
    """A prepared micro-batch as ``_generate_and_score_completions`` returns it (left-padded prompts, right-padded
    completions ending in eos) for hand-written ``completions``."""
    prompt = chat_prompt_ids(tokenizer, build_prompt("3+4=?"))
    ids = [[*tokenizer(text)["input_ids"], tokenizer.eos_token_id] for text in completions]
    T = max(map(len, ids))
    completion_ids = torch.full((len(ids), T), tokenizer.pad_token_id)
    completion_mask = torch.zeros((len(ids), T), dtype=torch.long)
    for row, row_ids in enumerate(ids):
        completion_ids[row, : len(row_ids)] = torch.tensor(row_ids)
        completion_mask[row, : len(row_ids)] = 1
    return {
        "prompt_ids": torch.tensor([prompt] * len(ids)),
        "prompt_mask": torch.ones((len(ids), len(prompt)), dtype=torch.long),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor(advantages),
        "num_items_in_batch": completion_mask.sum(),
    }


COMPLETIONS = [
    "3+4=7. \\boxed{7}",
    "3+4 is 8, so \\boxed{8} ok",
    "no box here",
    "7 \\boxed{7} and \\boxed{{7}}",
    "3+4=\\boxed{7}",
    "\\boxed{7",
]
