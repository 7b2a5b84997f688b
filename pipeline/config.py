"""The study configuration: schema check with key-naming messages, semantic checks, typed views for the Snakefile.

    config = load_config("configs/default.yaml")      # schema errors, defaults, semantic errors -> InputError
    study = Study.from_config(config)                  # what the Snakefile plans jobs from

Every error names the config key it is about (``models.tiny.warmup.steps``), and all errors are reported at once.
"""

from __future__ import annotations

import copy
import json
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from pipeline.io import InputError
from pipeline.launch import TrainingEngine, training_processes
from pipeline.layout import BASELINE_METHOD, FINAL_CHECKPOINT, START_CHECKPOINT, checkpoint_label, label_step
from pipeline.specs import annotation_accepts
from pipeline.tracking import TrackingConfig, run_name
from pipeline.watchdog import WatchdogConfig

PACKAGE_DIR = Path(__file__).resolve().parent
LibraryChanges = Literal["warn", "rerun"]  # config key `library_changes` (docs/reruns.md)
StaleCheckpoints = Literal["set_aside", "delete"]  # config key `stale_checkpoints` (pipeline.run_state)
SCHEMA_PATH = PACKAGE_DIR.parent / "configs" / "schema.yaml"

RESOURCE_KEYS = ("cpus", "mem_mb", "runtime", "gpus", "nodes", "gpu_model", "slurm_extra")
# TRL 1.16 GRPOConfig defaults of the fields the batch-shape check reads.
TRL_DEFAULTS = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "num_generations": 8}
# Orchestration keys of `token_analysis` (the rest is pipeline.token_analysis's spec).
TOKEN_ANALYSIS_PLAN_KEYS = ("benchmark", "checkpoints")


# --------------------------------------------------------------------------------------------- schema


def load_schema(path: str | Path = SCHEMA_PATH) -> dict[str, Any]:
    """The JSON Schema (YAML) as a dict."""
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _dotted(path: Iterable[Any]) -> str:
    return ".".join(str(part) for part in path) or "<top level>"


def _leaf_errors(error: ValidationError) -> Iterator[ValidationError]:
    """The most specific errors under ``error`` (allOf/anyOf wrap the useful ones in their context)."""
    if error.validator in {"allOf", "anyOf", "oneOf"} and error.context:
        deepest = max(len(child.absolute_path) for child in error.context)
        for child in error.context:
            if len(child.absolute_path) == deepest:
                yield from _leaf_errors(child)
    else:
        yield error


def _known_properties(schema: Mapping[str, Any], root: Mapping[str, Any]) -> set[str]:
    """Property names a (sub)schema allows, following local ``$ref``s and ``allOf`` branches."""
    reference = schema.get("$ref", "")
    if reference.startswith("#/"):
        node: Any = root
        for part in reference[2:].split("/"):
            node = node[part]
        schema = {**node, **{k: v for k, v in schema.items() if k != "$ref"}}
    known = set(schema.get("properties", {}))
    for branch in schema.get("allOf", []):
        known |= _known_properties(branch, root)
    return known


def _describe(error: ValidationError, root: Mapping[str, Any]) -> str | None:
    """``config key `a.b`: message`` for one schema error; unknown keys are named themselves.

    None for an "unevaluated property" that the schema does know: jsonschema reports it when the branch that
    declares it failed, and that branch's own error is the one worth reading.
    """
    path = list(error.absolute_path)
    if error.validator in {"additionalProperties", "unevaluatedProperties"} and isinstance(error.instance, dict):
        known = _known_properties(error.schema, root)
        unknown = sorted(set(error.instance) - known)
        if not unknown:
            return None
        allowed = ", ".join(sorted(known)) or "none"
        return "; ".join(
            f"config key `{_dotted([*path, key])}`: unknown key (allowed here: {allowed})" for key in unknown
        )
    return f"config key `{_dotted(path)}`: {error.message}"


