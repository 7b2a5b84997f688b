"""Launch a stage module as one plain process, one DeepSpeed process per GPU, or one launcher per Slurm node.

    python -m pipeline.launch --gpus G --nodes N -- pipeline.train ARGS...

Modes (printed to stderr before the launch):
- ``single-process``: G <= 1 and N <= 1, or no CUDA device visible (a CPU machine):
  ``python -m MODULE ARGS``.
- ``single-node``: G > 1 on one node: ``accelerate launch --config_file configs/accelerate/zero2.yaml
  --num_processes G --main_process_port P -m MODULE ARGS`` (DeepSpeed ZeRO-2, one process per GPU).
- ``multi-node``: N > 1 inside a Slurm allocation: ``srun`` starts this launcher once per node with the
  rendezvous address (the first host of ``SLURM_JOB_NODELIST``); on each node it becomes
- ``node``: ``accelerate launch ... --num_processes G*N --num_machines N --machine_rank $SLURM_NODEID
  --main_process_ip HEAD --main_process_port P --rdzv_backend static -m MODULE ARGS``.

The launcher replaces itself with the command (``os.execvp``), so Slurm's signals (preemption, time limit)
reach the training processes directly. Until then it records SIGUSR1 and SIGTERM (``pipeline.preemption``); one
that came first (say while torch counts the GPUs) ends it with ``PREEMPTED_EXIT_CODE``, nothing started. It hands
over with SIGUSR1 ignored: Slurm's ``--signal=USR1@<seconds>`` warning goes to every process of the job step, and
only the stage processes, which install their own handler at startup, may act on it; the launchers in between
(``accelerate launch``, torch's elastic agent) would otherwise die of it (status 138) and take the job down while
their workers save a checkpoint.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.io import InputError
from pipeline.preemption import PREEMPTED_EXIT_CODE, PreemptionSignals

DEFAULT_ACCELERATE_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "accelerate" / "zero2.yaml"
UPSTREAM_MAIN_PORT = 25679
SLURM_PORT_BASE = 29500
SLURM_PORT_SPAN = 1000


@dataclass(frozen=True)
class LaunchPlan:
    """What to execute and why: ``mode`` is one of single-process, single-node, multi-node, node."""

    mode: str
    argv: list[str]
    reason: str


def default_main_port(env: Mapping[str, str]) -> int:
    """Rendezvous port: ``29500 + SLURM_JOB_ID mod 1000`` inside Slurm, upstream's 25679 outside.

    Derived from the job id so that two jobs sharing a node do not collide while every node of one job
    agrees on the port without talking to each other.
    """
    job_id = env.get("SLURM_JOB_ID", "")
    if job_id.isdigit():
        return SLURM_PORT_BASE + int(job_id) % SLURM_PORT_SPAN
    return UPSTREAM_MAIN_PORT


def first_host(nodelist: str, run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> str:
    """First host of a Slurm hostlist (``gpu[03-04]`` -> ``gpu03``), via ``scontrol show hostnames``."""
    result = run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    hosts = result.stdout.split()
    if not hosts:
        raise InputError(f"SLURM_JOB_NODELIST={nodelist!r}: `scontrol show hostnames` listed no host")
    return hosts[0]


def visible_cuda_devices() -> int:
    """Number of CUDA devices torch can see (0 on a CPU machine)."""
    import torch

    return torch.cuda.device_count()


def _accelerate_launch(config: Path, num_processes: int, port: int) -> list[str]:
    return [
        "accelerate",
        "launch",
        "--config_file",
        str(config),
        "--num_processes",
        str(num_processes),
        "--main_process_port",
        str(port),
    ]


def plan_launch(
    gpus: int,
    nodes: int,
    module: str,
    module_args: Sequence[str],
    *,
    visible_gpus: int,
    env: Mapping[str, str],
    accelerate_config: Path = DEFAULT_ACCELERATE_CONFIG,
    main_port: int | None = None,
    main_process_ip: str | None = None,
    head_host: Callable[[str], str] = first_host,
    python: str = sys.executable,
) -> LaunchPlan:
    """Choose the launch mode and build its command line (pure apart from ``head_host``).

    ``gpus`` is per node; ``main_process_ip`` is set only on the per-node launchers that ``srun`` starts.
    """
    if gpus < 0 or nodes < 1:
        raise InputError(f"--gpus must be >= 0 and --nodes >= 1, got --gpus {gpus} --nodes {nodes}")
    port = default_main_port(env) if main_port is None else main_port
    module_call = ["-m", module, *module_args]
    if gpus <= 1 and nodes <= 1:
        return LaunchPlan("single-process", [python, *module_call], f"{gpus} GPU(s) on {nodes} node")
    if visible_gpus == 0:
        return LaunchPlan(
            "single-process",
            [python, *module_call],
            f"{gpus} GPU(s) x {nodes} node(s) requested but no CUDA device is visible: CPU fallback",
        )
    if visible_gpus < gpus:
        raise InputError(
            f"--gpus {gpus} requested but only {visible_gpus} CUDA device(s) are visible "
            f"(CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '<unset>')})"
        )
    if nodes == 1:
        argv = [*_accelerate_launch(accelerate_config, gpus, port), *module_call]
        return LaunchPlan("single-node", argv, f"{gpus} GPUs on one node, DeepSpeed ZeRO-2")
    if main_process_ip is not None:
        rank = env.get("SLURM_NODEID", "")
        if not rank.isdigit():
            raise InputError(f"SLURM_NODEID={rank!r}: the per-node launcher must run under srun")
        argv = [
            *_accelerate_launch(accelerate_config, gpus * nodes, port),
            "--num_machines",
            str(nodes),
            "--machine_rank",
            rank,
            "--main_process_ip",
            main_process_ip,
            "--rdzv_backend",
            "static",
            "--same_network",
            *module_call,
        ]
        return LaunchPlan("node", argv, f"node {rank} of {nodes}, rendezvous {main_process_ip}:{port}")
    nodelist = env.get("SLURM_JOB_NODELIST", "")
    allocated = env.get("SLURM_JOB_NUM_NODES", "")
    if not nodelist or not allocated.isdigit():
        raise InputError(f"--nodes {nodes} needs a Slurm allocation (SLURM_JOB_NODELIST/SLURM_JOB_NUM_NODES unset)")
    if int(allocated) < nodes:
        raise InputError(f"--nodes {nodes} requested but the Slurm allocation has {allocated} node(s)")
    head = head_host(nodelist)
    argv = [
        "srun",
        # the job step that runs this launcher may already hold the node's CPUs: share them
        "--overlap",
        f"--nodes={nodes}",
        f"--ntasks={nodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        python,
        "-m",
        "pipeline.launch",
        "--gpus",
        str(gpus),
        "--nodes",
        str(nodes),
        "--main-port",
        str(port),
        "--main-process-ip",
        head,
        "--accelerate-config",
        str(accelerate_config),
        "--",
        module,
        *module_args,
    ]
    return LaunchPlan("multi-node", argv, f"{nodes} nodes x {gpus} GPUs, rendezvous {head}:{port}")


def split_command_line(argv: Sequence[str]) -> tuple[list[str], str, list[str]]:
    """Split ``[launcher options] -- MODULE [ARGS]`` into its three parts."""
    if "--" not in argv:
        raise InputError("usage: python -m pipeline.launch --gpus G --nodes N -- MODULE [ARGS...] (missing `--`)")
    cut = list(argv).index("--")
    rest = list(argv[cut + 1 :])
    if not rest:
        raise InputError("no module given after `--`")
    return list(argv[:cut]), rest[0], rest[1:]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipeline.launch", description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=0, help="GPUs per node (one training process each)")
    parser.add_argument("--nodes", type=int, default=1, help="nodes (more than one needs a Slurm allocation)")
    parser.add_argument("--main-port", type=int, default=None, help="rendezvous port (default: from SLURM_JOB_ID)")
    parser.add_argument("--main-process-ip", default=None, help="set by the multi-node launcher on each node")
    parser.add_argument("--accelerate-config", type=Path, default=DEFAULT_ACCELERATE_CONFIG)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    signals = PreemptionSignals().install()
    try:
        options, module, module_args = split_command_line(sys.argv[1:] if argv is None else argv)
        args = build_parser().parse_args(options)
        needs_devices = args.gpus > 1 or args.nodes > 1
        plan = plan_launch(
            args.gpus,
            args.nodes,
            module,
            module_args,
            visible_gpus=visible_cuda_devices() if needs_devices else 0,
            env=os.environ,
            accelerate_config=args.accelerate_config,
            main_port=args.main_port,
            main_process_ip=args.main_process_ip,
        )
    except InputError as error:
        print(f"pipeline.launch: error: {error}", file=sys.stderr)
        sys.exit(2)
    if signals.received is not None:
        print(
            f"pipeline.launch: received {signals.received_name()} before starting {module}: nothing to save, "
            f"exiting {PREEMPTED_EXIT_CODE} (rerun or requeue)",
            file=sys.stderr,
        )
        sys.exit(PREEMPTED_EXIT_CODE)
    print(
        f"pipeline.launch: mode {plan.mode} ({plan.reason}): {shlex.join(plan.argv)}",
        file=sys.stderr,
        flush=True,
    )
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # kept across exec (the recording handlers are reset by it)
    os.execvp(plan.argv[0], plan.argv)


if __name__ == "__main__":
    main()
