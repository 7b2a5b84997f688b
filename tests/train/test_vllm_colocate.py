"""Training with vLLM generating the rollouts in the trainer's process (TRL's colocate mode, importance-sampling
correction on, as in configs/paper.yaml), through ``python -m pipeline.train``, for every credit method; and the
CPU-only weight patch of pipeline/models/vllm_cpu.py, which colocate training on vLLM's CPU platform needs."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_train_run import REWARD, assert_gradient_after, assert_same_weights, interrupt_after_checkpoint, step_lines
from train_support import TRAINING_SPEC, launch_two, run_train, train_command, write_one_question_jsonl

from pipeline.core.exit_codes import PREEMPTED_EXIT_CODE
from pipeline.models import vllm_cpu
from tests.hold_stage import pseudo_random_reward_env

VLLM_SPEC = {
    **TRAINING_SPEC,
    "max_steps": 2,
    "num_iterations": 1,
    "use_vllm": True,
    "vllm_mode": "colocate",
    "vllm_importance_sampling_correction": True,
    # the engine shares the trainer's process: 15% of the NUMA node for the trainer, the engine and its KV cache
    "vllm_gpu_memory_utilization": 0.15,
    "vllm_max_model_length": 256,
}
IS_METRICS = ("sampling/sampling_logp_difference/mean", "sampling/importance_sampling_ratio/mean")
CREDIT_METRICS = {"grpo": "reward", "grail": "grail/weight_mean", "oar_g": "oar_g/weight_mean"}


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("credit", ["grpo", "grail", "oar_g"])
def test_colocate_training_logs_importance_sampling(model_dir, train_jsonl, tmp_path, credit):
    run_dir = tmp_path / credit
    command = train_command(model_dir, train_jsonl, run_dir, training_spec=VLLM_SPEC, method_spec={"credit": credit})
    vllm_cache = tmp_path / "vllm_cache"
    result = run_train(command, pseudo_random_reward_env(), {"VLLM_CACHE_ROOT": str(vllm_cache)})
    assert result.returncode == 0, result.stderr[-4000:]
    # the engine TRL built ran eagerly (pipeline.models.vllm_cpu.eager_cpu_engines): vLLM compiled nothing, so it
    # cached nothing (a compiled engine writes its graphs under VLLM_CACHE_ROOT/torch_compile_cache)
    assert not (vllm_cache / "torch_compile_cache").exists()
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [entry for entry in steps if "loss" in entry]
    assert len(steps) == VLLM_SPEC["max_steps"]
    for entry in steps:
        assert CREDIT_METRICS[credit] in entry
        # vLLM's sampling log-probs agree with the trainer's own: the synced weights reached the engine's logits
        assert 0 <= entry[IS_METRICS[0]] < 0.05, entry
        assert 0.5 < entry[IS_METRICS[1]] < 2, entry
    trained = load_file(run_dir / "final" / "model.safetensors")
    start = load_file(model_dir / "model.safetensors")
    assert any(not torch.equal(trained[name], start[name]) for name in start)


@pytest.mark.vllm
@pytest.mark.slow
def test_preempted_colocate_run_resumes_to_the_same_weights(model_dir, train_jsonl, tmp_path):
    """Each process's engine samples from that process's torch generator (the engine runs in the trainer's
    process), which a checkpoint saves per rank and a resume restores: the rollouts after the resume, and so the
    weights, are those of the uninterrupted run. (Fails when the resume leaves the generator unrestored.) On two
    processes, where each rank's generator must come back as its own; a one-process run is the same code with one
    rank (it ran here too until CI's time was short)."""
    spec = {**VLLM_SPEC, "max_steps": 4, "save_steps": 2}

    def command_for(out: Path) -> list[str]:
        return launch_two(train_command(model_dir, train_jsonl, out, training_spec=spec))

    reference, run_dir = tmp_path / "reference", tmp_path / "run"
    uninterrupted = run_train(command_for(reference), REWARD)
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-4000:]

    command = command_for(run_dir)
    interrupted = interrupt_after_checkpoint(command, run_dir, signal.SIGTERM)
    assert interrupted.returncode == PREEMPTED_EXIT_CODE, interrupted.stderr[-4000:]
    rerun = run_train(command, REWARD)
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    assert "resuming from" in rerun.stderr and step_lines(run_dir) == [1, 2, 3, 4]
    assert_gradient_after(run_dir, 2)
    assert_same_weights(run_dir / "final", reference / "final")


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("rollout_seed", ["rank", "run"])
def test_rollout_seed_decides_whether_seeds_sample_different_rollouts(model_dir, tmp_path, rollout_seed):
    """Every training row is the same prompt, so the run's seed can reach the weights only through the engine's
    sampling: under 'rank' (TRL's engine seed) seeds 3 and 4 sample the same rollouts and end with the same
    weights; under 'run' they sample different ones. (The 'run' case fails when the trainer leaves vLLM's reseed.)"""
    data = write_one_question_jsonl(tmp_path / "one_prompt.jsonl", copies=8)
    spec = {**VLLM_SPEC, "max_steps": 1}
    finals = []
    for seed in (3, 4):
        out = tmp_path / f"seed{seed}"
        method = {"credit": "grpo", "vllm_rollout_seed": rollout_seed}
        result = run_train(
            train_command(model_dir, data, out, training_spec=spec, method_spec=method, seed=seed), REWARD
        )
        assert result.returncode == 0, result.stderr[-4000:]
        assert_gradient_after(out, 0)
        finals.append(load_file(out / "final" / "model.safetensors"))
    same = all(torch.equal(finals[0][name], finals[1][name]) for name in finals[0])
    assert same is (rollout_seed == "rank")