def schema_errors(config: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Every schema violation of ``config`` as one message naming its key, in document order."""
    validator = Draft202012Validator(schema)
    messages: list[str] = []
    for top in sorted(validator.iter_errors(config), key=lambda error: list(map(str, error.absolute_path))):
        for error in _leaf_errors(top):
            message = _describe(error, schema)
            if message is not None and message not in messages:
                messages.append(message)
    return messages


def check_config_schema(config: Mapping[str, Any], schema_path: str | Path = SCHEMA_PATH) -> None:
    """Raise InputError listing every schema violation (each naming its key); return quietly when valid."""
    errors = schema_errors(config, load_schema(schema_path))
    if errors:
        raise InputError(_error_block("the config does not match configs/schema.yaml", errors))


def _error_block(headline: str, errors: list[str]) -> str:
    return headline + ":\n" + "\n".join(f"  - {error}" for error in errors)


def fill_defaults(config: dict[str, Any], schema_path: str | Path = SCHEMA_PATH) -> dict[str, Any]:
    """Fill the schema's defaults in place with Snakemake's own validator (what the Snakefile does)."""
    from snakemake.utils import validate

    validate(config, str(schema_path))
    return config


def load_config(path: str | Path, schema_path: str | Path = SCHEMA_PATH) -> dict[str, Any]:
    """Read a study config, check it against the schema, fill its defaults, run the semantic checks."""
    with open(path, encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    if not isinstance(config, dict):
        raise InputError(f"{path}: the config must be a mapping of top-level keys")
    check_config_schema(config, schema_path)
    fill_defaults(config, schema_path)
    Study.from_config(config)
    return config


# --------------------------------------------------------------------------------------------- overrides


def _leaf_paths(value: Any, path: tuple = ()) -> Iterator[tuple]:
    """Paths of the scalar leaves of nested mappings and lists."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _leaf_paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _leaf_paths(item, (*path, index))
    else:
        yield path


def _refuse_constant(name: str) -> Any:
    raise ValueError(name)


def _scalar_from_text(text: str) -> Any:
    """The JSON scalar ``text`` spells (number, true, false, null), or ``text`` itself; NaN and infinities stay
    text (no schema range would refuse them)."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except ValueError:
        return text
    return value if value is None or isinstance(value, bool | int | float) else text


def coerce_overrides(
    config: dict[str, Any], overrides: Mapping[str, Any], schema_path: str | Path = SCHEMA_PATH
) -> None:
    """Give the values of ``snakemake --config`` overrides their schema types in ``config``, in place.

    Snakemake reads ``--config 'evaluation={temperature: 0.7}'`` with YAML's base loader, so every nested value
    arrives as a string ('0.7'). A string the schema refuses at its key, that spells a JSON number, boolean or
    null the schema accepts there, becomes that value; anything else ('0.7x') is left for the schema check to
    refuse by name. A method's ``credit_options`` take the types of its options dataclass the same way. Values
    from config files are never changed.
    """
    validator = Draft202012Validator(load_schema(schema_path))

    def refused_at(path: tuple) -> bool:
        for top in validator.iter_errors(config):
            for error in _leaf_errors(top):
                if tuple(error.absolute_path)[: len(path)] == path:
                    return True
        return False

    for path in _leaf_paths(overrides):
        parent: Any = config
        try:
            for part in path[:-1]:
                parent = parent[part]
            text = parent[path[-1]]
        except (KeyError, IndexError, TypeError):
            continue
        if not isinstance(text, str) or (value := _scalar_from_text(text)) is text:
            continue
        if (option_type := _credit_option_type(config, path)) is not None:
            if not annotation_accepts(option_type, text) and annotation_accepts(option_type, value):
                parent[path[-1]] = value
            continue
        if not refused_at(path):
            continue
        parent[path[-1]] = value
        if refused_at(path):
            parent[path[-1]] = text


def _credit_option_type(config: Mapping[str, Any], path: tuple) -> Any:
    """The annotation of the option at ``methods.<name>.credit_options.<key>`` in its method's options dataclass
    (the schema does not type ``credit_options``), or None for any other path or a method that does not load
    (the config check names that)."""
    if len(path) != 4 or path[0] != "methods" or path[2] != "credit_options":
        return None
    from pipeline.credit.method import credit_method

    try:
        options = credit_method(config["methods"][path[1]]["credit"]).options
    except (InputError, KeyError, TypeError):
        return None
    return typing.get_type_hints(options).get(path[3])


# --------------------------------------------------------------------------------------------- typed views


def canonical_json(value: Any) -> str:
    """Deterministic JSON (sorted keys): what the rules pass as specs, so equal configs give equal params."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class UnrecordedParam:
    """A rule param that decides how a job runs, never what it computes (the stall watchdog's settings): formatted
    into the command as ``text``. Snakemake records and compares only params of builtin types (strings, numbers,
    containers: ``_serialize_param`` in snakemake/persistence), so a changed value reruns no job
    (tests/pipeline/test_workflow_e2e.py checks it)."""

    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Resources:
    """One job's request; ``threads`` for Snakemake is ``cpus``."""

    cpus: int
    mem_mb: int
    runtime: int
    gpus: int
    nodes: int
    gpu_model: str | None = None
    slurm_extra: str | None = None

    def snakemake_resources(self) -> dict[str, int | str]:
        """Snakemake's resource names: mem_mb, runtime (minutes), nodes, and gpu/gpu_model/slurm_extra when set.

        ``gpu`` is left out for CPU-only requests: executors read any ``gpu`` resource as a GPU request (the
        Kubernetes plugin then adds a GPU limit and toleration even for 0).
        """
        resources: dict[str, int | str] = {"mem_mb": self.mem_mb, "runtime": self.runtime, "nodes": self.nodes}
        if self.gpus:
            resources["gpu"] = self.gpus
        if self.gpu_model:
            resources["gpu_model"] = self.gpu_model
        if self.slurm_extra:
            resources["slurm_extra"] = self.slurm_extra
        return resources


# WARMUP_SPEC keys of the tiny model's architecture (pipeline.tiny_model.TinyModelSpec): refused beside a source.
TINY_ARCHITECTURE_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
)


