"""GPUs sized to the work (pipeline.study.gpu_sizing): known answers of the sizing formulas, the study's per-job
layout, spec and resources agreeing, and the config checks that name their key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pipeline.core.io import InputError
from pipeline.evaluation.eval_spec import EvalSpec
from pipeline.evaluation.vllm_backend import vllm_engine_kwargs
from pipeline.study import cost, gpu_sizing, power_analysis
from pipeline.study.gpu_sizing import GpuSizing, fixed_layout, sized_layout
from pipeline.study.load import load_study

PAPER = Path(__file__).resolve().parents[2] / "configs" / "paper.yaml"
SIZING = GpuSizing(layout="sized")  # 80 GB a GPU, 16 GB KV cache, 256 sequences an engine, at most 4 GPUs
UPSTREAM = {"gpu_sizing": {"layout": "fixed"}, "vllm": {"tensor_parallel_size": 2, "data_parallel_size": 2}}


def layout(parameters: int, sequences: int | None, sizing: GpuSizing = SIZING) -> tuple[int, int]:
    found = sized_layout(parameters, sequences, sizing, utilization=0.95)
    return found.tensor_parallel_size, found.data_parallel_size


def test_a_model_that_fits_one_gpu_gets_data_parallel_engines_bounded_by_its_sequences_and_max_gpus() -> None:
    # 4 B parameters: 8 GB bf16 + 16 GB KV cache <= 0.95 x 80 GB
    assert layout(4_000_000_000, 90) == (1, 1)  # AIME24, 30 items x 3 samples: one engine
    assert layout(4_000_000_000, 256) == (1, 1)
    assert layout(4_000_000_000, 257) == (1, 2)
    assert layout(4_000_000_000, 600) == (1, 3)  # ceil(600 / 256)
    assert layout(4_000_000_000, 3_726) == (1, 4)  # every benchmark of the paper: capped at max_gpus
    assert layout(4_000_000_000, None) == (1, 4)  # unknown sequences: the cap
    assert layout(4_000_000_000, 3_726, GpuSizing(layout="sized", max_gpus=8)) == (1, 8)
    assert layout(4_000_000_000, 3_726, GpuSizing(layout="sized", sequences_per_engine=2_000)) == (1, 2)
    reason = sized_layout(4_000_000_000, 3_726, SIZING, 0.95).reason
    assert reason == "8.0 GB bf16 + 16 GB KV cache fit one 80 GB GPU at 0.95 utilization: TP1 x DP4 for 3,726 sequences"


def test_a_model_that_does_not_fit_gets_the_smallest_tensor_parallel_size_that_holds_it() -> None:
    assert layout(30_000_000_000, 3_726) == (1, 4)  # 60 + 16 = 76 GB: just fits 0.95 x 80
    assert layout(32_000_000_000, 3_726) == (2, 2)  # 64 + 16 = 80 GB > 76: TP2, two engines in 4 GPUs
    assert layout(32_000_000_000, 90) == (2, 1)
    assert layout(70_000_000_000, 3_726) == (4, 1)  # 140 + 16 = 156 GB > 2 x 76: TP4
    assert layout(32_000_000_000, 90, GpuSizing(layout="sized", gpu_memory_gb=141)) == (1, 1)  # an H200
    assert "need 2 80 GB GPUs an engine" in sized_layout(32_000_000_000, 90, SIZING, 0.95).reason
    with pytest.raises(ValueError, match="need tensor_parallel_size 8 on 80 GB GPUs, above max_gpus 4"):
        sized_layout(200_000_000_000, 90, SIZING, 0.95)


def test_the_fixed_layout_is_the_configured_one_upstreams_tp2_x_dp2() -> None:
    fixed = fixed_layout({"tensor_parallel_size": 2, "data_parallel_size": 2})
    assert (fixed.tensor_parallel_size, fixed.data_parallel_size, fixed.gpus) == (2, 2, 4)
    upstream = load_study([PAPER], {"evaluation": UPSTREAM})
    job = {"model": "qwen3_4b", "method": "grpo", "seed": "42", "checkpoint": "final", "benchmark": "aime24"}
    assert upstream.resources("evaluate", "qwen3_4b", job).gpus == 4
    assert upstream.evaluation_spec(job) == upstream.evaluation.spec  # the same spec for every job
    assert upstream.evaluation_layout(job).reason == "layout fixed: TP2 x DP2 as evaluation.vllm sets it"


def test_the_default_utilization_is_the_one_the_vllm_backend_passes() -> None:
    kwargs = vllm_engine_kwargs("model", EvalSpec(), seed=0, device_type="cuda")
    assert kwargs["gpu_memory_utilization"] == gpu_sizing.DEFAULT_GPU_MEMORY_UTILIZATION


def test_each_paper_job_runs_the_engines_it_asks_for() -> None:
    """The spec the evaluate stage gets (Study.evaluation_spec) has the layout whose GPUs the job asks for, per job:
    per benchmark, and per (run, checkpoint) serving every benchmark of that checkpoint."""
    paper = load_study([PAPER])
    assert paper.evaluation.gpu_sizing.layout == "sized"
    jobs = [*paper.evaluations(), *({k: v for k, v in job.items() if k != "benchmark"} for job in paper.evaluations())]
    for job in jobs:
        vllm = paper.evaluation_spec(job)["vllm"]
        gpus = paper.resources("evaluate", job["model"], job).gpus
        assert vllm["tensor_parallel_size"] * vllm["data_parallel_size"] == gpus, job
    final = {"model": "qwen3_8b", "method": "grail", "seed": 42, "checkpoint": "final"}
    assert paper.evaluation_benchmarks(final) == list(paper.benchmarks)
    assert paper.evaluation_sequences(final) == 3 * (500 + 30 + 40 + 272 + 200 + 200)
    analysed = {"model": "qwen3_8b", "method": "grail", "seed": 42, "checkpoint": "step-50"}
    assert paper.evaluation_benchmarks(analysed) == ["math500"]  # only the token analysis reads this checkpoint
    with pytest.raises(InputError, match="no evaluation of the study matches"):
        paper.evaluation_benchmarks({"model": "qwen3_8b", "method": "grpo", "seed": 42, "checkpoint": "step-50"})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"resources": {"evaluate": {"gpus": 4}}},
            "config key `resources.evaluate.gpus`: evaluation.gpu_sizing.layout sized chooses it per job",
        ),
        (
            {"evaluation": {"vllm": {"tensor_parallel_size": 2}}},
            "config key `evaluation.vllm.tensor_parallel_size`: 2, but evaluation.gpu_sizing.layout sized",
        ),
        (
            {"models": {"qwen3_4b": {"path": "Org/Mystery-Model"}}},
            "config key `models.qwen3_4b.parameters`: evaluation.gpu_sizing.layout sized needs the model's parameter",
        ),
        (
            {"evaluation": {"gpu_sizing": {"max_gpus": 1}}, "models": {"qwen3_4b": {"parameters": 40_000_000_000}}},
            "config key `evaluation.gpu_sizing.max_gpus`: model 'qwen3_4b': 80.0 GB bf16 + 16 GB KV cache need",
        ),
    ],
    ids=["explicit-gpus", "configured-tp", "unknown-parameters", "above-max-gpus"],
)
def test_the_sized_layout_refuses_what_contradicts_it_naming_the_key(overrides: dict, message: str) -> None:
    with pytest.raises(InputError, match="the config is inconsistent") as refused:
        load_study([PAPER], overrides, check_inputs=False)
    assert message in str(refused.value)


def test_a_declared_parameter_count_sizes_a_model_whose_hub_id_does_not_say_it() -> None:
    study = load_study([PAPER], {"models": {"qwen3_4b": {"path": "Org/Mystery-Model", "parameters": 32_000_000_000}}})
    job = {"model": "qwen3_4b", "method": "grpo", "seed": 42, "checkpoint": "final"}
    assert study.evaluation_layout(job).reason.startswith("64.0 GB bf16 + 16 GB KV cache need 2 80 GB GPUs")


def test_the_planner_prices_an_alternative_with_the_layout_its_generations_need() -> None:
    """16 samples on AIME24 (480 sequences) and AMC23 (640): their sized jobs ask for 2 and 3 GPUs instead of 1; a
    job whose GPUs are set keeps them."""
    paper = load_study([PAPER])
    configured, _ = power_analysis.configured_design(PAPER)
    more = dataclasses.replace(configured, samples={**configured.samples, "aime24": 16, "amc23": 16})
    jobs = [
        cost.PlannedJob("evaluate", {k: str(v) for k, v in e.items()}, gpus=paper.evaluation_layout(e).gpus, runtime=60)
        for e in paper.evaluations()
    ]
    hours = power_analysis.design_gpu_hours(jobs, configured, configured, paper)
    assert hours == sum(job.gpus for job in jobs)  # one hour each
    small = len([job for job in jobs if job.wildcards["benchmark"] == "aime24"])  # as many on amc23
    assert power_analysis.design_gpu_hours(jobs, configured, more, paper) == hours + small * (2 - 1) + small * (3 - 1)
    pinned = [dataclasses.replace(job, gpus=8) for job in jobs]  # not the layout's: kept
    assert power_analysis.design_gpu_hours(pinned, configured, more, paper) == 8 * len(jobs)
