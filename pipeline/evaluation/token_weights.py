"""Stage `token_analysis` (spec 8): where in the reasoning do GRAIL's weights go?

For each evaluated rollout of a checkpoint, GRAIL weights are recomputed with the training core's public
functions (``find_boxed_spans``, ``saliency_scores``, ``grail_weights``). The reasoning span is the completion up
to the first ``\boxed{`` marker, tokens ``[0, R)``; token ``t`` gets the normalized position ``t / max(R - 1, 1)``.
Positions are pooled into 20 equal bins on [0, 1] and summarized per bin (mean, population std, SEM = std/sqrt(n)),
for all rollouts and separately for correct and wrong ones. Beyond upstream, a U-shape index summarizes the profile:

    U = mean(weight in the outer 20 % of bins) - mean(weight in the middle 60 % of bins)

(positive when the start and the end of the reasoning get more weight than its middle).
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from pipeline.core.declared import Range, refuse_out_of_range, setting
from pipeline.core.io import InputError, read_jsonl
from pipeline.core.progress import progress
from pipeline.credit import answer_mask_from_spans, find_boxed_spans, grail_weights, saliency_scores
from pipeline.credit.methods.grail import GrailOptions
from pipeline.credit.saliency import Leaf, Position
from pipeline.models.loading import load_model, load_tokenizer, working_dtype
from pipeline.tasks.prompts import PROMPT_SUFFIX_CLEAN, PromptTemplate, build_prompt

NUM_BINS = 20


METHODS_OWN = "unset: the analysed method's"


@dataclass(frozen=True)
class TokenAnalysisSpec:
    """Settings of the analysis; the defaults are upstream's standalone script (spec 1.10, 8.1). The GRAIL settings
    default to GRAIL's declared ones; a planned study passes the analysed method's (``Study.token_analysis_spec``).

    The stage's keys of the ``token_analysis`` section, declared here once (``pipeline.core.declared``; ``python -m
    tools.schema`` writes them into the schema); the section's other keys plan jobs. The GRAIL settings have no
    schema default, so that a study which leaves them out analyses each method with its own."""

    temperature: float = setting(
        0.6, "the saliency's temperature (upstream's standalone analysis: 0.6)", Range(exclusive_minimum=0)
    )
    grail_mean: float = setting(GrailOptions.grail_mean, METHODS_OWN, schema_default=False)
    grail_std: float = setting(GrailOptions.grail_std, METHODS_OWN, Range(exclusive_minimum=0), schema_default=False)
    grail_w_min: float = setting(GrailOptions.grail_w_min, METHODS_OWN, Range(minimum=0), schema_default=False)
    grail_w_max: float = setting(
        GrailOptions.grail_w_max, METHODS_OWN, Range(exclusive_minimum=0), schema_default=False
    )
    grail_leaf: Leaf = setting(GrailOptions.grail_leaf, METHODS_OWN, schema_default=False)
    grail_position: Position = setting(GrailOptions.grail_position, METHODS_OWN, schema_default=False)
    batch_size: int = setting(8, "rollouts per forward and backward", Range(minimum=1))
    max_rollouts: int | None = setting(
        None, "analyse at most this many rollouts per checkpoint (null: all)", Range(minimum=1)
    )
    prompt_format: Literal["chat", "upstream"] = setting(
        "chat",
        "chat: the prompt the rollouts were generated from (the chat template, prompt_template); upstream: upstream's "
        "analysis prompt without the chat template (spec 8.2)",
    )
    prompt_template: PromptTemplate = setting(
        "clean", "the prompt's wording (prompt_format chat)", shared="prompt_template"
    )
    enable_thinking: bool = setting(False, "passed to the chat template (prompt_format chat)")

    def __post_init__(self) -> None:
        refuse_out_of_range(self, "token_analysis")


@dataclass
class Rollout:
    """One evaluated completion with its prompt text and correctness."""

    prompt_ids: list[int]
    completion_ids: list[int]
    correct: bool


def prompt_ids(tokenizer: Any, problem: str, spec: TokenAnalysisSpec) -> list[int]:
    """Token ids of the prompt a rollout is analysed under."""
    if spec.prompt_format == "upstream":
        return tokenizer(problem + PROMPT_SUFFIX_CLEAN, add_special_tokens=True)["input_ids"]
    messages = [{"role": "user", "content": build_prompt(problem, spec.prompt_template)}]
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=spec.enable_thinking
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def grouped_samples(samples: list[dict[str, Any]], problems: dict[str, str], where: Path) -> dict[str, list[dict]]:
    """The samples by item, in benchmark order; an id not in the benchmark is refused with its line."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for number, sample in enumerate(samples, start=1):
        if sample.get("id") not in problems:
            raise InputError(f"{where}:{number}: id {sample.get('id')!r} is not in the benchmark")
        groups[sample["id"]].append(sample)
    return {item: groups[item] for item in problems if item in groups}


