"""``GrailGRPOConfig``: TRL's ``GRPOConfig`` plus the credit-assignment options, each declared once here.

A choice is a ``Literal[...]`` annotation (the credit modules declare the ones their functions take); a numeric
range is the field's ``metadata["range"]``. ``__post_init__`` checks both from these declarations, and
tests/trainer/test_config_drift.py checks that configs/schema.yaml declares the same choices and ranges.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from trl import GRPOConfig

from pipeline.credit.grail import SYMMETRIES, Symmetry
from pipeline.credit.saliency import Leaf, Position
from pipeline.credit.spans import AnswerSpan
from pipeline.io import InputError

Credit = Literal["grpo", "grail", "oar_g"]
Recompute = Literal["every_step", "per_generation"]
Implementation = Literal["fast", "reference"]

# Values the config classes accept beyond their annotations (their __post_init__ converts them): TRL maps
# scale_rewards True/False to "group"/"none"; transformers turns a bool or list of options for fsdp into its config.
ANNOTATION_WIDENINGS: dict[str, Any] = {"scale_rewards": bool, "fsdp": bool | list[str]}


@dataclass(frozen=True)
class Range:
    """An interval of allowed values; ``None`` is unbounded. Exclusive ends are open."""

    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None
    exclusive_maximum: float | None = None

    def problem(self, value: float) -> str | None:
        """Why ``value`` is outside the range (e.g. "must be > 0"), or None when it is inside."""
        bounds = [
            (self.minimum, ">=", lambda b: value >= b),
            (self.exclusive_minimum, ">", lambda b: value > b),
            (self.maximum, "<=", lambda b: value <= b),
            (self.exclusive_maximum, "<", lambda b: value < b),
        ]
        for bound, sign, holds in bounds:
            if bound is not None and not (isinstance(value, int | float) and not math.isnan(value) and holds(bound)):
                return f"must be {sign} {bound}"
        return None


@dataclass
class GrailGRPOConfig(GRPOConfig):
    """``GRPOConfig`` plus the credit-assignment options (defaults: upstream's GRAIL and OAR-G settings)."""

    credit: Credit = field(default="grpo", metadata={"help": "Token credit: 'grpo' (none), 'grail' or 'oar_g'."})
    grail_mean: float = field(default=1.0, metadata={"help": "GRAIL weight for z = 0 (spec 1.6)."})
    grail_std: float = field(
        default=0.5,
        metadata={"help": "GRAIL weight per unit of z (spec 1.6); > 0.", "range": Range(exclusive_minimum=0)},
    )
    grail_w_min: float = field(
        default=0.5, metadata={"help": "Lower clamp of GRAIL weights.", "range": Range(minimum=0)}
    )
    grail_w_max: float = field(
        default=5.0,
        metadata={"help": "Upper clamp, and the boxed-content weight.", "range": Range(exclusive_minimum=0)},
    )
    grail_symmetry: Symmetry = field(
        default="both", metadata={"help": "Rows GRAIL reweights: 'both' (alias 'all'), 'correct' (A > 0), 'wrong'."}
    )
    grail_leaf: Leaf = field(default="embeddings", metadata={"help": "Activation the saliency is taken at (spec 1.2)."})
    grail_position: Position = field(
        default="previous",
        metadata={"help": "'previous': token t scored at input position t-1 (upstream); 'same': at t."},
    )
    answer_span: AnswerSpan = field(
        default="first", metadata={"help": "Which complete \\boxed{} is the answer: 'first' (upstream) or 'last'."}
    )
    grail_recompute: Recompute = field(
        default="every_step",
        metadata={"help": "'every_step' (upstream: current policy, every micro-step) or 'per_generation'."},
    )
    grail_implementation: Implementation = field(
        default="fast", metadata={"help": "'fast' (shares the loss's forward) or 'reference' (separate pass)."}
    )
    oar_g_tau: float = field(
        default=0.4,
        metadata={
            "help": "OAR-G bi-level quantile threshold, in (0, 1).",
            "range": Range(exclusive_minimum=0, exclusive_maximum=1),
        },
    )
    oar_g_beta: float = field(
        default=2.0, metadata={"help": "OAR-G boosting coefficient, >= 0.", "range": Range(minimum=0)}
    )
    oar_g_eps: float = field(
        default=1e-12, metadata={"help": "OAR-G smoothing constant, > 0.", "range": Range(exclusive_minimum=0)}
    )
    oar_g_noise_std: float = field(
        default=1e-3, metadata={"help": "OAR-G embedding noise std, >= 0.", "range": Range(minimum=0)}
    )

    def __post_init__(self) -> None:
        for name, allowed in credit_choices().items():
            if getattr(self, name) not in allowed:
                raise InputError(f"{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")
        for name, allowed in credit_ranges().items():
            if problem := allowed.problem(getattr(self, name)):
                raise InputError(f"{name} {problem}, got {getattr(self, name)!r}")
        if not self.grail_w_max >= self.grail_w_min:
            raise InputError(f"grail_w_max ({self.grail_w_max}) must be >= grail_w_min ({self.grail_w_min})")
        self.grail_symmetry = SYMMETRIES[self.grail_symmetry]  # "all" is the upstream README's "both"
        super().__post_init__()

    def grail_weight_options(self) -> dict[str, float | str]:
        """Keyword arguments of ``pipeline.credit.grail_weights``: mean, std, w_min, w_max, symmetry."""
        names = ("mean", "std", "w_min", "w_max", "symmetry")
        return {name: getattr(self, f"grail_{name}") for name in names}

    def saliency_options(self) -> dict[str, float | str]:
        """Keyword arguments of ``pipeline.credit.saliency_scores``: leaf, temperature (the sampling one), position."""
        return {"leaf": self.grail_leaf, "temperature": self.temperature, "position": self.grail_position}

    def oar_g_options(self) -> dict[str, float]:
        """Keyword arguments of ``pipeline.credit.oar_g_weights``: tau, beta, eps, noise_std."""
        return {name: getattr(self, f"oar_g_{name}") for name in ("tau", "beta", "eps", "noise_std")}


def credit_fields() -> list[dataclasses.Field]:
    """The fields ``GrailGRPOConfig`` adds to ``GRPOConfig``."""
    inherited = {option.name for option in dataclasses.fields(GRPOConfig)}
    return [option for option in dataclasses.fields(GrailGRPOConfig) if option.name not in inherited]


def credit_choices() -> dict[str, tuple[str, ...]]:
    """Allowed values of every ``Literal``-typed credit option, from its annotation."""
    hints = typing.get_type_hints(GrailGRPOConfig)
    return {
        option.name: typing.get_args(hints[option.name])
        for option in credit_fields()
        if typing.get_origin(hints[option.name]) is Literal
    }


def credit_ranges() -> dict[str, Range]:
    """The declared range of every numeric credit option that has one."""
    return {option.name: option.metadata["range"] for option in credit_fields() if "range" in option.metadata}


def config_field_types() -> dict[str, Any]:
    """Accepted type of every constructor argument of ``GrailGRPOConfig``: its annotation (| its widening)."""
    annotations = typing.get_type_hints(GrailGRPOConfig)
    types_by_name = {field.name: annotations[field.name] for field in dataclasses.fields(GrailGRPOConfig) if field.init}
    for name, widening in ANNOTATION_WIDENINGS.items():
        types_by_name[name] = types_by_name[name] | widening
    return types_by_name