@dataclass(frozen=True)
class ModelConfig:
    """A model: a hub id or local ``path`` at ``revision`` (used as it is); a ``source`` built here from an
    installed package (pipeline.prepare_model.ModelSource), optionally warmed up (``warmup``, SFT keys only);
    or the tiny model built from the architecture in ``warmup`` and warmed up."""

    name: str
    path: str | None
    revision: str | None
    warmup: dict[str, Any] | None
    source: dict[str, Any] | None
    training: dict[str, Any]
    resources: dict[str, dict[str, Any]]

    @property
    def warmup_seed(self) -> int:
        """The warmup stage's ``--seed`` (random init and SFT batch order)."""
        return self.warmup["seed"]

    @property
    def warmup_spec(self) -> dict[str, Any]:
        """WARMUP_SPEC: the warm-up settings without the seed, which travels as ``--seed``."""
        return {key: value for key, value in self.warmup.items() if key != "seed"}


@dataclass(frozen=True)
class MethodConfig:
    """A training method: METHOD_SPEC (``credit`` plus its options and any GRPOConfig override)."""

    name: str
    spec: dict[str, Any]

    @property
    def credit(self) -> str:
        return self.spec["credit"]

    @property
    def credit_module(self) -> str:
        """The module of its credit method, a root of the train rule's code digest: a built-in method's file
        (pipeline/credit/methods/<name>.py, loaded by name at run time, so no import of ``pipeline.train`` leads to
        it) or an out-of-tree method's import path (its own package's imports covered too)."""
        from pipeline.credit.method import credit_module

        return credit_module(self.credit)

    @property
    def grpo_overrides(self) -> dict[str, Any]:
        """The GRPOConfig fields this method overrides (everything but the credit options)."""
        return {key: value for key, value in self.spec.items() if not _is_credit_key(key)}


def _is_credit_key(key: str) -> bool:
    """An option of GrailGRPOConfig's own, not a GRPOConfig override: a property of the schema's `credit_fields`
    (tests/core/test_config_drift.py keeps those equal to the fields the config class adds)."""
    return key in _credit_keys()


@cache
def _credit_keys() -> frozenset[str]:
    return frozenset(load_schema()["$defs"]["credit_fields"]["properties"])


@dataclass(frozen=True)
class EvaluationConfig:
    """EVAL_SPEC for the evaluate stage, plus what to evaluate: checkpoints (labels) and the baseline."""

    spec: dict[str, Any]
    checkpoints: tuple[str, ...]
    baseline: bool


@dataclass(frozen=True)
class TokenAnalysisConfig:
    """Spec 8 for every GRAIL run: the benchmark whose samples are analysed, the checkpoints, the stage's spec."""

    enabled: bool
    benchmark: str | None
    checkpoints: tuple[str, ...]
    spec: dict[str, Any]


@dataclass(frozen=True)
class TokenViewerConfig:
    """The token-weight viewer: shown benchmark, rollouts per outcome (correct, wrong), seed of their choice."""

    enabled: bool
    benchmark: str
    rollouts: int
    seed: int


