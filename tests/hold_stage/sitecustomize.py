"""Startup hook of ``tests.hold_stage`` (read its docstring): active only in a ``python -m pipeline.train`` or
``python -m pipeline.evaluate`` process whose environment asks for a hold or for the pseudo-random reward."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from typing import Any

CHECKPOINTS_VARIABLE = "GRAIL_TEST_HOLD_AFTER_CHECKPOINTS"
ROWS_VARIABLE = "GRAIL_TEST_HOLD_AFTER_APPENDED_ROWS"
REWARD_VARIABLE = "GRAIL_TEST_PSEUDO_RANDOM_REWARD"
SYNC_OFF_VARIABLE = "GRAIL_TEST_WEIGHT_SYNC_OFF"
STALL_STEP_VARIABLE = "GRAIL_TEST_STALL_TRAINING_STEP"
STALL_BATCH_VARIABLE = "GRAIL_TEST_STALL_EVALUATION_BATCH"
NAN_LOSS_VARIABLE = "GRAIL_TEST_NAN_LOSS"
HOLD_LIMIT_S = 150


def stage_module() -> str | None:
    """The module of ``python -m MODULE``, None for any other command line."""
    arguments = sys.orig_argv
    return arguments[arguments.index("-m") + 1] if "-m" in arguments[:-1] else None


def hold_until(condition: Any, what: str) -> None:
    print(f"test hook: holding {what}", file=sys.stderr, flush=True)
    deadline = time.monotonic() + HOLD_LIMIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"test hook: not signalled within {HOLD_LIMIT_S} s")
        time.sleep(0.02)


def hold_after_checkpoints(steps: frozenset[int]) -> None:
    """After the callbacks' ``on_save`` for a step in ``steps``, wait until the stage recorded a preemption signal
    (``signals.received`` of its preemption callback)."""
    from transformers.trainer_callback import CallbackHandler

    on_save = CallbackHandler.on_save

    def on_save_then_hold(self: CallbackHandler, args: Any, state: Any, control: Any) -> Any:
        control = on_save(self, args, state, control)
        if state.global_step in steps:
            signals = next(callback.signals for callback in self.callbacks if hasattr(callback, "signals"))
            hold_until(lambda: signals.received is not None, f"after checkpoint-{state.global_step} until a signal")
        return control

    CallbackHandler.on_save = on_save_then_hold


def hold_after_appended_rows(count: int) -> None:
    """Once this process has durably appended ``count`` sample rows to its partial file
    (``pipeline.core.io.append_jsonl_whole``), wait to be killed (the evaluation stage has no handler: SIGTERM and
    SIGKILL end it there). When ``count`` falls inside a batch, only that batch's rows up to ``count`` are written,
    without the batch's end line: a kill mid-batch."""
    import pipeline.core.io

    append = pipeline.core.io.append_jsonl_whole
    appended = 0

    def append_then_hold(path: Any, lines: Any) -> None:
        from pipeline.evaluation.sampling import BATCH_END

        nonlocal appended
        lines = list(lines)
        rows = [line for line in lines if BATCH_END not in line]
        before = appended
        if not before < count <= before + len(rows):
            append(path, lines)
            appended += len(rows)
            return
        whole = count == before + len(rows)
        append(path, lines if whole else rows[: count - before])
        where = "" if whole else f" (mid-batch: {count - before} of its {len(rows)} rows, no end line)"
        hold_until(lambda: False, f"after {count} appended rows{where} until killed")

    pipeline.core.io.append_jsonl_whole = append_then_hold


def stall_in_training_step(rank: int, step: int) -> None:
    """Once the callbacks' ``on_step_begin`` of optimizer step ``step`` (1-based) ran on the process of rank
    ``rank``, hold it there, mid-step (the other ranks go on until they wait for it in a collective)."""
    from transformers.trainer_callback import CallbackHandler

    on_step_begin = CallbackHandler.on_step_begin

    def on_step_begin_then_hold(self: CallbackHandler, args: Any, state: Any, control: Any) -> Any:
        control = on_step_begin(self, args, state, control)
        if state.global_step + 1 == step and int(os.environ.get("RANK", "0")) == rank:
            hold_until(lambda: False, f"rank {rank} inside training step {step} until killed")
        return control

    CallbackHandler.on_step_begin = on_step_begin_then_hold