def load_rollouts(tokenizer: Any, samples_path: Path, benchmark_path: Path, spec: TokenAnalysisSpec) -> list[Rollout]:
    """Pair each evaluated sample with its problem; the completion is re-tokenized without special tokens."""
    problems = {row["id"]: row["problem"] for row in read_jsonl(benchmark_path)}
    rollouts = []
    for number, sample in enumerate(read_jsonl(samples_path), start=1):
        if sample.get("id") not in problems:
            raise InputError(f"{samples_path}:{number}: id {sample.get('id')!r} is not in {benchmark_path}")
        completion = tokenizer(sample["completion"], add_special_tokens=False)["input_ids"]
        if completion:
            rollouts.append(Rollout(prompt_ids(tokenizer, problems[sample["id"]], spec), completion, sample["correct"]))
    return rollouts[: spec.max_rollouts] if spec.max_rollouts else rollouts


def collate(rollouts: list[Rollout], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Left-padded prompts followed by right-padded completions: (input_ids, attention_mask, completion ids, mask)."""
    prompt_len = max(len(r.prompt_ids) for r in rollouts)
    completion_len = max(len(r.completion_ids) for r in rollouts)
    input_ids = torch.full((len(rollouts), prompt_len + completion_len), pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    for row, rollout in enumerate(rollouts):
        prompt_start = prompt_len - len(rollout.prompt_ids)
        completion_end = prompt_len + len(rollout.completion_ids)
        input_ids[row, prompt_start:prompt_len] = torch.tensor(rollout.prompt_ids)
        input_ids[row, prompt_len:completion_end] = torch.tensor(rollout.completion_ids)
        attention[row, prompt_start:completion_end] = 1
    return input_ids, attention, input_ids[:, prompt_len:], attention[:, prompt_len:]


def rollout_weights(model: Any, tokenizer: Any, batch: list[Rollout], spec: TokenAnalysisSpec) -> tuple:
    """GRAIL weights, raw scores and first-box spans of one batch (symmetry "both": every row is reweighted)."""
    input_ids, attention, completion_ids, completion_mask = collate(batch, tokenizer.pad_token_id)
    spans = find_boxed_spans(tokenizer, completion_ids, completion_mask, which="first")
    answer_mask = answer_mask_from_spans(spans, completion_ids.shape[1])
    scores = saliency_scores(
        model,
        input_ids,
        attention,
        answer_mask,
        leaf=spec.grail_leaf,
        temperature=spec.temperature,
        position=spec.grail_position,
    )
    rewards = torch.tensor([float(r.correct) for r in batch])
    weights = grail_weights(
        scores,
        completion_mask,
        rewards,
        spans,
        mean=spec.grail_mean,
        std=spec.grail_std,
        w_min=spec.grail_w_min,
        w_max=spec.grail_w_max,
        symmetry="both",
    )
    return weights, scores, spans


def positional_records(batch: list[Rollout], weights: torch.Tensor, scores: torch.Tensor, spans: torch.Tensor):
    """Per reasoning token: (normalized position, weight, raw score, correct); rollouts with R < 2 are skipped."""
    for row, rollout in enumerate(batch):
        reasoning_end = int(spans[row, 0])
        if reasoning_end < 2:
            continue
        positions = np.arange(reasoning_end) / max(reasoning_end - 1, 1)
        yield (
            positions,
            weights[row, :reasoning_end].double().numpy(),
            scores[row, :reasoning_end].double().numpy(),
            rollout.correct,
        )


def bin_statistics(positions: np.ndarray, values: np.ndarray) -> dict[str, list[float]]:
    """Mean, population std, SEM (NaN when n <= 1) and count of ``values`` in 20 equal bins of ``positions``."""
    edges = np.linspace(0.0, 1.0, NUM_BINS + 1)
    bins = np.minimum(np.searchsorted(edges[1:], positions, side="left"), NUM_BINS - 1)
    mean, std, sem, count = [], [], [], []
    for index in range(NUM_BINS):
        selected = values[bins == index]
        n = selected.size
        mean.append(float(selected.mean()) if n else math.nan)
        std.append(float(selected.std()) if n else math.nan)
        sem.append(float(selected.std() / math.sqrt(n)) if n > 1 else math.nan)
        count.append(int(n))
    return {"mean": mean, "std": std, "sem": sem, "count": count}


def u_shape_index(mean_weight: list[float]) -> float:
    """Outer 20 % of bins minus middle 60 % (NaN-aware); positive for a U-shaped profile."""
    profile = np.asarray(mean_weight, dtype=float)
    outer = np.concatenate([profile[: NUM_BINS // 5], profile[-NUM_BINS // 5 :]])
    middle = profile[NUM_BINS // 5 : -NUM_BINS // 5]
    if np.isnan(outer).all() or np.isnan(middle).all():
        return math.nan
    return float(np.nanmean(outer) - np.nanmean(middle))


def summarize(records: list[tuple]) -> dict[str, Any]:
    """Spec 8.1's per-checkpoint summary keys, plus the U-shape index and the number of rollouts used."""
    edges = np.linspace(0.0, 1.0, NUM_BINS + 1)
    summary: dict[str, Any] = {"bin_centres": ((edges[:-1] + edges[1:]) / 2).tolist(), "rollouts": len(records)}
    if not records:
        positions = weights = scores = np.zeros(0)
        correct = np.zeros(0, dtype=bool)
    else:
        positions = np.concatenate([r[0] for r in records])
        weights = np.concatenate([r[1] for r in records])
        scores = np.concatenate([r[2] for r in records])
        correct = np.concatenate([np.full(r[0].size, r[3]) for r in records])
    overall = bin_statistics(positions, weights)
    summary |= {
        "mean_weight": overall["mean"],
        "std_weight": overall["std"],
        "sem_weight": overall["sem"],
        "count": overall["count"],
        "mean_raw_score": bin_statistics(positions, scores)["mean"],
    }
    for label, selector in (("correct", correct), ("wrong", ~correct)):
        group = bin_statistics(positions[selector], weights[selector])
        summary |= {
            f"mean_weight_{label}": group["mean"],
            f"std_weight_{label}": group["std"],
            f"sem_weight_{label}": group["sem"],
            f"count_{label}": group["count"],
        }
    summary["u_shape_index"] = u_shape_index(summary["mean_weight"])
    return summary


def analyse_checkpoint(model_dir: str, samples: Path, benchmark: Path, spec: TokenAnalysisSpec) -> dict[str, Any]:
    """Load one checkpoint, recompute GRAIL weights for its rollouts and summarize them by position."""
    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir, dtype=working_dtype(model_dir)).eval()
    rollouts = load_rollouts(tokenizer, samples, benchmark, spec)
    records: list[tuple] = []
    batches = range(0, len(rollouts), spec.batch_size)
    for start in progress(batches, desc=f"token analysis {Path(model_dir).name}", unit="batch"):
        batch = rollouts[start : start + spec.batch_size]
        weights, scores, spans = rollout_weights(model, tokenizer, batch, spec)
        records.extend(positional_records(batch, weights, scores, spans))
    return summarize(records)


