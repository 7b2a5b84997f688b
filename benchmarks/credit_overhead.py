"""Speed and memory of the credit methods: every registered one (pipeline/credit/methods/: GRPO, GRAIL fast
every-step, OAR-G, the controls, ...), GRAIL's per-generation and reference paths, and any method named by import
path (``--methods grpo grail mylab.credit.halfway``).

    python benchmarks/credit_overhead.py [--device cpu|cuda] [--arch tiny-4x256|qwen3-0.6b | --model DIR] [--json PATH]

The model is a randomly initialised one (``--arch``: the 4-layer tiny Qwen3, or Qwen3-0.6B's architecture, both
with the character tokenizer) or any local causal LM directory with its tokenizer and chat template (``--model``,
loaded with ``pipeline.models.loading``'s loaders, as every stage loads it).

Every method trains on the same replayed rollouts (same prompts, completions, seeded random 0/1 rewards with every
group mixed, so no path can skip all of its work) with upstream's GRAIL settings: symmetry "wrong",
num_iterations 4, 8 completions per prompt, dr_grpo, no reward scaling. The rollouts are fixed worked-arithmetic
texts of the requested length in the model's tokens, ending in a ``\\boxed{}`` answer (so no row is skipped for
lack of an answer); the
generation itself is not timed (it is the same for every method), but everything else of a training step is: the
old-policy log-prob pass TRL makes at each round, the per-generation weights, forward, backward, optimizer.

Each (method, repeat) runs in a fresh process, methods interleaved and their order reversed on every other repeat.
Step time: per generation round (num_iterations optimizer steps), wall time / num_iterations; the median over the
measured rounds of all repeats (the first round of each run is a warm-up), as wall time and as the process's
CPU time (the steadier measure on a shared machine; CPU runs use ``--threads`` torch threads, 1 by default). Peak
memory: on CUDA
``torch.cuda.max_memory_allocated``; on the CPU the peak resident set size above the process's resident size just
before training (VmHWM after resetting it, minus VmRSS), i.e. the training working set.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from make_qwen3_shaped import build_qwen3_shaped, qwen3_shaped_config
from transformers import TrainerCallback
from trl import GRPOTrainer

from pipeline.core import kernels
from pipeline.core.io import InputError, atomic_write_json
from pipeline.credit.method import built_in_names, credit_method
from pipeline.models.loading import load_model, load_tokenizer
from pipeline.models.tiny_model import TinyModelSpec, build_model, build_tokenizer
from pipeline.tasks.arith import ArithmeticSpec, arithmetic_problems
from pipeline.tasks.generation import chat_prompt_ids
from pipeline.tasks.prompts import build_prompt
from pipeline.training.grpo_config import GrailGRPOConfig
from pipeline.training.trainer import GrailGRPOTrainer

NATIVE_SUFFIX = "@native"
METHODS = {
    **{name: {"credit": name} for name in built_in_names()},
    "grail_per_generation": {"credit": "grail", "grail_recompute": "per_generation"},
    "grail_reference": {"credit": "grail", "grail_implementation": "reference"},
}


def method_options(method: str) -> dict:
    """GrailGRPOConfig options of a benchmarked method: a row of METHODS, or an import path's method."""
    if method in METHODS:
        return METHODS[method]
    try:
        credit_method(method)  # an import path, dotted or not (the registry's rule)
    except InputError as error:
        raise SystemExit(f"--methods: {method!r} is not one of {list(METHODS)}, and {error}") from None
    return {"credit": method}


NUM_GENERATIONS = 8
NUM_ITERATIONS = 4