def stall_evaluation_batch(number: int) -> None:
    """Hold the ``number``-th (1-based) call of transformers' ``generate`` (the hf backend's batch) until killed: an
    engine that stops answering."""
    from transformers.generation.utils import GenerationMixin

    generate = GenerationMixin.generate
    calls = 0

    def generate_or_hold(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == number:
            hold_until(lambda: False, f"generation batch {number} until killed")
        return generate(self, *args, **kwargs)

    GenerationMixin.generate = generate_or_hold


def nan_loss_in_training_step(rank: int, step: int) -> None:
    """Every micro-step of optimizer step ``step`` (1-based) returns a NaN loss on the process of rank ``rank`` only
    (the other ranks' losses stay finite; the all-reduced gradient does not)."""
    from pipeline.training.trainer import GrailGRPOTrainer

    compute_loss = GrailGRPOTrainer._compute_loss

    def poisoned(self: Any, model: Any, inputs: Any) -> Any:
        loss = compute_loss(self, model, inputs)
        if self.state.global_step + 1 == step and int(os.environ.get("RANK", "0")) == rank:
            return loss * float("nan")
        return loss

    GrailGRPOTrainer._compute_loss = poisoned


def pseudo_random_reward(salt: str) -> Any:
    """A TRL reward function whose reward is ``sha256(salt, position in the batch, prompt, completion)`` read as a
    number in [0, 1).

    A pure function of the generation batch (a resumed process gives a batch the rewards the uninterrupted one gave
    it) that differs between any two completions of a group, even identical ones (a warmed-up tiny model often
    samples the same short answer several times): every group has mixed rewards, so every step has a gradient,
    which the real reward on a tiny model cannot promise.
    """
    from pipeline.tasks.rewards import completion_text

    def reward(prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
        digests = (
            hashlib.sha256(json.dumps([salt, position, prompt, completion_text(completion)]).encode()).digest()
            for position, (prompt, completion) in enumerate(zip(prompts, completions, strict=True))
        )
        return [int.from_bytes(digest[:8], "big") / 2**64 for digest in digests]

    reward.__name__ = "pseudo_random_reward"  # TRL logs it as rewards/pseudo_random_reward/{mean,std}
    return reward


def replace_training_reward(salt: str) -> None:
    """Make the training stage train on ``pseudo_random_reward(salt)`` instead of the outcome reward (patched
    before ``pipeline.train`` imports it)."""
    import pipeline.tasks.rewards

    pipeline.tasks.rewards.trl_outcome_reward = pseudo_random_reward(salt)


def switch_weight_sync_off() -> None:
    """Make TRL's weight sync to the vLLM engine a no-op: the engine keeps sampling from the start model (the
    colocate weight-sync test's negative control)."""
    from trl.generation.vllm_generation import VLLMGeneration

    VLLMGeneration.sync_weights = lambda self: None


if os.environ.get(SYNC_OFF_VARIABLE) and stage_module() == "pipeline.train":
    switch_weight_sync_off()
if os.environ.get(REWARD_VARIABLE) and stage_module() == "pipeline.train":
    replace_training_reward(os.environ[REWARD_VARIABLE])
if os.environ.get(CHECKPOINTS_VARIABLE) and stage_module() == "pipeline.train":
    hold_after_checkpoints(frozenset(int(step) for step in os.environ[CHECKPOINTS_VARIABLE].split(",")))
if os.environ.get(ROWS_VARIABLE) and stage_module() == "pipeline.evaluate":
    hold_after_appended_rows(int(os.environ[ROWS_VARIABLE]))
if os.environ.get(STALL_STEP_VARIABLE) and stage_module() == "pipeline.train":
    stall_in_training_step(*(int(part) for part in os.environ[STALL_STEP_VARIABLE].split(":")))
if os.environ.get(STALL_BATCH_VARIABLE) and stage_module() == "pipeline.evaluate":
    stall_evaluation_batch(int(os.environ[STALL_BATCH_VARIABLE]))
if os.environ.get(NAN_LOSS_VARIABLE) and stage_module() == "pipeline.train":
    nan_loss_in_training_step(*(int(part) for part in os.environ[NAN_LOSS_VARIABLE].split(":")))