def rollout_batch(rollouts: list[Rollout], advantages: list[float], pad_id: int) -> dict[str, torch.Tensor]:
    """The trainer's batch keys for ``rollouts`` (``collate``'s layout) with their sequence ``advantages``: what a
    credit method reads (``pipeline.credit.method.CreditInputs.batch``)."""
    input_ids, attention, completion_ids, completion_mask = collate(rollouts, pad_id)
    prompt_length = input_ids.size(1) - completion_ids.size(1)
    return {
        "prompt_ids": input_ids[:, :prompt_length],
        "prompt_mask": attention[:, :prompt_length],
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor(advantages, dtype=torch.float32),
    }


def add_checkpoint_arguments(parser: argparse.ArgumentParser, option: str, purpose: str) -> None:
    """``option LABEL MODEL_DIR SAMPLES_JSONL`` (repeatable) and ``--benchmark``: the evaluated checkpoints a stage
    reads (token analysis, token viewer)."""
    parser.add_argument(
        option,
        nargs=3,
        action="append",
        required=True,
        metavar=("LABEL", "MODEL_DIR", "SAMPLES_JSONL"),
        help=f"a checkpoint to {purpose}: its label, its model directory and its evaluation samples",
    )
    parser.add_argument("--benchmark", required=True, type=Path, help="the benchmark JSONL the samples answer")