def build_benchmark_model(arch: str, tokenizer, seed: int):
    """A randomly initialised model: the 4-layer, hidden-256 tiny Qwen3, or Qwen3-0.6B's architecture (whose
    151,936-token vocabulary keeps the LM head's real cost although the character tokenizer uses ~100 ids)."""
    if arch == "tiny-4x256":
        spec = TinyModelSpec(
            hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4, head_dim=64, seed=seed
        )
        spec = TinyModelSpec(**{**spec.__dict__, "max_position_embeddings": 4096})
        return build_model(spec, tokenizer)
    config = qwen3_shaped_config(28, 1024, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    return build_qwen3_shaped(config, seed).to(torch.bfloat16)


def worked_completion(tokenizer, problem: str, answer: str, length: int, rng: random.Random) -> list[int]:
    """``length`` token ids of worked arithmetic for ``problem``, ending in ``\\boxed{answer}``.

    Each sentence is encoded on its own and the ids concatenated (a BPE may merge differently across sentence
    ends, which only shifts lengths by a token), so the length is exact in the model's own tokens."""

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    expression = problem.removesuffix("=?")
    ending = encode(f" So {expression}={answer}. \\boxed{{{answer}}}")
    body: list[int] = []
    while len(body) < length - len(ending):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        body += encode(f"Check {a}+{b}={a + b}. ")
    return body[: max(length - len(ending), 0)] + ending


def build_rounds(tokenizer, rounds: int, prompts_per_round: int, length: int, seed: int) -> list[dict[str, Any]]:
    """Replayable rollouts: per round, left-padded prompts, right-padded completions (+eos) and 0/1 rewards
    with every group of ``NUM_GENERATIONS`` mixed."""
    rng = random.Random(seed)
    problems = arithmetic_problems(ArithmeticSpec(count=rounds * prompts_per_round, seed=seed))
    out = []
    for index in range(rounds):
        prompts, completions, rewards = [], [], []
        for problem in problems[index * prompts_per_round : (index + 1) * prompts_per_round]:
            prompt = chat_prompt_ids(tokenizer, build_prompt(problem["problem"]))
            group = [float(rng.random() < 0.5) for _ in range(NUM_GENERATIONS)]
            if len(set(group)) == 1:
                group[rng.randrange(NUM_GENERATIONS)] = 1.0 - group[0]
            for reward in group:
                ids = worked_completion(
                    tokenizer, problem["problem"], problem["answer"], rng.randint(length * 3 // 4, length), rng
                )
                prompts.append(prompt)
                completions.append([*ids, tokenizer.eos_token_id])
                rewards.append(reward)
        out.append({"prompts": prompts, "completions": completions, "rewards": rewards})
    return out


def padded(rows: list[list[int]], pad: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) of ``rows`` padded to the longest one, on the left or the right."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, values in enumerate(rows):
        span = slice(width - len(values), width) if left else slice(0, len(values))
        ids[row, span], mask[row, span] = torch.tensor(values), 1
    return ids, mask


class ReplayedRollouts(GRPOTrainer):
    """TRL's generation step replaced by the next replayed round (see module docstring)."""

    rounds: list[dict[str, Any]]
    round_index: int = 0

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """What TRL's generation step returns: ids, masks, group-centred advantages, old-policy log-probs."""
        replay = self.rounds[self.round_index % len(self.rounds)]
        self.round_index += 1
        device = self.accelerator.device
        prompt_ids, prompt_mask = padded(replay["prompts"], self.processing_class.pad_token_id, left=True)
        completion_ids, completion_mask = padded(replay["completions"], self.processing_class.pad_token_id, left=False)
        rewards = torch.tensor(replay["rewards"])
        advantages = rewards - rewards.view(-1, NUM_GENERATIONS).mean(1).repeat_interleave(NUM_GENERATIONS)
        batch = {
            "prompt_ids": prompt_ids.to(device),
            "prompt_mask": prompt_mask.to(device),
            "completion_ids": completion_ids.to(device),
            "completion_mask": completion_mask.to(device),
            "advantages": advantages.to(device),
            "num_items_in_batch": completion_mask.sum().to(device),
        }
        with torch.no_grad():  # TRL's old-policy pass (generation and optimisation steps are misaligned)
            batch["old_per_token_logps"] = self._get_per_token_logps_and_entropies(
                self.model,
                torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
                torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1),
                completion_ids.size(1),
                batch_size=self.args.per_device_train_batch_size,
            )[0]
        return batch


class ReplayTrainer(GrailGRPOTrainer, ReplayedRollouts):
    """GrailGRPOTrainer whose ``super()._generate_and_score_completions`` is the replay."""


class RoundTimer(TrainerCallback):
    """Wall and process CPU time of each generation round (``NUM_ITERATIONS`` optimizer steps), from step ends."""

    def __init__(self) -> None:
        self.start()

    def start(self) -> None:
        self.step_ends: list[tuple[float, float]] = [(time.perf_counter(), time.process_time())]

    def on_step_end(self, args, state, control, **kwargs):
        self.step_ends.append((time.perf_counter(), time.process_time()))

    def round_times(self, clock: int) -> list[float]:
        """Per round: wall seconds (clock 0) or CPU seconds of all the process's threads (clock 1)."""
        ends = self.step_ends[::NUM_ITERATIONS]
        return [later[clock] - earlier[clock] for earlier, later in itertools.pairwise(ends)]


def _proc_status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def run_worker(method: str, workdir: Path, options: dict[str, Any]) -> dict[str, Any]:
    """Train ``method`` on the replayed rounds; returns round times, peak memory and the saliency row fraction."""
    cuda = options["device"] == "cuda"
    if not cuda:
        torch.set_num_threads(options["threads"])
    model_dir = str(options["model"] or workdir / "model")
    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir, dtype=torch.bfloat16 if cuda else torch.float32)
    rounds = torch.load(workdir / "rounds.pt")
    measured = options["warmup_rounds"] + options["rounds"]
    prompts_per_round = len(rounds[0]["prompts"]) // NUM_GENERATIONS
    rows = [{"prompt": [{"role": "user", "content": "1+1=?"}], "solution": "2"}] * prompts_per_round * measured
    args = GrailGRPOConfig(
        output_dir=str(workdir / f"out-{method}"),
        per_device_train_batch_size=NUM_GENERATIONS,
        gradient_accumulation_steps=prompts_per_round,
        num_generations=NUM_GENERATIONS,
        num_iterations=NUM_ITERATIONS,
        max_completion_length=max(len(c) for r in rounds for c in r["completions"]),
        max_steps=measured * NUM_ITERATIONS,
        learning_rate=1e-6,
        loss_type="dr_grpo",
        scale_rewards="none",
        beta=0.0,
        grail_symmetry="wrong",
        gradient_checkpointing=False,
        bf16=cuda,
        use_cpu=not cuda,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        seed=options["seed"],
        **method_options(method),
    )
    timer = RoundTimer()
    trainer = ReplayTrainer(
        model=model,
        reward_funcs=[lambda completions, **_: [0.0] * len(completions)],  # unused: rewards are replayed
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[timer],
    )
    trainer.rounds = rounds
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident size (VmHWM)
        baseline_kb = _proc_status_kb("VmRSS")
    timer.start()
    trainer.train()
    if cuda:
        torch.cuda.synchronize()
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak_mb = (_proc_status_kb("VmHWM") - baseline_kb) / 1024
    fractions = [e[key] for e in trainer.state.log_history for key in e if key.endswith("/saliency_rows_frac")]
    return {
        "model_shape": model_shape(model),
        "kernel_path": kernels.kernel_path(),
        "round_times_s": timer.round_times(0)[options["warmup_rounds"] :],
        "round_cpu_times_s": timer.round_times(1)[options["warmup_rounds"] :],
        "peak_mem_mb": peak_mb,
        "saliency_rows_frac": statistics.fmean(fractions) if fractions else None,
    }