@dataclass(frozen=True)
class Study:
    """The validated config, split by concern; the Snakefile plans every job from it."""

    results_dir: str
    eval_data_dir: str
    container_image: str
    data: dict[str, Any]
    benchmarks: dict[str, dict[str, Any]]
    models: dict[str, ModelConfig]
    methods: dict[str, MethodConfig]
    seeds: tuple[int, ...]
    training: dict[str, Any]
    evaluation: EvaluationConfig
    token_analysis: TokenAnalysisConfig
    significance: dict[str, Any]
    tracking: TrackingConfig
    watchdog: WatchdogConfig
    token_viewer: TokenViewerConfig
    resource_table: dict[str, dict[str, Any]] = field(repr=False)
    library_changes: LibraryChanges = "warn"
    stale_checkpoints: StaleCheckpoints = "set_aside"
    training_engine: TrainingEngine = "auto"
    time_windows: int = 8  # Slurm time-limit windows per training job (pipeline.time_windows)
    kernel_pin: bool = True  # every job on the AVX2 CPU kernel path (pipeline.kernels)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Study:
        """Build from a schema-checked config with defaults filled; InputError lists every semantic problem."""
        errors = semantic_errors(config)
        if errors:
            raise InputError(_error_block("the config is inconsistent", errors))
        config = copy.deepcopy(dict(config))
        evaluation = dict(config["evaluation"])
        checkpoints = tuple(checkpoint_label(c) for c in evaluation.pop("checkpoints"))
        baseline = evaluation.pop("baseline")
        analysis = dict(config["token_analysis"])
        viewer = config["token_viewer"]
        return cls(
            results_dir=config["results_dir"],
            eval_data_dir=config["eval_data_dir"],
            container_image=config["container_image"],
            data=config["data"],
            benchmarks=config["benchmarks"],
            models={
                name: ModelConfig(
                    name=name,
                    path=raw.get("path"),
                    revision=raw.get("revision"),
                    warmup=raw.get("warmup"),
                    source=raw.get("source"),
                    training=raw.get("training", {}),
                    resources=raw.get("resources", {}),
                )
                for name, raw in config["models"].items()
            },
            methods={name: MethodConfig(name, spec) for name, spec in config["methods"].items()},
            seeds=tuple(config["seeds"]),
            training=config["training"],
            evaluation=EvaluationConfig(evaluation, checkpoints, baseline),
            token_analysis=TokenAnalysisConfig(
                enabled=analysis["enabled"],
                benchmark=analysis.get("benchmark"),
                checkpoints=tuple(checkpoint_label(c) for c in analysis.get("checkpoints", ())) or checkpoints,
                spec={k: v for k, v in analysis.items() if k not in TOKEN_ANALYSIS_PLAN_KEYS},
            ),
            significance=config["significance"],
            tracking=TrackingConfig(**config["tracking"]),
            watchdog=WatchdogConfig(**config["watchdog"]),
            token_viewer=TokenViewerConfig(
                enabled=viewer["enabled"],
                benchmark=viewer.get("benchmark") or analysis.get("benchmark") or next(iter(config["benchmarks"])),
                rollouts=viewer["rollouts"],
                seed=viewer["seed"],
            ),
            resource_table=config["resources"],
            library_changes=config["library_changes"],
            stale_checkpoints=config["stale_checkpoints"],
            training_engine=config["training_engine"],
            time_windows=config["time_windows"],
            kernel_pin=config["kernel_pin"],
        )

    # ----- specs passed to the stages

    def training_spec(self, model: str) -> dict[str, Any]:
        """TRAINING_SPEC of a model: the top-level ``training`` with the model's overrides."""
        return {**self.training, **self.models[model].training}

    def effective_training(self, model: str, method: str) -> dict[str, Any]:
        """What GRPOConfig will see for (model, method): TRAINING_SPEC with METHOD_SPEC's overrides on top."""
        return {**self.training_spec(model), **self.methods[method].grpo_overrides}

    def export_steps(self) -> list[int]:
        """Training steps whose model every train job exports: those of ``evaluation.checkpoints`` and, when the
        token analysis is on, of ``token_analysis.checkpoints`` (a job's outputs cannot depend on its method)."""
        labels = set(self.evaluation.checkpoints)
        if self.token_analysis.enabled:
            labels |= set(self.token_analysis.checkpoints)
        return sorted(label_step(label) for label in labels if label != FINAL_CHECKPOINT)

    def significance_checkpoint(self) -> str:
        """The checkpoint label the significance tests compare (``final`` or ``step-N``)."""
        return checkpoint_label(self.significance["checkpoint"])

    def decontaminates(self) -> bool:
        return bool(self.data.get("decontaminate", {}).get("enabled"))

    # ----- what to run

    def runs(self) -> list[dict[str, Any]]:
        """One training run per (model, method, seed), as wildcard values."""
        return [
            {"model": model, "method": method, "seed": seed}
            for model in self.models
            for method in self.methods
            for seed in self.seeds
        ]

    def evaluations(self) -> list[dict[str, Any]]:
        """One evaluation per (run, checkpoint, benchmark); per (GRAIL run, checkpoint) on the token analysis's
        benchmark for checkpoints only the analysis needs; per (model, seed, benchmark) for the baseline."""
        jobs = [
            {**run, "checkpoint": checkpoint, "benchmark": benchmark}
            for run in self.runs()
            for checkpoint in self.evaluation.checkpoints
            for benchmark in self.benchmarks
        ]
        analysed_only = [c for c in self.token_analysis.checkpoints if c not in self.evaluation.checkpoints]
        jobs += [
            {**run, "checkpoint": checkpoint, "benchmark": self.token_analysis.benchmark}
            for run in self.grail_runs()
            for checkpoint in analysed_only
        ]
        if self.evaluation.baseline:
            jobs += [
                {
                    "model": model,
                    "method": BASELINE_METHOD,
                    "seed": seed,
                    "checkpoint": START_CHECKPOINT,
                    "benchmark": benchmark,
                }
                for model in self.models
                for seed in self.seeds
                for benchmark in self.benchmarks
            ]
        return jobs

    def run_name(self, run: Mapping[str, Any]) -> str:
        """A run's name in the trackers: ``<model>/<method>/seed<s>``."""
        return run_name(run["model"], run["method"], run["seed"])

    def credit_specs(self) -> dict[str, dict[str, Any]]:
        """Each method's credit options (``credit`` and the other GrailGRPOConfig fields of its own, the training
        settings' shared ones under the method's), as the token viewer rebuilds the methods; the first model's
        training settings (the viewer's weights do not depend on the model's training overrides)."""
        training = self.training_spec(next(iter(self.models)))
        return {
            name: {key: value for key, value in {**training, **method.spec}.items() if _is_credit_key(key)}
            for name, method in self.methods.items()
        }

    def credits(self) -> list[str]:
        """The study's credit methods as its config names them (built-in names, import paths), each once, sorted."""
        return sorted({method.credit for method in self.methods.values()})

    def credit_modules(self) -> list[str]:
        """The modules of the study's credit methods (``MethodConfig.credit_module``), each once, sorted."""
        return sorted({method.credit_module for method in self.methods.values()})

    def viewed_rollouts(self) -> list[dict[str, Any]]:
        """The evaluations the token viewer shows: every (model, method) of the first seed, at every evaluated
        checkpoint, on the viewer's benchmark (empty when it is disabled)."""
        if not self.token_viewer.enabled:
            return []
        return [
            {**run, "checkpoint": checkpoint, "benchmark": self.token_viewer.benchmark}
            for run in self.runs()
            if run["seed"] == self.seeds[0]
            for checkpoint in self.evaluation.checkpoints
        ]

    def grail_runs(self) -> list[dict[str, Any]]:
        """The runs the token analysis covers (credit ``grail``), empty when it is disabled."""
        if not self.token_analysis.enabled:
            return []
        return [run for run in self.runs() if self.methods[run["method"]].credit == "grail"]

    # ----- resources

    def resources(self, rule: str, model: str | None = None) -> Resources:
        """``resources.default`` < ``resources.<rule>`` < ``models.<model>.resources.<rule>``.

        An evaluate job on the vllm backend asks for tensor x data parallel GPUs unless its GPUs are set.
        """
        merged = {**self.resource_table["default"], **self.resource_table.get(rule, {})}
        model_entry = self.models[model].resources.get(rule, {}) if model else {}
        merged.update(model_entry)
        explicit_gpus = "gpus" in self.resource_table.get(rule, {}) or "gpus" in model_entry
        if rule == "evaluate" and self.evaluation.spec["backend"] == "vllm" and not explicit_gpus:
            merged["gpus"] = vllm_gpus(self.evaluation.spec)
        return Resources(**{key: merged.get(key) for key in RESOURCE_KEYS})