class FakePlatform:
    def __init__(self, cpu: bool) -> None:
        self.cpu = cpu

    def is_cpu(self) -> bool:
        return self.cpu


@pytest.fixture
def vllm_methods(monkeypatch):
    """vLLM's unquantized linear and embedding methods, their ``process_weights_after_loading`` restored after."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    methods = (UnquantizedLinearMethod, UnquantizedEmbeddingMethod)
    for method in methods:
        monkeypatch.setattr(method, "process_weights_after_loading", method.process_weights_after_loading)
    return methods


@pytest.mark.vllm
@pytest.mark.parametrize("cpu", [True, False])
def test_weight_patch_applies_on_the_cpu_platform_only(monkeypatch, vllm_methods, cpu):
    import vllm.platforms

    originals = [method.process_weights_after_loading for method in vllm_methods]
    monkeypatch.setattr(vllm.platforms, "current_platform", FakePlatform(cpu))
    assert vllm_cpu.keep_cpu_weights_in_place() is cpu
    patched = [method.process_weights_after_loading for method in vllm_methods]
    assert patched == ([vllm_cpu.compute_with_live_weight] * 2 if cpu else originals)


@pytest.mark.vllm
@pytest.mark.parametrize("cpu", [True, False])
def test_engines_are_built_eagerly_on_the_cpu_platform_only(monkeypatch, cpu):
    import vllm.platforms
    from vllm import LLM

    built_with = []
    monkeypatch.setattr(LLM, "__init__", lambda self, *args, **kwargs: built_with.append(kwargs))
    monkeypatch.setattr(vllm.platforms, "current_platform", FakePlatform(cpu))
    assert vllm_cpu.eager_cpu_engines() is cpu
    assert vllm_cpu.eager_cpu_engines() is cpu  # idempotent: one wrapper
    LLM(model="m")
    LLM(model="m", enforce_eager=False)  # a caller's own choice stays
    assert built_with == ([{"model": "m", "enforce_eager": True}] if cpu else [{"model": "m"}]) + [
        {"model": "m", "enforce_eager": False}
    ]


@pytest.mark.vllm
@pytest.mark.parametrize(("cpu", "preset", "expected"), [(True, None, "1"), (True, "3", "3"), (False, None, None)])
def test_cpu_kv_cache_default_leaves_a_user_setting_and_other_platforms_alone(monkeypatch, cpu, preset, expected):
    import vllm.platforms

    monkeypatch.setattr(vllm.platforms, "current_platform", FakePlatform(cpu))
    if preset is None:
        monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    else:
        monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", preset)
    assert vllm_cpu.default_cpu_kv_cache() is (cpu and preset is None)
    assert os.environ.get("VLLM_CPU_KVCACHE_SPACE") == expected


def loaded_layer(method) -> torch.nn.Module:
    """A layer whose weight was loaded and post-processed by ``method``, then synced (changed in place, as
    ``weight_loader`` does)."""
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(96, 64), requires_grad=False)
    method.process_weights_after_loading(layer)
    return layer


@pytest.mark.vllm
def test_synced_weights_reach_the_outputs_only_with_the_patch(vllm_methods):
    """On vLLM's CPU platform (vllm-cpu, as in CI) a weight sync is lost without the patch: linear layers drop their
    weight, the logits layer keeps multiplying with a packed copy of the loaded one. With it, both use the sync."""
    from vllm.platforms import current_platform

    assert current_platform.is_cpu()
    x = torch.randn(4, 64)
    linear, logits = (method() for method in vllm_methods)
    assert loaded_layer(linear).weight.numel() == 0
    layer = loaded_layer(logits)
    layer.weight.data.mul_(2)
    assert not torch.allclose(logits.apply(layer, x), x @ layer.weight.T, atol=1e-3)

    assert vllm_cpu.keep_cpu_weights_in_place()
    for method in (linear, logits):
        layer = loaded_layer(method)
        layer.weight.data.mul_(2)
        assert torch.allclose(method.apply(layer, x), x @ layer.weight.T, atol=1e-4)