def model_shape(model) -> dict[str, int]:
    """Parameters, vocabulary rows, layers and hidden size of the trained model."""
    config = model.config.get_text_config()
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": config.vocab_size,
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
    }


def prepare(workdir: Path, options: dict[str, Any]) -> dict[str, float]:
    """Save the replayed rounds that every worker loads, and the model and tokenizer unless ``--model`` gives one;
    returns the rounds' mean prompt and completion lengths in tokens."""
    if options["model"]:
        tokenizer = load_tokenizer(options["model"])
    else:
        tokenizer = build_tokenizer()
        build_benchmark_model(options["arch"], tokenizer, options["seed"]).save_pretrained(workdir / "model")
        tokenizer.save_pretrained(workdir / "model")
    rounds = build_rounds(
        tokenizer,
        options["warmup_rounds"] + options["rounds"],
        options["prompts_per_round"],
        options["completion_length"],
        options["seed"],
    )
    torch.save(rounds, workdir / "rounds.pt")
    return {
        "prompt_tokens_mean": statistics.fmean(len(p) for r in rounds for p in r["prompts"]),
        "completion_tokens_mean": statistics.fmean(len(c) for r in rounds for c in r["completions"]),
    }


def run_label(method: str, pinned: bool) -> str:
    """A run's row: the method, ``@native`` when it ran with the kernel pin off."""
    return method if pinned else f"{method}{NATIVE_SUFFIX}"


