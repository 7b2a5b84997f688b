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
from pipeline.credit.oar_g_official import OarGVariant
from pipeline.credit.saliency import Leaf, Position
from pipeline.credit.spans import AnswerAlignment, AnswerSpan
from pipeline.grading import GradingMode
from pipeline.io import InputError
from pipeline.specs import annotation_accepts, annotation_name

Credit = Literal["grpo", "grail", "oar_g"]
Recompute = Literal["every_step", "per_generation"]
Implementation = Literal["fast", "reference"]
RolloutSeed = Literal["run", "rank"]

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
    answer_alignment: AnswerAlignment = field(
        default="exact",
        metadata={"help": "Answer tokens: 'exact' character cover, or 'upstream' re-encode-and-count (spec 1.3)."},
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
    oar_g_variant: OarGVariant = field(
        default="upstream",
        metadata={"help": "'upstream' (GRAIL's OAR-G, the paper's baseline) or 'official' (the OAR paper's code)."},
    )
    vllm_rollout_seed: RolloutSeed = field(
        default="run",
        metadata={
            "help": "Colocate vLLM's sampling seed: 'run' (the run's seed + the rank) or 'rank' (TRL's, upstream: "
            "the rank alone, the same random draws for every seed of a study)."
        },
    )
    reward_grading: GradingMode = field(
        default="clean",
        metadata={"help": "Reward grader: 'clean' (pipeline.grading's fixes) or 'upstream' (plain math-verify)."},
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


# ----------------------------------------------------- the training stage's specs -> config fields

# Model-loading options a spec may set besides the config fields, with their types.
MODEL_LOADING_OPTIONS: dict[str, Any] = {"dtype": str, "trust_remote_code": bool, "attn_implementation": str}
# Config fields this stage owns: a spec that sets them would break the run layout, resume or the exports.
RESERVED_KEYS = {
    "output_dir": "the run directory comes from --out",
    "seed": "the seed comes from --seed",
    "report_to": "trackers come from --tracking (the study config's `tracking` section)",
    "run_name": "the run's name comes from --run-name",
    "save_strategy": "checkpoints are saved every save_steps steps",
    "save_only_model": "resuming needs the optimizer, scheduler and RNG states in every checkpoint",
    "resume_from_checkpoint": "the run resumes from its own newest valid checkpoint",
}


def merge_specs(training_spec: Any, method_spec: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """``{**training_spec, **method_spec}`` and, per key, the name of the spec its value came from."""
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for name, spec in (("training spec", training_spec), ("method spec", method_spec)):
        if spec is None:
            continue
        if not isinstance(spec, dict):
            raise InputError(f"{name}: expected a mapping of option names to values, got {type(spec).__name__}")
        merged.update(spec)
        origin.update(dict.fromkeys(spec, name))
    return merged, origin


def split_options(merged: dict[str, Any], origin: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split merged spec options into (config fields, model-loading options); refuse unknown or reserved keys and
    values whose type does not fit the field's annotation."""
    field_types = config_field_types()
    config_options: dict[str, Any] = {}
    loading_options: dict[str, Any] = {}
    for key, value in merged.items():
        if key in RESERVED_KEYS:
            raise InputError(f"{origin[key]}: key '{key}' may not be set ({RESERVED_KEYS[key]})")
        if key in MODEL_LOADING_OPTIONS:
            expected, options = MODEL_LOADING_OPTIONS[key], loading_options
        elif key in field_types:
            expected, options = field_types[key], config_options
        else:
            raise InputError(f"{origin[key]}: unknown key '{key}' (not a GrailGRPOConfig field or model option)")
        if not annotation_accepts(expected, value):
            raise InputError(
                f"{origin[key]}: key '{key}' must be {annotation_name(expected)}, got {type(value).__name__} {value!r}"
            )
        options[key] = value
    return config_options, loading_options
