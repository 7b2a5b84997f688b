"""RL learns, through ``python -m pipeline.train``: on a task whose best policy needs no reading of the prompt (every
row asks ``1+1=?``), GRPO, GRAIL and OAR-G raise the outcome reward of the warmed-up tiny model (which answers 2 about
one time in ten) to about 0.9 within 30 steps with Hugging Face generation, and GRAIL does with vLLM generating the
rollouts in colocate mode. These fail on a flipped advantage, and the vLLM ones when the trained weights stop reaching
the engine (it then keeps sampling the start model). The two-bit sums of the other tests are no such check: their
warmed-up model answers alike whatever the question, and 40 steps of TRL's own GRPOTrainer (learning rate 1e-4 or
3e-4) leave its reward at about 0.4."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_vllm_colocate import VLLM_SPEC
from train_support import TRAINING_SPEC, run_train, train_command, write_one_question_jsonl

LEARNING = {
    "max_steps": 30,
    "save_steps": 1000,
    "num_iterations": 1,
    "learning_rate": 1e-3,
    "per_device_train_batch_size": 16,  # 4 groups of 4 completions a step
}
LEARNING_SPEC = {**TRAINING_SPEC, **LEARNING}
VLLM_LEARNING_SPEC = {**VLLM_SPEC, **LEARNING}


@pytest.fixture(scope="module")
def one_prompt_jsonl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_one_question_jsonl(tmp_path_factory.mktemp("one_prompt") / "train.jsonl", copies=64)


def assert_reward_rises(model_dir: Path, data: Path, out: Path, spec: dict, credit: str) -> None:
    command = train_command(model_dir, data, out, training_spec=spec, method_spec={"credit": credit}, seed=0)
    result = run_train(command, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    rewards = [
        json.loads(line)["reward"] for line in (out / "metrics.jsonl").read_text().splitlines() if '"reward"' in line
    ]
    assert len(rewards) == spec["max_steps"]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last >= 0.75 and last - first >= 0.4, [round(reward, 2) for reward in rewards]


@pytest.mark.slow
@pytest.mark.parametrize("credit", ["grpo", "grail", "oar_g"])
def test_rl_raises_the_reward_with_hf_generation(model_dir, one_prompt_jsonl, tmp_path, credit):
    assert_reward_rises(model_dir, one_prompt_jsonl, tmp_path / credit, LEARNING_SPEC, credit)


@pytest.mark.vllm
@pytest.mark.slow
def test_rl_raises_the_reward_with_vllm_colocate(model_dir, one_prompt_jsonl, tmp_path):
    """GRAIL only (CI time): the engine's rollouts and the weight sync are the credit method's business in no way, and
    GRPO's colocated path trains in tests/train/test_vllm_colocate.py."""
    assert_reward_rises(model_dir, one_prompt_jsonl, tmp_path / "grail", VLLM_LEARNING_SPEC, "grail")
