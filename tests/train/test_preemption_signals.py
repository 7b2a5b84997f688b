"""Preemption signals before the first training step (imports, validation, model loading): the stage records them
from its start and exits with ``PREEMPTED_EXIT_CODE`` before training, instead of dying (status 138 for SIGUSR1)
or training a step it was asked not to start."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from train_support import REPO_ROOT, subprocess_env, train_command

import pipeline.train
from pipeline.core.exit_codes import PREEMPTED_EXIT_CODE
from pipeline.train import main

STOP_MESSAGE = "received {} before the first training step: stopping without a checkpoint"


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler installed for ``signum`` (the SigCgt mask of /proc/PID/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught >> (signum - 1) & 1)


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM])
def test_signal_while_loading_the_model_stops_before_training(
    untrained_model, train_jsonl, tmp_path, monkeypatch, caplog, signum
):
    """The signal arrives while the model loads; nothing may be trained or written, and the caller's handler
    comes back afterwards."""
    load_model = pipeline.train.load_model

    def load_model_then_signal(*args, **kwargs):
        model = load_model(*args, **kwargs)
        os.kill(os.getpid(), signum)
        return model

    def caller_handler(number: int, _frame: object) -> None:
        received_by_caller.append(number)

    monkeypatch.setattr(pipeline.train, "load_model", load_model_then_signal)
    received_by_caller: list[int] = []
    pytest_handler = signal.signal(signum, caller_handler)  # a stage that ignored the signal must not kill pytest
    run_dir = tmp_path / "run"
    try:
        with caplog.at_level(logging.WARNING, logger="pipeline.train"), pytest.raises(SystemExit) as exit_info:
            main(train_command(untrained_model, train_jsonl, run_dir)[3:])
        assert signal.getsignal(signum) is caller_handler
    finally:
        signal.signal(signum, pytest_handler)
    assert received_by_caller == []
    assert exit_info.value.code == PREEMPTED_EXIT_CODE
    assert STOP_MESSAGE.format(signal.Signals(signum).name) in caplog.text
    assert not [path for path in run_dir.rglob("*") if not path.is_dir()]  # (the Trainer makes its output_dir)


def test_usr1_during_imports_exits_75_without_traceback(untrained_model, train_jsonl, tmp_path):
    """SIGUSR1 as soon as the stage can catch it, while torch and transformers are still being imported."""
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        train_command(untrained_model, train_jsonl, run_dir),
        cwd=REPO_ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not catches(process.pid, signal.SIGUSR1):
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the stage never installed a SIGUSR1 handler"
        time.sleep(0.005)
    process.send_signal(signal.SIGUSR1)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == PREEMPTED_EXIT_CODE, stderr[-3000:]
    assert "Traceback" not in stderr
    assert STOP_MESSAGE.format("SIGUSR1") in stderr
    assert not run_dir.exists()


def test_warning_while_a_finished_run_shuts_down_leaves_exit_status_0(untrained_model, train_jsonl, tmp_path):
    """Slurm's time-limit warning can land after the run published its outputs, while the interpreter shuts down
    (which puts the default, fatal, action back for the signals Python handles): the stage still exits 0. Seen on
    the real cluster: a requeued attempt finished its training and died of the warning with status 138."""
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        train_command(untrained_model, train_jsonl, run_dir),
        cwd=REPO_ROOT,
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    provenance = run_dir / "provenance.json"  # the last output the stage publishes
    deadline = time.monotonic() + 300
    while not provenance.exists():
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run never published"
        time.sleep(0.005)
    warnings = 0
    while process.poll() is None:  # a zombie that is not yet reaped takes the signal harmlessly
        process.send_signal(signal.SIGUSR1)
        warnings += 1
        time.sleep(0.001)
    stderr = process.stderr.read()
    assert warnings > 0
    assert process.returncode == 0, (process.returncode, stderr[-3000:])
