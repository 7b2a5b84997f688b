"""pipeline.launch: the command of each mode, checked with accelerate's own parser; a real CPU launch."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.commands.launch import launch_command_parser
from hypothesis import given
from hypothesis import strategies as st

from pipeline import launch
from pipeline.core.exit_codes import PREEMPTED_EXIT_CODE, STALL_EXIT_CODE
from pipeline.core.io import InputError
from pipeline.launch import split_command_line
from pipeline.runtime.launching import (
    CPU_ACCELERATE_CONFIG,
    DEFAULT_ACCELERATE_CONFIG,
    GPU_DDP_ACCELERATE_CONFIG,
    THREAD_VARIABLES,
    UPSTREAM_MAIN_PORT,
    default_main_port,
    first_host,
    plan_launch,
    threads_per_process,
    training_processes,
)
from pipeline.runtime.supervision import agreed_exit_status

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


@pytest.mark.parametrize(("gpus", "nodes", "processes"), [(2, 1, 2), (4, 1, 4), (4, 2, 8), (1, 2, 2)])
def test_cpu_machine_runs_every_requested_process_under_accelerate(gpus: int, nodes: int, processes: int) -> None:
    result = plan(gpus, nodes, visible=0, env={**SLURM_TWO_NODES, "OMP_NUM_THREADS": "16"}, python="/py")
    assert result.mode == "cpu" and result.supervised
    assert result.local_processes == processes == training_processes(gpus, nodes)
    args = parse_accelerate(result.argv)
    assert Path(args.config_file) == CPU_ACCELERATE_CONFIG
    assert args.multi_gpu  # accelerate's torchrun launcher (its CPU launcher needs MPI for several processes)
    assert (args.num_processes, args.main_process_port) == (processes, 0)  # all here, on a free port
    assert args.num_cpu_threads_per_process == 16 // processes
    assert args.module and args.training_script == "pipeline.train" and args.training_script_args == TRAIN_ARGS
    assert args.num_machines is None  # one machine, from the config file
    threads = str(16 // processes)
    assert result.env == {"ACCELERATE_USE_CPU": "true", **dict.fromkeys(THREAD_VARIABLES, threads)}
    assert "no CUDA device is visible" in result.reason


@pytest.mark.parametrize(
    ("processes", "env", "available", "expected"),
    [
        (2, {"OMP_NUM_THREADS": "2"}, 64, 1),  # Snakemake's threads for the job, split
        (2, {"OMP_NUM_THREADS": "5"}, 64, 2),
        (4, {"OMP_NUM_THREADS": "2"}, 64, 1),  # never fewer than one
        (2, {}, 8, 4),  # outside Snakemake: the CPUs this process may use
        (2, {"OMP_NUM_THREADS": "x"}, 6, 3),
    ],
)
def test_threads_are_split_between_the_processes(processes, env, available, expected) -> None:
    assert threads_per_process(processes, env, available) == expected


def test_cpu_threads_come_from_the_available_cpus_without_omp_num_threads() -> None:
    result = plan(2, 1, visible=0, available_cpus=6)
    assert parse_accelerate(result.argv).num_cpu_threads_per_process == 3


def test_gpu_modes_and_the_plain_process_keep_their_launch() -> None:
    assert not plan(1, 1, visible=0).supervised  # exec'd in place
    assert plan(4, 1, visible=4).supervised and plan(4, 1, visible=4).local_processes == 4
    assert plan(4, 1, visible=4).env == {}


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


def test_cpu_processes_run_zero2_when_the_engine_or_the_config_file_asks() -> None:
    """DeepSpeed on CPU processes: no --multi_gpu (it would override the config's DeepSpeed) and no
    ACCELERATE_USE_CPU (the Trainer would skip DeepSpeed); the training spec's fp32 passed as the precision."""
    spec = ["--training-spec", json.dumps({"bf16": False}), "--method-spec", "{}"]
    for options in ({"engine": "zero2"}, {"accelerate_config": DEFAULT_ACCELERATE_CONFIG}):
        result = plan_launch(2, 1, "pipeline.train", spec, visible_gpus=0, env={"OMP_NUM_THREADS": "2"}, **options)
        args = parse_accelerate(result.argv)
        assert Path(args.config_file) == DEFAULT_ACCELERATE_CONFIG and not args.multi_gpu
        assert (args.num_processes, args.mixed_precision, args.training_script_args) == (2, "no", spec)
        assert result.env == {"DS_ACCELERATOR": "cpu", **dict.fromkeys(THREAD_VARIABLES, "1")}
        assert "DeepSpeed ZeRO-2 over gloo" in result.reason


@pytest.mark.parametrize(
    ("engine", "visible", "config"),
    [
        ("auto", 0, CPU_ACCELERATE_CONFIG),
        ("auto", 4, DEFAULT_ACCELERATE_CONFIG),
        ("zero2", 0, DEFAULT_ACCELERATE_CONFIG),
        ("ddp", 0, CPU_ACCELERATE_CONFIG),
        ("ddp", 4, GPU_DDP_ACCELERATE_CONFIG),
    ],
)
def test_the_engine_picks_the_accelerate_config(engine, visible, config) -> None:
    assert Path(parse_accelerate(plan(4, 1, visible=visible, engine=engine).argv).config_file) == config


@pytest.mark.parametrize(
    ("training", "method", "precision"),
    [
        ({"bf16": True}, {}, "bf16"),
        ({}, {}, "bf16"),
        ({"bf16": True}, {"bf16": False}, "no"),
        ({"fp16": True}, {}, "fp16"),
    ],
)
def test_the_precision_follows_the_merged_training_spec(training, method, precision) -> None:
    """TRL's GRPOConfig turns bf16 on when neither bf16 nor fp16 is set; the method spec wins."""
    spec = ["--training-spec", json.dumps(training), "--method-spec", json.dumps(method)]
    for visible in (0, 4):
        result = plan_launch(4, 1, "pipeline.train", spec, visible_gpus=visible, env={}, engine="zero2")
        assert parse_accelerate(result.argv).mixed_precision == precision


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
        "--accelerate-config", str(DEFAULT_ACCELERATE_CONFIG), "--time-limit-warning", "0",
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
    ("engine", "multi_gpu", "device_env"),
    [("auto", True, {"ACCELERATE_USE_CPU": "true"}), ("zero2", False, {"DS_ACCELERATOR": "cpu"})],
)
def test_a_per_node_launcher_without_cuda_runs_its_share_on_cpu_processes(engine, multi_gpu, device_env) -> None:
    """The node mode on CPU machines (tests/train/test_zero2.py runs it on localhost): this machine's processes
    only, the cpu mode's engine options, the rank from --machine-rank (it wins over srun's SLURM_NODEID)."""
    env = {**SLURM_TWO_NODES, "SLURM_NODEID": "0", "OMP_NUM_THREADS": "4"}
    result = plan(1, 2, visible=0, env=env, engine=engine, main_port=4321, main_process_ip="10.0.0.1", machine_rank=1)
    assert (result.mode, result.local_processes) == ("node", 1)
    args = parse_accelerate(result.argv)
    assert (args.num_processes, args.num_machines, args.machine_rank) == (2, 2, 1)
    assert (args.main_process_ip, args.main_process_port, args.rdzv_backend) == ("10.0.0.1", 4321, "static")
    assert (args.multi_gpu, args.num_cpu_threads_per_process) == (multi_gpu, 4)
    assert result.env == {**device_env, **dict.fromkeys(THREAD_VARIABLES, "4")}
    assert "no CUDA device visible: 1 CPU process(es) here" in result.reason


