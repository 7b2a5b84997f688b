"""What the schema cannot say about a study config: cross-references between keys, per-method option sets, batch
shapes, checkpoints, GPU counts. ``semantic_errors`` lists every problem, each naming its key; ``Study.from_config``
refuses a config that has any.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from pipeline.core.io import InputError
from pipeline.core.layout import BASELINE_METHOD, FINAL_CHECKPOINT
from pipeline.runtime.launching import training_processes
from pipeline.runtime.settings import RUNTIME_TRAINING_KEYS
from pipeline.study.cost import parameter_count
from pipeline.study.gpu_sizing import GpuSizing, engine_utilization, fixed_layout, sized_layout
from pipeline.study.schema import load_schema

# TRL 1.16 GRPOConfig defaults of the fields the batch-shape check reads.
TRL_DEFAULTS = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "num_generations": 8}


# WARMUP_SPEC keys of the tiny model's architecture (pipeline.models.tiny_model.TinyModelSpec): refused beside a source.
TINY_ARCHITECTURE_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "dtype",
)


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
        *_credit_truth_errors(config),
        *_analysed_method_errors(config),
        *_runtime_key_errors(config),
    ]


def decisive_benchmarks(config: Mapping[str, Any]) -> list[str]:
    """The study's decisive-step benchmarks (generated, ``steps`` > 1: pipeline.tasks.decisive), in config order."""
    return [
        name
        for name, spec in config["benchmarks"].items()
        if spec.get("kind") == "generated" and spec.get("generated", {}).get("steps", 1) > 1
    ]


def _credit_truth_errors(config: Mapping[str, Any]) -> list[str]:
    truth = config["credit_truth"]
    errors = []
    benchmark = truth.get("benchmark")
    if benchmark is not None and benchmark not in decisive_benchmarks(config):
        errors.append(
            f"config key `credit_truth.benchmark`: '{benchmark}' is not a decisive-step benchmark "
            f"(a generated one with steps > 1; the study has: {', '.join(decisive_benchmarks(config)) or 'none'})"
        )
    if (method := truth.get("rollouts_of")) is not None and method not in config["methods"]:
        errors.append(
            f"config key `credit_truth.rollouts_of`: unknown method '{method}' (methods: {', '.join(config['methods'])})"
        )
    scored_only = truth.get("placement_only") or []
    errors += unknown_methods("credit_truth.placement_only", scored_only, config)
    for key in ("rollouts_of", "floor", "ceiling"):
        if (method := truth.get(key, truth.get("floor"))) in scored_only:
            errors.append(
                f"config key `credit_truth.placement_only`: '{method}' is credit_truth.{key}, which needs its training "
                "runs"
            )
    if scored_only and (not truth.get("enabled", True) or not decisive_benchmarks(config)):
        errors.append(
            f"config key `credit_truth.placement_only`: {', '.join(scored_only)} would run nowhere: the study scores no "
            "placement (credit_truth is off, or there is no decisive-step benchmark)"
        )
    return errors


def _analysed_method_errors(config: Mapping[str, Any]) -> list[str]:
    """``token_analysis.methods``: methods of ``methods``, each of the GRAIL family (its options GRAIL's)."""
    from pipeline.credit.method import credit_method  # no torch: planning loads the methods without it
    from pipeline.credit.methods.grail import GrailOptions

    analysed = config["token_analysis"].get("methods") or ()
    errors = unknown_methods("token_analysis.methods", analysed, config)
    for name in (name for name in analysed if name in config["methods"]):
        if not issubclass(credit_method(config["methods"][name]["credit"]).options, GrailOptions):
            errors.append(
                f"config key `token_analysis.methods`: '{name}' (credit {config['methods'][name]['credit']}) is not of "
                "the GRAIL family: the analysis recomputes GRAIL's weights with the method's GRAIL options"
            )
    return errors


def _runtime_key_errors(config: Mapping[str, Any]) -> list[str]:
    """A run-time setting is the study's, for every job (pipeline.runtime.settings): not a model's or a method's."""
    errors = []
    for key in RUNTIME_TRAINING_KEYS:
        for model, raw in config["models"].items():
            if key in (raw.get("training") or {}):
                errors.append(f"models.{model}.training.{key}: a run-time setting of every job; set training.{key}")
        for method, spec in config["methods"].items():
            if key in (spec or {}):
                errors.append(f"methods.{method}.{key}: a run-time setting of every job; set training.{key}")
    return errors


