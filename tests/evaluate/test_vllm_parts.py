"""The vllm backend's request building and result parsing, with plain objects shaped like vllm's outputs."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from pipeline.core.io import InputError
from pipeline.evaluation import eval_spec, sampling, vllm_backend


@dataclass
class CompletionOutput:
    """The fields of ``vllm.outputs.CompletionOutput`` that the backend reads (and a few it must ignore)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    finish_reason: str | None = "stop"


@dataclass
class RequestOutput:
    """The fields of ``vllm.outputs.RequestOutput`` that the backend reads."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True


def test_requests_are_token_prompts_sampled_once_without_a_request_seed():
    spec = eval_spec.parse_eval_spec({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 8192})
    prompts = vllm_backend.build_vllm_prompts([eval_spec.Request([1, 2, 3], 11), eval_spec.Request([4], 12)])
    assert prompts == [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [4]}]
    # a per-request seed fails on vLLM's CPU platform: the engine is reseeded per batch instead
    assert vllm_backend.vllm_sampling_kwargs(spec) == {
        "n": 1,
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "max_tokens": 8192,
        "skip_special_tokens": True,
    }


def test_batch_seed_depends_on_every_unit_seed_and_their_order():
    requests = [eval_spec.Request([1], 11), eval_spec.Request([2], 12)]
    assert eval_spec.batch_seed(requests) == eval_spec.batch_seed(
        [eval_spec.Request([9], 11), eval_spec.Request([9], 12)]
    )
    assert eval_spec.batch_seed(requests) != eval_spec.batch_seed(requests[::-1])
    assert eval_spec.batch_seed(requests) != eval_spec.batch_seed(requests[:1])


def test_top_k_disabled_maps_to_minus_one():
    assert vllm_backend.vllm_sampling_kwargs(eval_spec.parse_eval_spec({"top_k": 0}))["top_k"] == -1


def test_unit_seeds_do_not_depend_on_batching():
    items = [eval_spec.Item(f"q{i}", "p", "a") for i in range(4)]
    units = sampling.plan_units(items, n_samples=3, seed=5)
    again = sampling.plan_units(items[2:], n_samples=3, seed=5)
    assert [u.seed for u in units[6:]] == [u.seed for u in again]
    assert units[0].seed != sampling.plan_units(items, n_samples=3, seed=6)[0].seed


def test_outputs_parse_in_request_order():
    outputs = [
        RequestOutput("0", [1, 2], [CompletionOutput(0, "so \\boxed{4}", [7, 8, 9, 2])]),
        RequestOutput("1", [3], [CompletionOutput(0, "", [2])]),
    ]
    assert vllm_backend.parse_vllm_outputs(outputs, 2) == [
        eval_spec.Generation("so \\boxed{4}", 4),
        eval_spec.Generation("", 1),
    ]


def test_output_count_mismatch_and_empty_output_raise():
    with pytest.raises(RuntimeError, match="2 outputs for 3 requests"):
        vllm_backend.parse_vllm_outputs([RequestOutput("0", [1]), RequestOutput("1", [1])], 3)
    with pytest.raises(RuntimeError, match="request 7 returned no completion"):
        vllm_backend.parse_vllm_outputs([RequestOutput("7", [1], [])], 1)


def test_engine_kwargs_follow_the_spec():
    spec = eval_spec.parse_eval_spec(
        {"vllm": {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.95, "max_model_len": 16384}}
    )
    assert vllm_backend.vllm_engine_kwargs("Qwen/Qwen3-4B", spec, 9, "cuda") == {
        "model": "Qwen/Qwen3-4B",
        "tokenizer": "Qwen/Qwen3-4B",
        "tensor_parallel_size": 2,
        "gpu_memory_utilization": 0.95,
        "enable_prefix_caching": True,
        "seed": 9,
        "worker_extension_cls": "pipeline.evaluation.vllm_backend.SamplingSeedExtension",
        "enforce_eager": False,
        "trust_remote_code": False,
        "max_model_len": 16384,
    }
    assert "max_model_len" not in vllm_backend.vllm_engine_kwargs("m", eval_spec.parse_eval_spec({}), 0, "cuda")


@pytest.mark.parametrize(
    ("device_type", "expected"),
    [("cuda", {"gpu_memory_utilization": 0.9}), ("cpu", {"kv_cache_memory_bytes": 2**30})],
)
def test_default_memory_fits_the_platform(device_type, expected):
    """A GPU engine takes 0.9 of the GPU; a CPU engine a fixed 1 GiB KV cache rather than a fraction of node memory
    less the process's resident memory, which depends on the machine's state (VllmSettings)."""
    kwargs = vllm_backend.vllm_engine_kwargs("m", eval_spec.parse_eval_spec({}), 0, device_type)
    assert {
        key: kwargs[key] for key in ("gpu_memory_utilization", "kv_cache_memory_bytes") if key in kwargs
    } == expected
    assert kwargs["enforce_eager"] is (device_type == "cpu")
    explicit = eval_spec.parse_eval_spec({"vllm": {"gpu_memory_utilization": 0.5}})
    explicit_kwargs = vllm_backend.vllm_engine_kwargs("m", explicit, 0, device_type)
    assert explicit_kwargs["gpu_memory_utilization"] == 0.5
    assert "kv_cache_memory_bytes" not in explicit_kwargs


def test_device_groups_split_visible_gpus_by_tensor_parallel_size():
    assert vllm_backend.vllm_device_groups(2, 2, ["0", "1", "2", "3"]) == ["0,1", "2,3"]
    assert vllm_backend.vllm_device_groups(3, 1, ["4", "5", "6", "7"]) == ["4", "5", "6"]
    with pytest.raises(InputError, match="= 4 GPUs, but 2 are visible"):
        vllm_backend.vllm_device_groups(2, 2, ["0", "1"])
