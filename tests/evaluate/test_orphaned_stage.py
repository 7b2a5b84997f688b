"""A stage of a Snakemake job whose wrapper is killed publishes nothing (pipeline.core.orphans): real processes under
a real `bash -c` wrapper (`; true` after the command keeps bash from exec'ing it, as a rule with more than one
command does), with the invocation id in their environment as a controller puts it there.

- A real evaluation, held after its first rows (``tests.hold_stage``), ends when its wrapper is killed: no samples
  file, no seal.
- A wrapper killed before the stage asked to die with it (during its imports, say): the stage exits at its request
  (``die_with_parent``), and a process that reaches the publish step anyway renames nothing."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from pipeline.core.exit_codes import INVOCATION_VARIABLE
from pipeline.core.seal import seal_path
from tests.evaluate.conftest import FAST_SPEC, benchmark_rows, write_jsonl
from tests.evaluate.test_evaluate_kill import REPO, evaluate_command
from tests.hold_stage import hold_evaluation_env

HELD_AFTER = 2
JOB_ENV = {"PYTHONPATH": str(REPO), INVOCATION_VARIABLE: "test-invocation"}


def wrapped(command: list[str], stderr: Path, env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    """``command`` under a `bash -c` wrapper that stays its parent; (the wrapper, the command's pid)."""
    wrapper = subprocess.Popen(
        ["bash", "-c", f"{shlex.join(command)} 2> {shlex.quote(str(stderr))}; true"],
        cwd=REPO,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not (found := psutil.Process(wrapper.pid).children()):
        assert time.monotonic() < deadline, "the wrapper started no process within 30 s"
        time.sleep(0.02)
    return wrapper, found[0].pid


def kill_wrapper(wrapper: subprocess.Popen, stage: int) -> None:
    wrapper.send_signal(signal.SIGKILL)
    wrapper.wait(timeout=30)
    assert psutil.Process(stage).ppid() != wrapper.pid


def wait_for(condition, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.05)


def ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_an_evaluation_whose_wrapper_is_killed_ends_without_publishing(tiny_model_dir, tmp_path) -> None:
    bench = write_jsonl(tmp_path / "bench.jsonl", benchmark_rows(6))
    out = tmp_path / "eval" / "bench.jsonl"
    stderr = tmp_path / "evaluate.stderr"
    command = evaluate_command(tiny_model_dir, bench, {**FAST_SPEC, "batch_size": 1}, out)
    wrapper, stage = wrapped(command, stderr, {**JOB_ENV, **hold_evaluation_env(HELD_AFTER)})
    try:
        wait_for(lambda: "test hook: holding" in stderr.read_text(encoding="utf-8"), "hold", timeout=120)
        kill_wrapper(wrapper, stage)
        wait_for(lambda: ended(stage), "end of the stage after its wrapper was killed")
    finally:
        if not ended(stage):
            os.kill(stage, signal.SIGKILL)
    assert not out.exists() and not seal_path(out).exists(), stderr.read_text(encoding="utf-8")[-3000:]


def held_before_start(tmp_path: Path, body: str) -> Path:
    """A process under a wrapper that imports ``pipeline`` (as a stage does first), then waits until its wrapper is
    killed before it runs ``body``; its stderr."""
    ready, go, stderr = tmp_path / "ready", tmp_path / "go", tmp_path / "stage.stderr"
    script = "\n".join(["import pathlib, time", "import pipeline", f"pathlib.Path({str(ready)!r}).touch()",
                        f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.02)", body])  # fmt: skip
    wrapper, stage = wrapped([sys.executable, "-c", script], stderr, JOB_ENV)
    wait_for(ready.exists, "import of pipeline")
    kill_wrapper(wrapper, stage)
    go.touch()
    wait_for(lambda: ended(stage), "end of the stage")
    return stderr


def test_a_stage_whose_wrapper_died_before_it_started_exits(tmp_path) -> None:
    out = tmp_path / "out.txt"
    body = f"from pipeline.core.io import atomic_write_text, run_cli\nrun_cli(lambda argv: atomic_write_text({str(out)!r}, 'x'))"
    stderr = held_before_start(tmp_path, body)
    assert "has ended: not running on" in stderr.read_text(encoding="utf-8")
    assert not out.exists()


def test_a_stage_whose_wrapper_died_publishes_nothing(tmp_path) -> None:
    out = tmp_path / "out.txt"
    body = f"from pipeline.core.io import atomic_write_text\natomic_write_text({str(out)!r}, 'x')"
    stderr = held_before_start(tmp_path, body)
    text = stderr.read_text(encoding="utf-8")
    assert f"{out}: not published: the job's wrapper (pid" in text, text[-3000:]
    assert not out.exists() and not list(tmp_path.glob(".out.txt.*"))
