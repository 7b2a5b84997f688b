"""The settings every credit method shares, declared once: ``SharedCreditOptions`` (which method, its extra options,
the answer's span and alignment, when GRAIL-family weights are recomputed), which the trainer's ``GrailGRPOConfig``
inherits beside TRL's fields; and ``OfflineSettings``, what a method reads of the trainer's arguments when the
offline tools (the token viewer, the credit placement) build it without TRL: the shared options, the saliency
temperature, the seed of its noise and the rows per forward and backward.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from pipeline.core.declared import Range
from pipeline.core.io import InputError
from pipeline.credit.spans import AnswerAlignment, AnswerSpan

Recompute = Literal["every_step", "per_generation"]


@dataclass
class SharedCreditOptions:
    """The options every credit method shares (config keys of a method section, beside the method's own)."""

    credit: str = field(
        default="grpo",
        metadata={"help": "Token credit: a method of pipeline/credit/methods/ by name, or a module's import path."},
    )
    credit_options: dict[str, Any] = field(
        default_factory=dict,
        metadata={"help": "Options of a method that are not config fields (an out-of-tree method's), by name."},
    )
    answer_span: AnswerSpan = field(
        default="first", metadata={"help": "Which complete \\boxed{} is the answer: 'first' (upstream) or 'last'."}
    )
    answer_alignment: AnswerAlignment = field(
        default="exact",
        metadata={"help": "Answer tokens: 'exact' character cover, or 'upstream' re-encode-and-count (spec 1.3)."},
    )
    grail_recompute: Recompute = field(
        default="every_step",
        metadata={"help": "'every_step' (upstream: current policy, every micro-step) or 'per_generation'."},
    )


def declared_value_problems(instance: Any) -> list[tuple[str, str]]:
    """``(field, problem)`` for every field of the dataclass ``instance`` whose value is outside its ``Literal``
    annotation or its ``metadata["range"]``."""
    hints = typing.get_type_hints(type(instance))
    problems = []
    for option in dataclasses.fields(instance):
        value = getattr(instance, option.name)
        if typing.get_origin(hints[option.name]) is Literal and value not in (
            allowed := typing.get_args(hints[option.name])
        ):
            problems.append((option.name, f"must be one of {list(allowed)}, got {value!r}"))
        elif "range" in option.metadata and (problem := option.metadata["range"].problem(value)):
            problems.append((option.name, f"{problem}, got {value!r}"))
    return problems


@dataclass
class OfflineSettings(SharedCreditOptions):
    """A ``CreditMethod``'s ``args`` outside training (``pipeline.credit.method.OfflineHost``): the shared options
    and the few trainer settings a method reads, here the offline tool's own."""

    temperature: float = field(
        default=1.0, metadata={"help": "the saliency's temperature", "range": Range(exclusive_minimum=0)}
    )
    seed: int = field(default=0, metadata={"help": "seeds a method's noise (OAR-G)"})
    per_device_train_batch_size: int = field(
        default=16, metadata={"help": "rows per forward and backward of a method", "range": Range(minimum=1)}
    )

    def __post_init__(self) -> None:
        if problems := declared_value_problems(self):
            name, problem = problems[0]
            raise InputError(f"{name} {problem}")
