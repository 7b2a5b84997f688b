"""pipeline.launch: the command of each mode, checked with accelerate's own parser; a real CPU launch."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.commands.launch import launch_command_parser
from hypothesis import given
from hypothesis import strategies as st

from pipeline import launch
from pipeline.io import InputError
from pipeline.launch import (
    DEFAULT_ACCELERATE_CONFIG,
    UPSTREAM_MAIN_PORT,
    default_main_port,
    first_host,
    plan_launch,
    split_command_line,
)
from pipeline.preemption import PREEMPTED_EXIT_CODE

REPO = Path(__file__).resolve().parents[2]
TRAIN_ARGS = ["--seed", "3", "--out", "results/runs/m/grail/seed3"]
SLURM_TWO_NODES = {"SLURM_JOB_ID": "123456", "SLURM_JOB_NODELIST": "gpu[03-04]", "SLURM_JOB_NUM_NODES": "2"}


def plan(gpus: int, nodes: int, *, visible: int, env: dict[str, str] | None = None, **kwargs):
    return plan_launch(gpus, nodes, "pipeline.train", TRAIN_ARGS, visible_gpus=visible, env=env or {}, **kwargs)


def parse_accelerate(argv: list[str]):
    """Parse an `accelerate launch ...` command line with accelerate's own parser."""
    assert argv[:2] == ["accelerate", "launch"]
    return launch_command_parser().parse_args(argv[2:])


@pytest.mark.parametrize(("gpus", "nodes"), [(0, 1), (1, 1)])
def test_one_gpu_or_less_runs_one_plain_process(gpus: int, nodes: int) -> None:
    result = plan(gpus, nodes, visible=8, python="/py")
    assert result.mode == "single-process"
    assert result.argv == ["/py", "-m", "pipeline.train", *TRAIN_ARGS]


@pytest.mark.parametrize(("gpus", "nodes"), [(4, 1), (4, 2)])
def test_cpu_machine_falls_back_to_one_plain_process(gpus: int, nodes: int) -> None:
    result = plan(gpus, nodes, visible=0, env=SLURM_TWO_NODES, python="/py")
    assert result.mode == "single-process"
    assert result.argv == ["/py", "-m", "pipeline.train", *TRAIN_ARGS]
    assert "no CUDA device" in result.reason


def test_several_gpus_on_one_node_use_accelerate_zero2_one_process_per_gpu() -> None:
    result = plan(4, 1, visible=4, env={"SLURM_JOB_ID": "77"})
    assert result.mode == "single-node"
    args = parse_accelerate(result.argv)
    assert Path(args.config_file) == DEFAULT_ACCELERATE_CONFIG
    assert args.num_processes == 4
    assert args.main_process_port == 29500 + 77
    assert args.module and args.training_script == "pipeline.train"
    assert args.training_script_args == TRAIN_ARGS
    assert args.num_machines is None  # one machine, from the config file


def test_fewer_visible_gpus_than_requested_is_an_error() -> None:
    with pytest.raises(InputError, match="--gpus 4 requested but only 2"):
        plan(4, 1, visible=2)


def test_multi_node_runs_one_launcher_per_node_through_srun() -> None:
    heads = []
    result = plan(4, 2, visible=4, env=SLURM_TWO_NODES, head_host=lambda nodes: heads.append(nodes) or "gpu03")
    assert heads == ["gpu[03-04]"]
    assert result.mode == "multi-node"
    srun, launcher = (
        result.argv[: result.argv.index(sys.executable)],
        result.argv[result.argv.index(sys.executable) :],
    )
    assert srun == [
        "srun",
        "--overlap",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
    ]
    options, module, module_args = split_command_line(launcher[3:])
    assert launcher[1:3] == ["-m", "pipeline.launch"]
    assert (module, module_args) == ("pipeline.train", TRAIN_ARGS)
    assert options == [
        "--gpus", "4", "--nodes", "2", "--main-port", str(29500 + 456), "--main-process-ip", "gpu03",
        "--accelerate-config", str(DEFAULT_ACCELERATE_CONFIG),
    ]  # fmt: skip


def test_each_node_joins_the_rendezvous_with_its_slurm_rank() -> None:
    env = {**SLURM_TWO_NODES, "SLURM_NODEID": "1"}
    result = plan(4, 2, visible=4, env=env, main_port=29956, main_process_ip="gpu03")
    assert result.mode == "node"
    args = parse_accelerate(result.argv)
    assert (args.num_processes, args.num_machines, args.machine_rank) == (8, 2, 1)
    assert (args.main_process_ip, args.main_process_port, args.rdzv_backend) == ("gpu03", 29956, "static")
    assert args.same_network
    assert args.training_script == "pipeline.train" and args.training_script_args == TRAIN_ARGS


