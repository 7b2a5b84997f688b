"""Helpers for the fault-injection tests: a shrunken CI study, running the real `snakemake` in a scratch
directory, finding the stage process a Snakemake job started, and waiting for files to appear."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from tests.shared_studies import CI_CONFIG, REPO, STUDY_KERNELS

MAX_STEPS = 12
SAVE_STEPS = 2
EXPORT_STEP = 4
RUN = "results/runs/tiny/grpo/seed0"
SAMPLES = "results/eval/tiny/grpo/seed0/final/arith_add.jsonl"
BENCHMARK = "eval_data/arith_add.jsonl"
BENCHMARK_ITEMS = 24
N_SAMPLES = 2


def small_study() -> dict:
    """The CI study shrunk to seconds of work: 1 method, 1 seed, 1 benchmark, 12 steps saved every 2 steps."""
    config = yaml.safe_load(CI_CONFIG.read_text(encoding="utf-8"))
    config["data"]["generated"]["count"] = 200
    config["benchmarks"] = {
        "arith_add": {
            "kind": "generated",
            "generated": {"count": BENCHMARK_ITEMS, "seed": 1001, "low": 0, "high": 9, "operations": ["+"]},
        }
    }
    config["models"]["tiny"]["warmup"].update(steps=20, batch_size=16)
    config["methods"] = {"grpo": {"credit": "grpo"}}
    config["seeds"] = [0]
    config["training"].update(
        max_steps=MAX_STEPS,
        save_steps=SAVE_STEPS,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=12,
        logging_steps=1,
    )
    # batch_size 1: one durable append per sample, so a kill lands between appends
    config["evaluation"].update(
        n_samples=N_SAMPLES, checkpoints=[EXPORT_STEP, "final"], baseline=False, batch_size=1, max_new_tokens=16
    )
    config["token_analysis"] = {"enabled": False}
    config["token_viewer"] = {"enabled": False}
    config["significance"]["resamples"] = 100
    return config


def write_study(directory: Path, config: dict | None = None) -> Path:
    """Write ``config`` (default: ``small_study()``) to ``directory/config.yaml``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config or small_study()), encoding="utf-8")
    return path


def stage_env(**extra: str) -> dict[str, str]:
    """The environment of a stage or Snakemake run: offline hub, the repository importable."""
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **STUDY_KERNELS,
        **extra,
    }


def snakemake_command(workdir: Path, *targets: str, rerun_incomplete: bool = True) -> list[str]:
    """`snakemake` on the repository's Snakefile, working in ``workdir`` with its config.yaml."""
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(workdir / "config.yaml"),
        "--cores",
        "1",
    ]
    if rerun_incomplete:
        command.append("--rerun-incomplete")
    return [*command, *targets]


def start_snakemake(
    workdir: Path, *targets: str, rerun_incomplete: bool = True, hooks: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """Start Snakemake in its own session (so the test can kill exactly its process group); ``hooks``: environment
    entries of ``tests.hold_stage`` for its stages (hold at a known point until signalled, pseudo-random reward)."""
    log = open(workdir / "snakemake.out", "a", encoding="utf-8")  # noqa: SIM115 (closed with the process)
    log.write(f"\n===== {' '.join(targets)}\n")
    log.flush()
    return subprocess.Popen(
        snakemake_command(workdir, *targets, rerun_incomplete=rerun_incomplete),
        cwd=workdir,
        env=stage_env(**(hooks or {})),
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def run_snakemake(workdir: Path, *targets: str, timeout: float = 600, hooks: dict[str, str] | None = None) -> int:
    """Run Snakemake to its end; its exit status."""
    process = start_snakemake(workdir, *targets, hooks=hooks)
    return process.wait(timeout=timeout)


def unlock(workdir: Path) -> None:
    """`snakemake --unlock`: what a user runs after Snakemake itself was killed (its lock stays behind)."""
    command = [*snakemake_command(workdir, rerun_incomplete=False), "--unlock"]
    subprocess.run(command, cwd=workdir, env=stage_env(), check=True, capture_output=True, timeout=120)


def snakemake_output(workdir: Path) -> str:
    return (workdir / "snakemake.out").read_text(encoding="utf-8")


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the command name (field 2) may hold spaces: the parent pid is the 2nd field after its closing ')'
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def command_line(pid: int) -> list[str]:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def stage_process(root: int, module: str) -> int | None:
    """The ``python -m <module>`` process among the descendants of ``root`` (a Snakemake this test started)."""
    pending = [root]
    while pending:
        pid = pending.pop()
        arguments = command_line(pid)
        if "-m" in arguments and arguments[arguments.index("-m") + 1 :][:1] == [module]:
            return pid
        pending.extend(children(pid))
    return None


def wait_until(condition: Callable[[], bool], what: str, process: subprocess.Popen | None = None, timeout=300) -> None:
    """Poll ``condition`` every 50 ms; fail if ``process`` ends first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the process ended (status {process.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout} s")
        time.sleep(0.05)


def signal_stage(snakemake: subprocess.Popen, module: str, signum: int) -> int:
    """Send ``signum`` to the ``python -m <module>`` process of ``snakemake``'s running job; its pid."""
    pid_box: list[int] = []

    def found() -> bool:
        pid = stage_process(snakemake.pid, module)
        if pid is not None:
            pid_box.append(pid)
        return pid is not None

    wait_until(found, f"{module} process", snakemake, timeout=60)
    os.kill(pid_box[0], signum)
    return pid_box[0]


def kill_session(process: subprocess.Popen) -> None:
    """SIGKILL the whole process group of ``process`` (Snakemake and its jobs: a lost node)."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps of the published checkpoints of a run, ascending."""
    return sorted(int(path.name.split("-")[1]) for path in (run_dir / "checkpoints").glob("checkpoint-*"))


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