def vllm_gpus(evaluation: Mapping[str, Any]) -> int:
    """GPUs a vLLM evaluation uses: tensor_parallel_size x data_parallel_size."""
    vllm = evaluation["vllm"]
    return vllm["tensor_parallel_size"] * vllm["data_parallel_size"]


# --------------------------------------------------------------------------------------------- semantic checks


def semantic_errors(config: Mapping[str, Any]) -> list[str]:
    """What the schema cannot say: cross-references, per-method option sets, batch shapes, GPU counts."""
    return [
        *_name_errors(config),
        *_model_errors(config),
        *_prompt_errors(config),
        *_method_errors(config),
        *_checkpoint_errors(config),
        *_batch_shape_errors(config),
        *_evaluation_gpu_errors(config),
        *_token_analysis_errors(config),
        *_token_viewer_errors(config),
    ]


def _name_errors(config: Mapping[str, Any]) -> list[str]:
    errors = []
    if BASELINE_METHOD in config["methods"]:
        errors.append(f"config key `methods.{BASELINE_METHOD}`: the name is reserved for the starting model")
    return errors


def _model_errors(config: Mapping[str, Any]) -> list[str]:
    """Each model is exactly one of: ``path`` (used as it is), ``source`` (+ optional SFT-only ``warmup``), or
    the tiny model (``warmup`` with its architecture)."""
    errors = []
    for name, model in config["models"].items():
        key = f"config key `models.{name}"
        if "path" in model and "source" in model:
            errors.append(f"{key}`: set one of `path` (a hub id or directory) or `source` (built here), not both")
        elif not {"path", "source", "warmup"} & set(model):
            errors.append(
                f"{key}`: set one of `path` (a hub id or directory), `source` (built here) or `warmup` (the tiny model)"
            )
        if "path" in model and "warmup" in model:
            errors.append(f"{key}.warmup`: a `path` model is used as it is; to warm up a model, build it with `source`")
        if "revision" in model and "path" not in model:
            errors.append(f"{key}.revision`: only a hub `path` has a revision")
        if "source" in model:
            errors += [
                f"{key}.warmup.{arch}`: an architecture key of the tiny model; a `source` model's warm-up takes only "
                "SFT keys (steps, batch_size, learning_rate, max_length)"
                for arch in TINY_ARCHITECTURE_KEYS
                if arch in model.get("warmup", {})
            ]
    return errors