def summarise(results: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per method: median step time, wall and CPU (round time / num_iterations), peak memory (max over runs),
    each also over GRPO's from the same run (``*_x_grpo``), and the fraction of rows needing a saliency pass."""
    summary = {}
    for method, runs in results.items():
        times = [t / NUM_ITERATIONS for run in runs for t in run["round_times_s"]]
        cpu_times = [t / NUM_ITERATIONS for run in runs for t in run["round_cpu_times_s"]]
        fractions = [run["saliency_rows_frac"] for run in runs if run["saliency_rows_frac"] is not None]
        summary[method] = {
            "step_time_s": statistics.median(times),
            "step_cpu_time_s": statistics.median(cpu_times),
            "peak_mem_mb": max(run["peak_mem_mb"] for run in runs),
            "saliency_rows_frac": statistics.fmean(fractions) if fractions else None,
            "rounds_measured": len(times),
        }
    base = dict(summary["grpo"] if "grpo" in summary else summary[run_label("grpo", False)])
    for row in summary.values():
        for key in ("step_time_s", "step_cpu_time_s", "peak_mem_mb"):
            row[f"{key.rsplit('_', 1)[0]}_x_grpo"] = row[key] / base[key]
    for label, row in summary.items():
        if (native := summary.get(run_label(label, False))) is not None and not label.endswith(NATIVE_SUFFIX):
            # the pin's cost: pinned over native, same method, same run
            row["step_cpu_time_x_native"] = row["step_cpu_time_s"] / native["step_cpu_time_s"]
    return summary


def table(summary: dict[str, dict[str, float]], memory_label: str) -> str:
    lines = [
        f"| method | step time (s, median) | x GRPO | CPU time/step (s) | x GRPO | {memory_label} (MB) | x GRPO "
        "| rows needing saliency |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method, row in summary.items():
        fraction = "-" if row["saliency_rows_frac"] is None else f"{row['saliency_rows_frac']:.2f}"
        lines.append(
            f"| {method} | {row['step_time_s']:.3f} | {row['step_time_x_grpo']:.2f} | "
            f"{row['step_cpu_time_s']:.3f} | {row['step_cpu_time_x_grpo']:.2f} | "
            f"{row['peak_mem_mb']:.0f} | {row['peak_mem_x_grpo']:.2f} | {fraction} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    model_choice = parser.add_mutually_exclusive_group()
    model_choice.add_argument("--arch", choices=["tiny-4x256", "qwen3-0.6b"], default=None)
    model_choice.add_argument("--model", default=None, help="a local causal LM directory (model + tokenizer)")
    parser.add_argument("--completion-length", type=int, default=None, help="max completion tokens (64+)")
    parser.add_argument("--prompts-per-round", type=int, default=2, help="= gradient accumulation steps")
    parser.add_argument("--rounds", type=int, default=3, help="measured generation rounds per run")
    parser.add_argument("--warmup-rounds", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--methods", nargs="+", default=list(METHODS), help=f"of {list(METHODS)}, or a module's import path"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="CPU: torch threads per run (1: stable timings)")
    parser.add_argument(
        "--kernel-pin",
        choices=["on", "off", "both"],
        default="on",
        help="CPU kernel path of the runs (pipeline.core.kernels): pinned (as every stage), native, or both side by side"
        " (the native runs listed as METHOD@native, with the pin's cost per method)",
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="write {settings: {...}, methods: {method: {step_time_s, ...}}}"
    )
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    options = {
        "device": args.device,
        "model": args.model,
        "arch": None if args.model else args.arch or ("qwen3-0.6b" if cuda else "tiny-4x256"),
        "completion_length": args.completion_length or (1024 if cuda else 96),
        "prompts_per_round": args.prompts_per_round,
        "rounds": args.rounds,
        "warmup_rounds": args.warmup_rounds,
        "seed": args.seed,
        "threads": args.threads,
    }
    if args.worker:
        print(json.dumps(run_worker(args.worker, args.workdir, options)))
        return
    if "grpo" not in args.methods:
        parser.error("--methods must include grpo (the baseline of every ratio)")
    if args.model and not Path(args.model).is_dir():
        parser.error(f"--model {args.model}: not a directory (a local causal LM with its tokenizer)")
    variants = {"on": [True], "off": [False], "both": [True, False]}[args.kernel_pin]
    runs = [(method, pinned) for method in args.methods for pinned in variants]
    results: dict[str, list[dict[str, Any]]] = {run_label(*run): [] for run in runs}
    with tempfile.TemporaryDirectory(prefix="credit_overhead_") as directory:
        workdir = Path(directory)
        lengths = prepare(workdir, options)
        for repeat in range(args.repeats):
            for method, pinned in runs if repeat % 2 == 0 else runs[::-1]:
                command = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:])]
                command += ["--worker", method, "--workdir", str(workdir)]
                label = run_label(method, pinned)
                print(f"repeat {repeat + 1}/{args.repeats}: {label}", file=sys.stderr, flush=True)
                environment = kernels.pinned_environment() if pinned else kernels.unpinned_environment()
                done = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True, env=environment)
                results[label].append(json.loads(done.stdout.strip().splitlines()[-1]))
    settings = {
        **options,
        **lengths,
        "repeats": args.repeats,
        "model_shape": next(iter(results.values()))[0]["model_shape"],
        "memory": "peak CUDA memory" if cuda else "peak RSS above pre-training",
        "kernel_pin": args.kernel_pin,
        "cpu_model": kernels.cpu_model(),
        "kernel_paths": {label: label_runs[0]["kernel_path"] for label, label_runs in results.items()},
    }
    summary = summarise(results)
    shape = settings["model_shape"]
    print(
        f"device={args.device} model={args.model or options['arch']} ({shape['parameters'] / 1e6:.1f} M parameters, "
        f"vocab {shape['vocab_size']}, {shape['layers']} layers x {shape['hidden_size']}) "
        f"completions<={options['completion_length']} tokens (mean {lengths['completion_tokens_mean']:.0f}), "
        f"prompts mean {lengths['prompt_tokens_mean']:.0f} tokens"
    )
    print(table(summary, settings["memory"]))
    for label, row in summary.items():
        if "step_cpu_time_x_native" in row:
            print(f"kernel pin cost, {label}: CPU time per step x{row['step_cpu_time_x_native']:.3f} of native")
    if args.json:
        atomic_write_json(args.json, {"settings": settings, "methods": summary})


if __name__ == "__main__":
    main()
