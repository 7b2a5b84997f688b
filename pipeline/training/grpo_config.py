"""``GrailGRPOConfig``: TRL's ``GRPOConfig`` plus the credit-assignment options, each declared once here.

A choice is a ``Literal[...]`` annotation (the credit modules declare the ones their functions take); a numeric
range is the field's ``metadata["range"]``. ``__post_init__`` checks both from these declarations, and
``python -m tools.schema`` writes configs/schema.yaml's ``$defs/credit_fields`` from them (help, choices, ranges).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from trl import GRPOConfig

from pipeline.core.io import InputError
from pipeline.core.specs import annotation_accepts, annotation_name
from pipeline.credit.method import CreditMethod, Range, build_options, built_in_methods, credit_method
from pipeline.credit.methods.grail import GrailOptions
from pipeline.credit.methods.oar_g import OarGOptions
from pipeline.credit.settings import SharedCreditOptions
from pipeline.tasks.grading import GradingMode

RolloutSeed = Literal["run", "rank"]

# Values the config classes accept beyond their annotations (their __post_init__ converts them): TRL maps
# scale_rewards True/False to "group"/"none"; transformers turns a bool or list of options for fsdp into its config.
ANNOTATION_WIDENINGS: dict[str, Any] = {"scale_rewards": bool, "fsdp": bool | list[str]}


@dataclass
class GrailGRPOConfig(SharedCreditOptions, GRPOConfig, GrailOptions, OarGOptions):
    """``GRPOConfig`` plus the credit options: the options every method shares (``SharedCreditOptions``), the
    built-in methods' option dataclasses (``GrailOptions``, ``OarGOptions``), all inherited, and the training's
    own (the rollouts' seed, the reward's grader), declared here."""

    vllm_rollout_seed: RolloutSeed = field(
        default="run",
        metadata={
            "help": "Colocate vLLM's sampling seed: 'run' (the run's seed + the rank) or 'rank' (TRL's, upstream: "
            "the rank alone, the same random draws for every seed of a study)."
        },
    )
    reward_grading: GradingMode = field(
        default="clean",
        metadata={"help": "Reward grader: 'clean' (pipeline.tasks.grading's fixes) or 'upstream' (plain math-verify)."},
    )

    def __post_init__(self) -> None:
        method = credit_method(self.credit)  # refuses an unknown credit by name
        owners = {option.name: method.name for option in fields(method.options)}  # the configured method first
        for other in built_in_methods():
            owners |= {option.name: other.name for option in fields(other.options) if option.name not in owners}
        for name, allowed in credit_choices().items():
            if getattr(self, name) not in allowed:
                where = f"credit {owners[name]}: " if name in owners else ""
                raise InputError(f"{where}{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")
        for name, allowed in credit_ranges().items():
            if problem := allowed.problem(getattr(self, name)):
                where = f"credit {owners[name]}: " if name in owners else ""
                raise InputError(f"{where}{name} {problem}, got {getattr(self, name)!r}")
        for inherited in {m.options for m in built_in_methods() if isinstance(self, m.options)}:
            if hasattr(inherited, "check_values"):
                inherited.check_values(self)  # e.g. GRAIL's "all" alias of "both", on this config's own field
        method.configure(self._credit_options(method), self)
        super().__post_init__()

    def _credit_options(self, method: type[CreditMethod]) -> Any:
        flat = {option.name: getattr(self, option.name) for option in fields(self) if option.name != "credit_options"}
        return build_options(method, flat, self.credit_options)

    def credit_method(self) -> CreditMethod:
        """The configured method, built from its options: for a built-in method whose options dataclass this
        class inherits, this config itself (a change to its fields is seen by the method)."""
        method = credit_method(self.credit)
        options = self if isinstance(self, method.options) else self._credit_options(method)
        return method(options, self)


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

# The TRL fields a study may set (`training`, `models.NAME.training`, a method section), each with the JSON schema of
# the values the pipeline supports: TRL's annotations are wider (`str | SchedulerType`, `dict | str | None`) and carry
# no ranges. Their help is TRL's own field metadata; python -m tools.schema writes $defs/grpo_fields from this table
# and MODEL_LOADING_OPTIONS, and refuses a name that is not a GRPOConfig field.
STUDY_TRL_FIELDS: dict[str, dict[str, Any]] = {
    "learning_rate": {"type": "number", "exclusiveMinimum": 0},
    "max_steps": {"$ref": "#/$defs/positive_int"},
    "per_device_train_batch_size": {"$ref": "#/$defs/positive_int"},
    "gradient_accumulation_steps": {"$ref": "#/$defs/positive_int"},
    "steps_per_generation": {"$ref": "#/$defs/positive_int"},
    "num_generations": {"type": "integer", "minimum": 2},
    "max_completion_length": {"$ref": "#/$defs/positive_int"},
    "temperature": {"type": "number", "exclusiveMinimum": 0},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"type": ["integer", "null"], "minimum": 0},
    "repetition_penalty": {"type": "number", "exclusiveMinimum": 0},
    "beta": {"type": "number", "minimum": 0},
    "num_iterations": {"$ref": "#/$defs/positive_int"},
    "epsilon": {"type": "number", "minimum": 0},
    "epsilon_high": {"type": ["number", "null"], "minimum": 0},
    "scale_rewards": {"anyOf": [{"type": "boolean"}, {"enum": ["group", "batch", "none"]}]},
    "loss_type": {"enum": ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]},
    "mask_truncated_completions": {"type": "boolean"},
    "lr_scheduler_type": {"enum": ["constant", "constant_with_warmup", "linear", "cosine"]},
    "warmup_steps": {"type": "integer", "minimum": 0},
    "max_grad_norm": {"type": "number", "minimum": 0},
    "weight_decay": {"type": "number", "minimum": 0},
    "adam_beta1": {"$ref": "#/$defs/probability"},
    "adam_beta2": {"$ref": "#/$defs/probability"},
    "optim": {"type": "string", "minLength": 1},
    "bf16": {"type": "boolean"},
    "use_cpu": {"type": "boolean"},
    "dataloader_pin_memory": {"type": "boolean"},
    "gradient_checkpointing": {"type": "boolean"},
    "gradient_checkpointing_kwargs": {
        "type": "object",
        "additionalProperties": False,
        "properties": {"use_reentrant": {"type": "boolean"}},
    },
    "disable_dropout": {"type": "boolean"},
    "shuffle_dataset": {"type": "boolean"},
    "logging_steps": {"$ref": "#/$defs/positive_int"},
    "logging_first_step": {"type": "boolean"},
    "save_steps": {"$ref": "#/$defs/positive_int"},
    "save_total_limit": {"type": ["integer", "null"], "minimum": 1},
    "ddp_timeout": {
        "type": "integer",
        "minimum": 1,
        "description": "seconds a collective (all-reduce, barrier, weight sync) may wait for the other ranks before the run fails; transformers' default 1800",
    },
    "log_completions": {"type": "boolean"},
    "num_completions_to_print": {"type": "integer", "minimum": 0},
    "use_liger_kernel": {"type": "boolean"},
    "use_vllm": {"type": "boolean"},
    "vllm_mode": {"enum": ["colocate", "server"]},
    "vllm_gpu_memory_utilization": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "vllm_tensor_parallel_size": {"$ref": "#/$defs/positive_int"},
    "vllm_importance_sampling_correction": {"type": "boolean"},
    "chat_template_kwargs": {
        "type": "object",
        "additionalProperties": False,
        "properties": {"enable_thinking": {"type": "boolean"}},
    },
}


@dataclass(frozen=True)
class LoadingOption:
    """A model-loading option a training spec may set besides the config fields: the type the stage accepts, and
    the JSON schema of the values a study may give (``$defs/grpo_fields``)."""

    accepts: Any
    schema: dict[str, Any]


MODEL_LOADING_OPTIONS: dict[str, LoadingOption] = {
    "dtype": LoadingOption(str, {"enum": ["auto", "float32", "bfloat16", "float16"], "description": "model loading"}),
    "attn_implementation": LoadingOption(
        str, {"enum": ["eager", "sdpa", "flash_attention_2"], "description": "model loading"}
    ),
    "trust_remote_code": LoadingOption(
        bool, {"type": "boolean", "description": "model loading; off unless a model's config turns it on"}
    ),
}
# Config fields this stage owns: a spec that sets them would break the run layout, resume or the exports.
RESERVED_KEYS = {
    "output_dir": "the run directory comes from --out",
    "seed": "the seed comes from --seed",
    "report_to": "trackers come from --tracking (the study config's `tracking` section)",
    "run_name": "the run's name comes from --run-name",
    "save_strategy": "checkpoints are saved every save_steps steps",
    "save_only_model": "resuming needs the optimizer, scheduler and RNG states in every checkpoint",
    "resume_from_checkpoint": "the run resumes from its own newest valid checkpoint",
    "logging_nan_inf_filter": "a non-finite loss stops the run (the NaN guard) instead of being hidden in the logs",
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
            expected, options = MODEL_LOADING_OPTIONS[key].accepts, loading_options
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