def _prompt_errors(config: Mapping[str, Any]) -> list[str]:
    """Warm-up and training see the data's prompts; the evaluation must render the same instruction."""
    trained, evaluated = config["data"]["prompt_template"], config["evaluation"]["prompt_template"]
    if trained == evaluated:
        return []
    return [
        f"config key `evaluation.prompt_template`: '{evaluated}' differs from data.prompt_template '{trained}' "
        "(the warm-up and training prompt with the data's template; evaluate with the same one)"
    ]


def _method_errors(config: Mapping[str, Any]) -> list[str]:
    """Each method's credit must load (a built-in name or an import path) and its options build from its options
    dataclass (pipeline.credit.method.build_options); another method's option, or a required one missing, is named."""
    import dataclasses

    from pipeline.credit.method import build_options, built_in_methods, credit_method

    owner: dict[str, str] = {}
    for method in built_in_methods():
        for option in dataclasses.fields(method.options):
            owner.setdefault(option.name, method.name)
    errors = []
    for name, spec in config["methods"].items():
        try:
            method = credit_method(spec["credit"])
        except InputError as error:
            errors.append(f"config key `methods.{name}.credit`: {error}")
            continue
        own = {option.name for option in dataclasses.fields(method.options)}
        errors += [
            f"config key `methods.{name}.{key}`: a {owner[key]} option on a method whose credit is '{spec['credit']}'"
            for key in sorted(key for key in spec if key in owner and key not in own)
        ]
        errors += [
            f"config key `methods.{name}.{key}`: {why}" for key, why in method.required.items() if key not in spec
        ]
        try:
            build_options(method, {key: spec[key] for key in own & set(spec)}, spec.get("credit_options", {}))
        except InputError as error:
            errors.append(f"config key `methods.{name}`: {error}")
    return errors


