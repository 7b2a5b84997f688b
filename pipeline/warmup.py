"""Stage `warmup`: a short SFT on the training rows, so RL starts with reward > 0 — of the tiny model built here
from an architecture, or of a given model directory (``--model``, e.g. a prepared source model).

    python -m pipeline.warmup --spec WARMUP_SPEC --data results/data/train.jsonl --seed S --out results/models/M/start
    python -m pipeline.warmup --model results/models/M/source --spec WARMUP_SPEC --data ... --seed S --out ...

WARMUP_SPEC keys: the SFT settings of ``SFTSettings`` (steps, learning_rate, batch_size, max_length) and, for the
tiny model only, the architecture fields of ``TinyModelSpec`` (hidden_size, intermediate_size, num_hidden_layers,
num_attention_heads, num_key_value_heads, head_dim, max_position_embeddings). The tiny model's random init and the
batch order come from --seed.

Each example is the row's chat prompt (exactly as training renders it) followed by a target completion and eos:
the row's ``worked_solution`` when it has one (GSM-Symbolic rows: the worked steps ending in ``\\boxed{answer}``),
else the worked steps of a generated arithmetic problem, else just the boxed answer. Examples longer than
``max_length`` tokens are left out (cutting one would drop its box and eos); the log counts them. The loss is the
mean token cross-entropy over completion tokens only (prompt and padding labels are -100):

    L = - (1 / |C|) * sum_{t in C} log p(x_t | x_<t),   C = completion positions of the batch (eos included)

optimised with AdamW (gradients clipped to norm 1), the learning rate decaying linearly from ``learning_rate``
to 0 over ``steps``.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.core.declared import Range, refuse_out_of_range, setting
from pipeline.core.disk_full import output_space
from pipeline.core.io import InputError, atomic_path, atomic_write_json, load_spec, read_jsonl, run_cli
from pipeline.core.progress import progress
from pipeline.core.seal import write_seal
from pipeline.core.specs import dataclass_from_mapping
from pipeline.models.loading import load_model, load_tokenizer, working_dtype
from pipeline.models.tiny_model import TinyModelSpec, build_model, build_tokenizer
from pipeline.runtime.disk_space import model_bytes
from pipeline.tasks.arith import is_arithmetic_problem, worked_solution
from pipeline.tasks.boxed import BOX_MARKER
from pipeline.tasks.decisive import is_decisive_problem
from pipeline.tasks.decisive import worked_solution as decisive_worked_solution
from pipeline.tasks.generation import chat_prompt_ids, problem_from_prompt

IGNORE_INDEX = -100
WORKED_SOLUTION_FIELD = "worked_solution"  # optional training-row field: the SFT target (pipeline.tasks.gsm writes it)
MAX_GRAD_NORM = 1.0
ARCHITECTURE_KEYS = frozenset(field.name for field in dataclasses.fields(TinyModelSpec)) - {"seed"}


@dataclass(frozen=True)
class SFTSettings:
    """SFT settings: ``steps`` optimizer steps of ``batch_size`` examples at peak ``learning_rate``; examples over
    ``max_length`` tokens (prompt + completion) are left out (None: no limit).

    The SFT keys of ``models.<name>.warmup``, declared here once: ``python -m tools.schema`` writes them into the
    schema's ``warmup`` entry (without schema defaults: a study's filled-in section stays what it wrote)."""

    steps: int = setting(150, "optimizer steps", Range(minimum=1), schema_default=False)
    learning_rate: float = setting(5e-3, "the peak learning rate", Range(exclusive_minimum=0), schema_default=False)
    batch_size: int = setting(32, "examples a step", Range(minimum=1), schema_default=False)
    max_length: int | None = setting(
        None, "examples longer than this many tokens are left out (null: none)", Range(minimum=2), schema_default=False
    )

    def __post_init__(self) -> None:
        refuse_out_of_range(self, "warmup spec")


@dataclass(frozen=True)
class Example:
    """One tokenized SFT example: the prompt ids and the completion ids (target + eos)."""

    prompt_ids: list[int]
    completion_ids: list[int]


def parse_warmup_spec(mapping: Any, seed: int, pretrained: bool = False) -> tuple[TinyModelSpec | None, SFTSettings]:
    """Split WARMUP_SPEC into the tiny architecture (seeded with ``seed``; None for a ``pretrained`` model, which
    refuses architecture keys) and the SFT settings; unknown keys are refused by name."""
    if mapping is None:
        mapping = {}
    if not isinstance(mapping, dict):
        raise InputError(f"warmup spec: expected a mapping, got {type(mapping).__name__}")
    sft_keys = {field.name for field in dataclasses.fields(SFTSettings)}
    unknown = sorted(set(mapping) - ARCHITECTURE_KEYS - sft_keys)
    if unknown:
        raise InputError(f"warmup spec: unknown key(s) {unknown}; known keys: {sorted(ARCHITECTURE_KEYS | sft_keys)}")
    architecture = {key: value for key, value in mapping.items() if key in ARCHITECTURE_KEYS}
    if pretrained and architecture:
        raise InputError(
            f"warmup spec: architecture key(s) {sorted(architecture)} describe the tiny model built here; "
            f"a given --model takes only the SFT keys {sorted(sft_keys)}"
        )
    settings = dataclass_from_mapping(
        SFTSettings, {key: value for key, value in mapping.items() if key in sft_keys}, "warmup spec"
    )
    if pretrained:
        return None, settings
    return dataclass_from_mapping(TinyModelSpec, {**architecture, "seed": seed}, "warmup spec"), settings


def sft_target(problem: str, answer: str, worked: str | None = None) -> str:
    """The completion to imitate: the row's own worked solution when it has one, else the worked steps of a
    generated arithmetic problem, else just the boxed answer."""
    if worked is not None:
        return worked
    if is_arithmetic_problem(problem):
        return worked_solution(problem, answer)
    if is_decisive_problem(problem):
        return decisive_worked_solution(problem, answer)
    return f"\\boxed{{{answer}}}"


def load_examples(path: str | Path, tokenizer: Any) -> list[Example]:
    """Tokenized SFT examples from training rows (``prompt`` conversational, ``solution`` the gold answer,
    optional ``worked_solution`` the completion to imitate)."""
    rows = read_jsonl(path)
    if not rows:
        raise InputError(f"{path}: no training rows")
    examples = []
    for number, row in enumerate(rows, start=1):
        where = f"{path}: row {number}"
        answer = row.get("solution")
        if not isinstance(answer, str) or not answer.strip():
            raise InputError(f"{where}: field 'solution' must be a non-empty string")
        worked = row.get(WORKED_SOLUTION_FIELD)
        if worked is not None and (not isinstance(worked, str) or BOX_MARKER not in worked):
            raise InputError(f"{where}: field '{WORKED_SOLUTION_FIELD}' must be a string with a \\boxed{{}} answer")
        problem = problem_from_prompt(row.get("prompt"), where)
        target = sft_target(problem, answer.strip(), worked)
        completion = tokenizer(target, add_special_tokens=False)["input_ids"]
        examples.append(
            Example(
                prompt_ids=chat_prompt_ids(tokenizer, row["prompt"][-1]["content"]),
                completion_ids=[*completion, tokenizer.eos_token_id],
            )
        )
    return examples


def within_length(examples: list[Example], max_length: int | None) -> list[Example]:
    """The examples of at most ``max_length`` tokens (all of them when None); none left is an InputError."""
    if max_length is None:
        return examples
    kept = [e for e in examples if len(e.prompt_ids) + len(e.completion_ids) <= max_length]
    if not kept:
        raise InputError(f"warmup spec: max_length={max_length} leaves none of the {len(examples)} examples")
    return kept


def collate(examples: list[Example], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (-100 on prompt and padding)."""
    length = max(len(e.prompt_ids) + len(e.completion_ids) for e in examples)
    input_ids = torch.full((len(examples), length), pad_token_id, dtype=torch.long)
    labels = torch.full((len(examples), length), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), length), dtype=torch.long)
    for row, example in enumerate(examples):
        ids = example.prompt_ids + example.completion_ids
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
        labels[row, len(example.prompt_ids) : len(ids)] = torch.tensor(example.completion_ids)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean next-token cross-entropy over the labelled positions, ``-mean_t log softmax(z_t)[y_{t+1}]``
    (``labels`` -100 where unlabelled), as transformers' causal-LM loss computes it but in the logits' own precision:
    transformers rounds them to float32 first, whose reductions add in a different order on each CPU kernel path and
    so undo what a float64 model holds (pipeline.models.tiny_model.TinyModelSpec.dtype)."""
    targets = torch.nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[:, 1:]
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE_INDEX
    )


def batch_indices(count: int, batch_size: int, steps: int, generator: torch.Generator) -> list[list[int]]:
    """``steps`` batches of example indices: seeded epochs of random permutations, concatenated."""
    needed = steps * batch_size
    epochs = -(-needed // count)
    order = torch.cat([torch.randperm(count, generator=generator) for _ in range(epochs)])[:needed]
    return order.view(steps, batch_size).tolist()


def train_sft(model: Any, examples: list[Example], settings: SFTSettings, seed: int, pad_token_id: int) -> list[float]:
    """Run the SFT loop on ``model`` in place; returns the loss of every step."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / settings.steps)
    model.train()
    losses = []
    bar = progress(
        batch_indices(len(examples), settings.batch_size, settings.steps, generator),
        desc="warmup SFT",
        unit="step",
        total=settings.steps,
    )
    for indices in bar:
        batch = collate([examples[i] for i in indices], pad_token_id)
        labels = batch.pop("labels")
        loss = causal_lm_loss(model(**batch).logits, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    model.eval()
    return losses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, help="WARMUP_SPEC: inline JSON or a JSON/YAML file")
    parser.add_argument("--model", help="warm up this model directory instead of building the tiny model")
    parser.add_argument("--data", required=True, help="training rows (JSONL)")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--out", required=True, help="output model directory (written atomically)")
    args = parser.parse_args(argv)

    model_spec, settings = parse_warmup_spec(load_spec(args.spec), args.seed, pretrained=args.model is not None)
    if model_spec is None:
        tokenizer = load_tokenizer(args.model)
        model = load_model(args.model, dtype=working_dtype(args.model))
    else:
        tokenizer = build_tokenizer()
        model = build_model(model_spec, tokenizer)
    all_examples = load_examples(args.data, tokenizer)
    examples = within_length(all_examples, settings.max_length)
    losses = train_sft(model, examples, settings, args.seed, tokenizer.pad_token_id)
    with output_space(Path(args.out), model_bytes(model), "the warmed-up model"), atomic_path(args.out) as temporary:
        model.save_pretrained(temporary)
        tokenizer.save_pretrained(temporary)
        atomic_write_json(
            temporary / "warmup_log.json",
            {
                **({"model": args.model} if model_spec is None else {"architecture": dataclasses.asdict(model_spec)}),
                "sft": dataclasses.asdict(settings),
                "examples": len(examples),
                "examples_over_max_length": len(all_examples) - len(examples),
                "losses": losses,
            },
        )
        write_seal(temporary)
    print(f"warmup: {settings.steps} steps on {len(examples)} rows, final loss {losses[-1]:.4f} -> {args.out}")


if __name__ == "__main__":
    run_cli(main)