def test_a_per_node_launcher_takes_its_rank_from_the_command_line_outside_slurm() -> None:
    result = plan(4, 2, visible=4, main_process_ip="gpu03", machine_rank=0)
    assert (result.mode, parse_accelerate(result.argv).machine_rank) == ("node", 0)


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


def test_the_gpu_ddp_accelerate_config_is_multi_gpu() -> None:
    config = load_config_from_file(str(GPU_DDP_ACCELERATE_CONFIG))
    assert (config.distributed_type, config.use_cpu, config.num_machines) == ("MULTI_GPU", False, 1)


def test_the_cpu_accelerate_config_is_multi_cpu_in_full_precision() -> None:
    config = load_config_from_file(str(CPU_ACCELERATE_CONFIG))
    assert (config.distributed_type, config.use_cpu, config.mixed_precision) == ("MULTI_CPU", True, "no")
    assert config.num_machines == 1


def launcher_env(stage_dir: Path, **extra: str) -> dict[str, str]:
    """The launcher's environment: the stage modules importable, no CUDA device (the cpu mode even on a GPU host)."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(stage_dir), str(REPO)]),
        "CUDA_VISIBLE_DEVICES": "",
        **extra,
    }


def test_real_cpu_launch_runs_the_module_in_one_process(tmp_path: Path) -> None:
    (tmp_path / "echo_stage.py").write_text(
        "import json, os, signal, sys\n"
        "usr1, term = (signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM))\n"
        "handover = {'usr1_ignored': usr1 == signal.SIG_IGN, 'term_default': term == signal.SIG_DFL}\n"
        "json.dump({'argv': sys.argv[1:], 'pid': os.getpid(), **handover}, open(sys.argv[-1], 'w'))\n"
        "sys.exit(3)\n"
    )
    record = tmp_path / "record.json"
    command = [sys.executable, "-m", "pipeline.launch", "--gpus", "0", "--nodes", "1"]
    process = subprocess.Popen(
        [*command, "--", "echo_stage", "--flag", "a b", str(record)],
        env=launcher_env(tmp_path),
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


@pytest.mark.parametrize(
    ("statuses", "passed_on"),
    [
        ([75, 75], 75),
        ([2, 2], 2),
        ([75, 1], None),
        ([75, None], None),
        # after the launcher forwarded a preemption: the elastic agent kills a late rank once the other exited 75
        ([75, None, "forwarded"], 75),
        ([None, None, "forwarded"], None),
        ([75, 1, "forwarded"], None),
        # a stalled rank's exit ends the others otherwise: a broken collective (1), the elastic agent's kill (none)
        ([1, STALL_EXIT_CODE], STALL_EXIT_CODE),
        ([STALL_EXIT_CODE, None], STALL_EXIT_CODE),
        ([STALL_EXIT_CODE, STALL_EXIT_CODE], STALL_EXIT_CODE),
    ],
)
def test_the_launcher_passes_on_the_agreed_status_or_a_stall(statuses, passed_on) -> None:
    """(Checked by breaking it: without the stall rule, the three stall cases but the last fail.)"""
    forwarded = statuses[-1] == "forwarded"
    assert agreed_exit_status(statuses[:-1] if forwarded else statuses, forwarded_preemption=forwarded) == passed_on


# A stage for the two-process launches: each rank records what it was started with, registers with the launcher
# (pipeline.runtime.preemption) and exits with the status its argument gives, or, for `wait`, 75 once it got a signal;
# `late` waits too, but only after 30 s of "importing" before it registers.
RANK_STAGE = """
import json, os, signal, sys, time
from pipeline.core.io import run_cli
from pipeline.core.exit_codes import PREEMPTED_EXIT_CODE
from pipeline.runtime.preemption import PreemptionSignals