def _merged_training(config: Mapping[str, Any], model: str, method: str) -> dict[str, Any]:
    overrides = {k: v for k, v in config["methods"][method].items() if not _is_credit_key(k)}
    return {**config["training"], **config["models"][model].get("training", {}), **overrides}


def _checkpoint_errors(config: Mapping[str, Any]) -> list[str]:
    """Exported steps must exist (<= max_steps); the significance tests compare an evaluated checkpoint."""
    analysis = config["token_analysis"]
    sources = {"evaluation.checkpoints": config["evaluation"]["checkpoints"]}
    if analysis["enabled"]:
        sources["token_analysis.checkpoints"] = analysis.get("checkpoints", [])
    errors = []
    for key, checkpoints in sources.items():
        steps = [c for c in checkpoints if c != FINAL_CHECKPOINT]
        for model in config["models"]:
            for method in config["methods"]:
                max_steps = _merged_training(config, model, method).get("max_steps")
                late = [step for step in steps if max_steps is not None and step > max_steps]
                if late:
                    errors.append(
                        f"config key `{key}`: step(s) {late} lie beyond max_steps={max_steps} "
                        f"of model '{model}' with method '{method}'"
                    )
    significance = config["significance"]["checkpoint"]
    if significance not in config["evaluation"]["checkpoints"]:
        errors.append(
            f"config key `significance.checkpoint`: {significance!r} is not in evaluation.checkpoints "
            f"{config['evaluation']['checkpoints']}"
        )
    return errors


def _train_processes(config: Mapping[str, Any], model: str) -> int:
    """Processes the train job runs: pipeline.launch's count for its gpus and nodes (one per GPU, or per CPU
    slot on a machine without CUDA, when more than one is asked for)."""
    merged = {
        **config["resources"]["default"],
        **config["resources"].get("train", {}),
        **config["models"][model].get("resources", {}).get("train", {}),
    }
    return training_processes(merged["gpus"], merged["nodes"])


def _batch_shape_errors(config: Mapping[str, Any]) -> list[str]:
    """TRL needs the generation batch (per-device batch x processes x steps per generation) to hold whole groups."""
    errors = []
    for model in config["models"]:
        for method in config["methods"]:
            merged = {**TRL_DEFAULTS, **_merged_training(config, model, method)}
            steps_per_generation = merged.get("steps_per_generation", merged["gradient_accumulation_steps"])
            batch = merged["per_device_train_batch_size"] * _train_processes(config, model) * steps_per_generation
            if batch % merged["num_generations"]:
                errors.append(
                    f"config key `methods.{method}` / `training` (model '{model}'): the generation batch "
                    f"per_device_train_batch_size x processes x steps_per_generation = {batch} is not a multiple "
                    f"of num_generations = {merged['num_generations']}"
                )
    return errors


def _evaluation_gpu_errors(config: Mapping[str, Any]) -> list[str]:
    evaluation = config["evaluation"]
    if evaluation["backend"] != "vllm":
        return []
    needed = vllm_gpus(evaluation)
    entries = {"resources.evaluate": config["resources"].get("evaluate", {})}
    entries |= {
        f"models.{name}.resources.evaluate": model.get("resources", {}).get("evaluate", {})
        for name, model in config["models"].items()
    }
    return [
        f"config key `{key}.gpus`: {entry['gpus']} GPU(s), but vLLM's tensor_parallel_size x data_parallel_size "
        f"needs {needed}"
        for key, entry in entries.items()
        if "gpus" in entry and entry["gpus"] != needed
    ]


def _token_analysis_errors(config: Mapping[str, Any]) -> list[str]:
    analysis = config["token_analysis"]
    if not analysis["enabled"]:
        return []
    errors = []
    benchmark = analysis.get("benchmark")
    if benchmark is None:
        errors.append("config key `token_analysis.benchmark`: required when token_analysis.enabled is true")
    elif benchmark not in config["benchmarks"]:
        errors.append(
            f"config key `token_analysis.benchmark`: unknown benchmark '{benchmark}' "
            f"(benchmarks: {', '.join(config['benchmarks'])})"
        )
    return errors


def _token_viewer_errors(config: Mapping[str, Any]) -> list[str]:
    benchmark = config["token_viewer"].get("benchmark")
    if benchmark is not None and benchmark not in config["benchmarks"]:
        return [
            f"config key `token_viewer.benchmark`: unknown benchmark '{benchmark}' "
            f"(benchmarks: {', '.join(config['benchmarks'])})"
        ]
    return []
