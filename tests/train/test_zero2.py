"""DeepSpeed ZeRO-2, the paper's training engine, on two CPU processes through the project's own launcher
(``pipeline.launch --gpus 2 --accelerate-config configs/accelerate/zero2.yaml``: gloo, fp32): the same training as
DDP, DeepSpeed's checkpoint at a preemption and a resume, a damaged checkpoint, the published model.

ZeRO-2 against DDP: the same arithmetic in fp32, except the order in which the two engines sum the ranks'
gradients (DeepSpeed reduces its flattened gradient partitions, DDP its own buckets over gloo). That reorders
float32 sums, a few ulp (about 1e-7 relative) per step; over 4 Adam steps at learning rate 3e-3 the weights
measured here differed by at most 6e-7 and the losses by 1e-7 relative. The tolerances below (weights 1e-5 absolute,
losses and gradient norms 1e-4 relative) leave an order of magnitude for that and nothing for a real difference:
a GRAIL credit changed by 1 % under DeepSpeed only fails them, as does a gradient averaged over the wrong number
of processes (the logged gradient norm). As in test_train_run, the runs train on the pseudo-random reward of
``tests.hold_stage`` so that every step has a gradient.

Checked by breaking the code each test guards: without the gloo backend (pipeline.train.process_group_options)
every ZeRO-2 run fails; without ``without_tied_copies`` the published model carries its own lm_head.weight; with
DeepSpeed's optimizer states left unloaded at the resume the resumed weights differ; without the shard check the
damaged checkpoint is taken as valid."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from test_train_run import (
    REWARD,
    assert_gradient_after,
    assert_same_weights,
    interrupt_after_checkpoint,
    metrics,
    newest_checkpoint_step,
    step_lines,
)
from train_support import REPO_ROOT, launch_two, run_train, train_command
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.exit_codes import PREEMPTED_EXIT_CODE
from pipeline.resume import checkpoint_problem, newest_valid_checkpoint

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow
ZERO2_CONFIG = REPO_ROOT / "configs" / "accelerate" / "zero2.yaml"
METHODS = {"grail": {"credit": "grail"}, "oar_g": {"credit": "oar_g", "oar_g_noise_std": 1.0}}
COMPARED_METRICS = ("loss", "grad_norm")


def launch_zero2(train: list[str]) -> list[str]:
    """``launch_two`` with the DeepSpeed ZeRO-2 accelerate config (the study's ``training_engine: zero2``)."""
    command = launch_two(train)
    separator = command.index("--")
    return [*command[:separator], "--accelerate-config", str(ZERO2_CONFIG), *command[separator:]]


def train(command: list[str]) -> str:
    result = run_train(command, REWARD)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr


@pytest.fixture(scope="module")
def runs(model_dir, train_jsonl, tmp_path_factory) -> dict[tuple[str, str], Path]:
    """4-step runs of GRAIL and OAR-G under ZeRO-2 and DDP, two processes each: ``(method, engine) -> run dir``."""
    root = tmp_path_factory.mktemp("zero2")
    made = {}
    for method, method_spec in METHODS.items():
        for engine, launch in (("zero2", launch_zero2), ("ddp", launch_two)):
            run_dir = root / method / engine
            stderr = train(launch(train_command(model_dir, train_jsonl, run_dir, method_spec=method_spec)))
            assert ("DeepSpeed ZeRO-2 over gloo" in stderr) == (engine == "zero2")
            made[method, engine] = run_dir
    return made


def assert_close_weights(first: Path, second: Path) -> None:
    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-5, msg=name)


@pytest.mark.parametrize("method", METHODS)
def test_zero2_trains_as_ddp(runs, method) -> None:
    zero2, ddp = runs[method, "zero2"], runs[method, "ddp"]
    assert step_lines(zero2) == step_lines(ddp) == [1, 2, 3, 4]
    assert_gradient_after(zero2, 0)
    for ours, theirs in zip(metrics(zero2)[:4], metrics(ddp)[:4], strict=True):
        for key in COMPARED_METRICS:
            assert ours[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-7), (ours["step"], key)
    assert_close_weights(zero2 / "final", ddp / "final")


def test_zero2_checkpoints_shard_the_optimizer_per_rank(runs) -> None:
    checkpoint = runs["grail", "zero2"] / "checkpoints" / "checkpoint-4"
    assert (checkpoint / "latest").read_text().strip() == "global_step4"
    assert {path.name for path in (checkpoint / "global_step4").iterdir()} >= {
        "mp_rank_00_model_states.pt",
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    }
    assert not (checkpoint / "optimizer.pt").exists() and checkpoint_problem(checkpoint) is None


def test_a_checkpoint_missing_a_rank_shard_is_damaged_and_skipped(runs, tmp_path) -> None:
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(runs["grail", "zero2"] / "checkpoints", checkpoints)
    (checkpoints / "checkpoint-4" / "global_step4" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    assert checkpoint_problem(checkpoints / "checkpoint-4") == (
        "DeepSpeed state missing in global_step4/: zero_pp_rank_1_mp_rank_00_optim_states.pt"
    )
    assert newest_valid_checkpoint(checkpoints) == (2, checkpoints / "checkpoint-2")


def test_the_published_model_keeps_the_tied_embeddings_and_generates_as_ddps(runs, model_dir) -> None:
    final, ddp_final = runs["grail", "zero2"] / "final", runs["grail", "ddp"] / "final"
    with (
        safe_open(final / "model.safetensors", framework="pt") as ours,
        safe_open(model_dir / "model.safetensors", framework="pt") as source,
    ):
        assert set(ours.keys()) == set(source.keys())  # no separate lm_head.weight
    model = AutoModelForCausalLM.from_pretrained(final)
    assert model.lm_head.weight is model.get_input_embeddings().weight
    tokenizer = AutoTokenizer.from_pretrained(final)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "1+1=?"}], tokenize=False, add_generation_prompt=True
    )
    inputs = tokenizer([prompt], return_tensors="pt")
    ddp_model = AutoModelForCausalLM.from_pretrained(ddp_final)
    ours, theirs = (m.generate(**inputs, max_new_tokens=12, do_sample=False) for m in (model, ddp_model))
    assert torch.equal(ours, theirs)


def test_preempted_zero2_run_exits_75_and_resumes_to_the_same_weights(runs, model_dir, train_jsonl, tmp_path) -> None:
    """SIGTERM to the launcher after checkpoint-2: both ranks save checkpoint-3 (DeepSpeed's shards included) and
    exit 75; the rerun loads every rank's optimizer shard and ends with the uninterrupted run's weights."""
    run_dir = tmp_path / "run"
    command = launch_zero2(train_command(model_dir, train_jsonl, run_dir, method_spec=METHODS["grail"]))
    interrupted = interrupt_after_checkpoint(command, run_dir, signal.SIGTERM)
    assert interrupted.returncode == PREEMPTED_EXIT_CODE, interrupted.stderr[-3000:]
    assert "every stage process exited 75 (accelerate exited 1): exiting 75" in interrupted.stderr
    assert newest_checkpoint_step(run_dir) == 3
    assert checkpoint_problem(run_dir / "checkpoints" / "checkpoint-3") is None
    rerun = train(command)
    assert f"resuming from {run_dir / 'checkpoints' / 'checkpoint-3'} (step 3)" in rerun
    assert step_lines(run_dir) == [1, 2, 3, 4]
    assert_gradient_after(run_dir, 3)
    assert_same_weights(run_dir / "final", runs["grail", "zero2"] / "final")