def methods_that_ran(config: Mapping[str, Any]) -> str:
    """The study's methods that train (``methods_only`` of ``methods``, less ``credit_truth.placement_only``),
    naming the ones it leaves out."""
    chosen = config.get("methods_only")
    scored_only = (config.get("credit_truth") or {}).get("placement_only") or []
    ran = [name for name in config.get("methods", {}) if (chosen is None or name in chosen) and name not in scored_only]
    left_out = [name for name in config.get("methods", {}) if name not in ran and name not in scored_only]
    notes = [f"methods_only; not run: {', '.join(left_out)}"] if left_out else []
    notes += [f"placement only: {', '.join(scored_only)}"] if scored_only else []
    return ", ".join(ran) + (f" ({'; '.join(notes)})" if notes else "")


def unknown_methods(key: str, names: Any, config: Mapping[str, Any]) -> list[str]:
    """The error of a config key that lists ``names`` of methods, for those that ``methods`` does not define."""
    if unknown := [name for name in names or () if name not in config["methods"]]:
        return [
            f"config key `{key}`: {', '.join(unknown)} not among the study's methods ({', '.join(config['methods'])})"
        ]
    return []


def _name_errors(config: Mapping[str, Any]) -> list[str]:
    errors = unknown_methods("methods_only", config.get("methods_only"), config)
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
    overrides = {k: v for k, v in config["methods"][method].items() if not is_credit_key(k)}
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
    """On the vllm backend: explicit evaluate GPUs equal the fixed layout's TP x DP; under the sized layout, nothing
    sets what it chooses, and every model has a parameter count and fits ``max_gpus`` (pipeline.study.gpu_sizing)."""
    evaluation = config["evaluation"]
    if evaluation["backend"] != "vllm":
        return []
    entries = {"resources.evaluate": config["resources"].get("evaluate", {})}
    entries |= {
        f"models.{name}.resources.evaluate": model.get("resources", {}).get("evaluate", {})
        for name, model in config["models"].items()
    }
    if evaluation["gpu_sizing"]["layout"] == "sized":
        return _sized_layout_errors(config, [key for key, entry in entries.items() if "gpus" in entry])
    needed = fixed_layout(evaluation["vllm"]).gpus
    return [
        f"config key `{key}.gpus`: {entry['gpus']} GPU(s), but vLLM's tensor_parallel_size x data_parallel_size "
        f"needs {needed}"
        for key, entry in entries.items()
        if "gpus" in entry and entry["gpus"] != needed
    ]


def _sized_layout_errors(config: Mapping[str, Any], explicit_gpus: list[str]) -> list[str]:
    sized = "evaluation.gpu_sizing.layout sized chooses it per job; leave it out (or set layout: fixed)"
    vllm = config["evaluation"]["vllm"]
    errors = [f"config key `{key}.gpus`: {sized}" for key in explicit_gpus]
    errors += [
        f"config key `evaluation.vllm.{size}`: {vllm[size]}, but {sized}"
        for size in ("tensor_parallel_size", "data_parallel_size")
        if vllm[size] != 1
    ]
    sizing = GpuSizing(**config["evaluation"]["gpu_sizing"])
    for name, model in config["models"].items():
        parameters = parameter_count(model)
        if parameters is None:
            errors.append(
                f"config key `models.{name}.parameters`: evaluation.gpu_sizing.layout sized needs the model's "
                "parameter count, and neither a `parameters` key nor an `<N>B` in its hub id says it; declare it "
                "(e.g. parameters: 8000000000)"
            )
            continue
        try:
            sized_layout(parameters, None, sizing, engine_utilization(vllm))
        except ValueError as error:
            errors.append(f"config key `evaluation.gpu_sizing.max_gpus`: model '{name}': {error}")
    return errors


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


def is_credit_key(key: str) -> bool:
    """An option of GrailGRPOConfig's own, not a GRPOConfig override: a property of the schema's `credit_fields`
    (python -m tools.schema writes them from the fields the config class adds)."""
    return key in credit_keys()


@cache
def token_analysis_keys() -> frozenset[str]:
    """The keys of the schema's `token_analysis` section."""
    return frozenset(load_schema()["$defs"]["token_analysis"]["properties"])


@cache
def credit_keys() -> frozenset[str]:
    return frozenset(load_schema()["$defs"]["credit_fields"]["properties"])