def main(argv):
    out, *statuses = argv
    rank = int(os.environ["LOCAL_RANK"])
    if statuses[rank] == "late":
        time.sleep(30)
        statuses[rank] = "wait"
    usr1_ignored = signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
    signals = PreemptionSignals().install()
    record = {"pid": os.getpid(), "usr1_ignored": usr1_ignored, "threads": os.environ["OMP_NUM_THREADS"]}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump(record, handle)
    if statuses[rank] == "wait":
        deadline = time.monotonic() + 60
        while signals.received is None and time.monotonic() < deadline:
            time.sleep(0.05)
        sys.exit(PREEMPTED_EXIT_CODE if signals.received is not None else 9)
    # Exit only once both ranks have their handlers installed (records written after): a rank still importing when
    # the other exits would be killed by accelerate's SIGTERM instead of exiting with its own status.
    deadline = time.monotonic() + 60
    while not all(os.path.exists(os.path.join(out, f"rank{r}.json")) for r in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(int(statuses[rank]))

run_cli(main, sys.argv[1:])
"""


def launch_two_ranks(tmp_path: Path, *statuses: str) -> subprocess.Popen[str]:
    (tmp_path / "rank_stage.py").write_text(RANK_STAGE)
    command = [sys.executable, "-m", "pipeline.launch", "--gpus", "2", "--nodes", "1", "--", "rank_stage"]
    return subprocess.Popen(
        [*command, str(tmp_path), *statuses],
        env=launcher_env(tmp_path, OMP_NUM_THREADS="2"),
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_to_the_launcher_reaches_both_ranks_and_their_75_comes_back(tmp_path: Path, signum: int) -> None:
    process = launch_two_ranks(tmp_path, "wait", "wait")
    records = [tmp_path / f"rank{rank}.json" for rank in (0, 1)]
    deadline = time.monotonic() + 120
    while not all(record.is_file() for record in records):  # both registered (before writing their record)
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline, "the two ranks did not start within 120 s"
        time.sleep(0.1)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == PREEMPTED_EXIT_CODE, stderr[-3000:]
    assert "mode cpu" in stderr and "every stage process exited 75 (accelerate exited 1): exiting 75" in stderr
    written = [json.loads(record.read_text()) for record in records]
    assert len({process.pid, *(record["pid"] for record in written)}) == 3  # two stage processes below the launcher
    assert all(record["usr1_ignored"] for record in written)  # as the launcher layers
    assert [record["threads"] for record in written] == ["1", "1"]  # the job's 2 threads, split


def sigterm_once_started(tmp_path: Path, *statuses: str) -> str:
    """SIGTERM to the launcher of two ranks as soon as it has started accelerate; asserts it exits 75, returns its
    stderr."""
    process = launch_two_ranks(tmp_path, *statuses)
    assert "mode cpu" in process.stderr.readline()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == PREEMPTED_EXIT_CODE, stderr[-3000:]
    return stderr


def test_a_signal_before_the_ranks_register_reaches_them_through_the_launch_directory(tmp_path: Path) -> None:
    """SIGTERM as soon as the launcher has started accelerate (seconds before the ranks run): nobody is registered to
    forward it to, so each rank must find it in the launch directory's signal file when it registers."""
    stderr = sigterm_once_started(tmp_path, "wait", "wait")
    assert "forwarding SIGTERM" in stderr


def test_a_rank_killed_unrecorded_after_the_others_preemption_still_gives_75(tmp_path: Path) -> None:
    """Rank 1 finds the signal and exits 75 while rank 0 is still importing; the elastic agent then kills rank 0 before
    it records anything. The job was preempted, so the launcher must still ask for a requeue. (A CI run met this race
    in the test above; checked by breaking it: without ``forwarded_preemption`` the launcher exits 1.)"""
    stderr = sigterm_once_started(tmp_path, "late", "wait")
    assert "statuses by local rank: [None, 75]" in stderr
    assert not (tmp_path / "rank0.json").exists()  # rank 0 never got as far as registering


@pytest.mark.parametrize(("statuses", "expected"), [(("75", "3"), 1), (("2", "2"), 2)])
def test_ranks_that_disagree_give_accelerates_status_and_agreeing_ones_theirs(
    tmp_path: Path, statuses: tuple[str, str], expected: int
) -> None:
    """A rank that fails for another reason than preemption: the launcher must not report 75 (requeue me)."""
    process = launch_two_ranks(tmp_path, *statuses)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == expected, stderr[-3000:]


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


# A stage that waits for a preemption signal and exits 75, and a stand-in `scontrol` that answers `show job` like
# Slurm 22.05 (Restarts=0) and records a `requeue`.
WINDOW_STAGE = """
import sys, time
from pipeline.core.exit_codes import PREEMPTED_EXIT_CODE
from pipeline.runtime.preemption import PreemptionSignals

signals = PreemptionSignals().install()
print("stage ready", file=sys.stderr, flush=True)
deadline = time.monotonic() + 60
while signals.received is None and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(PREEMPTED_EXIT_CODE)
"""
SCONTROL = """#!/bin/sh
echo "$@" >> "$(dirname "$0")/calls"
[ "$1" = show ] && echo "JobId=$3 JobName=grail_x Requeue=1 Restarts=0 BatchFlag=1"
exit 0
"""


def test_inside_slurm_the_launcher_requeues_its_job_after_the_warning(tmp_path: Path) -> None:
    """The launcher stays the stage's parent inside a Slurm job and, after the warning's 75, requeues the job and
    keeps the window's log. Broken on purpose: with the launcher exec'ing as outside Slurm, nothing was left to
    requeue (no `scontrol` call, no window log)."""
    (tmp_path / "window_stage.py").write_text(WINDOW_STAGE)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    log = tmp_path / "seed0.log"
    env = launcher_env(
        tmp_path,
        SLURM_JOB_ID="41",
        GRAIL_RUNTIME=json.dumps({"time_windows": 3}),
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    )
    with open(log, "w") as handle:  # the rule's `> {log} 2>&1`
        process = subprocess.Popen(
            [sys.executable, "-m", "pipeline.launch", "--gpus", "0", "--", "window_stage"],
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while "stage ready" not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGUSR1)  # Slurm signals every process of the job step
        assert process.wait(timeout=60) == PREEMPTED_EXIT_CODE
    assert (bin_dir / "calls").read_text().splitlines() == ["show job 41", "requeue 41"]
    assert "time window 1 of at most 3 (time_windows) of Slurm job 41 ended" in log.read_text()
    assert (tmp_path / "seed0.log.window1").read_text() == log.read_text()