def test_per_node_launcher_outside_srun_is_an_error() -> None:
    with pytest.raises(InputError, match="SLURM_NODEID"):
        plan(4, 2, visible=4, env=SLURM_TWO_NODES, main_process_ip="gpu03")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "needs a Slurm allocation"),
        ({**SLURM_TWO_NODES, "SLURM_JOB_NUM_NODES": "1"}, "allocation has 1 node"),
    ],
)
def test_multi_node_needs_a_large_enough_allocation(env: dict[str, str], message: str) -> None:
    with pytest.raises(InputError, match=message):
        plan(4, 2, visible=4, env=env, head_host=lambda nodes: "unused")


@given(st.integers(min_value=0, max_value=10**9))
def test_slurm_ports_stay_in_their_range_and_depend_on_the_job_only(job_id: int) -> None:
    port = default_main_port({"SLURM_JOB_ID": str(job_id), "SLURM_NODEID": "3"})
    assert 29500 <= port < 30500
    assert port == default_main_port({"SLURM_JOB_ID": str(job_id)})


def test_outside_slurm_the_port_is_upstreams() -> None:
    assert default_main_port({}) == UPSTREAM_MAIN_PORT


def test_first_host_takes_the_first_line_of_scontrol() -> None:
    def fake_run(argv, **kwargs):
        assert argv == ["scontrol", "show", "hostnames", "gpu[03-04]"]
        return subprocess.CompletedProcess(argv, 0, stdout="gpu03\ngpu04\n")

    assert first_host("gpu[03-04]", run=fake_run) == "gpu03"


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="scontrol (slurm-client) is not installed")
def test_first_host_with_the_real_scontrol() -> None:
    assert first_host("gpu[07-09],cpu1") == "gpu07"


def test_the_command_line_needs_a_module_after_the_separator() -> None:
    assert split_command_line(["--gpus", "2", "--", "m", "--x", "--", "y"]) == (
        ["--gpus", "2"],
        "m",
        ["--x", "--", "y"],
    )
    with pytest.raises(InputError, match="missing `--`"):
        split_command_line(["--gpus", "2", "m"])
    with pytest.raises(InputError, match="no module"):
        split_command_line(["--gpus", "2", "--"])


def test_the_accelerate_config_is_upstreams_deepspeed_zero2() -> None:
    config = load_config_from_file(str(DEFAULT_ACCELERATE_CONFIG))
    assert config.distributed_type == "DEEPSPEED"
    assert config.deepspeed_config["zero_stage"] == 2
    assert config.deepspeed_config["offload_optimizer_device"] == "none"
    assert (config.mixed_precision, config.num_machines, config.use_cpu) == ("bf16", 1, False)


@pytest.mark.parametrize("gpus", [0, 4])
def test_real_cpu_launch_runs_the_module_in_one_process(tmp_path: Path, gpus: int) -> None:
    (tmp_path / "echo_stage.py").write_text(
        "import json, os, signal, sys\n"
        "usr1, term = (signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM))\n"
        "handover = {'usr1_ignored': usr1 == signal.SIG_IGN, 'term_default': term == signal.SIG_DFL}\n"
        "json.dump({'argv': sys.argv[1:], 'pid': os.getpid(), **handover}, open(sys.argv[-1], 'w'))\n"
        "sys.exit(3)\n"
    )
    record = tmp_path / "record.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
        "CUDA_VISIBLE_DEVICES": "",
    }
    command = [sys.executable, "-m", "pipeline.launch", "--gpus", str(gpus), "--nodes", "1"]
    process = subprocess.Popen(
        [*command, "--", "echo_stage", "--flag", "a b", str(record)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 3, stderr  # the module's exit status comes through
    assert "mode single-process" in stderr
    written = json.loads(record.read_text())
    assert written["argv"] == ["--flag", "a b", str(record)]
    assert written["pid"] == process.pid  # exec'd in place: signals reach the stage directly
    # Slurm's warning must not kill a launcher layer; the stage installs its own handler (tests/train).
    assert written["usr1_ignored"] and written["term_default"]


def test_a_signal_before_the_hand_over_exits_75_without_starting_the_stage(monkeypatch, capsys) -> None:
    def count_gpus_then_get_preempted() -> int:
        os.kill(os.getpid(), signal.SIGUSR1)  # arrives while torch would be counting the GPUs
        return 4

    def refuse_exec(*_args: object) -> None:
        raise AssertionError("the stage was started after a preemption signal")

    monkeypatch.setattr(launch, "visible_cuda_devices", count_gpus_then_get_preempted)
    monkeypatch.setattr(launch.os, "execvp", refuse_exec)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGUSR1, signal.SIGTERM)}
    try:
        with pytest.raises(SystemExit) as exit_info:
            launch.main(["--gpus", "4", "--", "pipeline.train"])
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert exit_info.value.code == PREEMPTED_EXIT_CODE
    assert "received SIGUSR1 before starting pipeline.train" in capsys.readouterr().err


def test_bad_counts_exit_2_with_a_message() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.launch", "--gpus", "-1", "--", "pipeline.train"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--gpus must be >= 0" in result.stderr
