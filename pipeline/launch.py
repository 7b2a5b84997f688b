"""Command: launch a stage module as one plain process, one process per GPU or CPU slot, or one launcher per Slurm node.

    python -m pipeline.launch --gpus G --nodes N -- pipeline.train ARGS...

The modes, the engine and precision, and the supervision of the processes are ``pipeline.runtime.launching``'s.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from pipeline.core.exit_codes import (
    INPUT_ERROR_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    log_file,
    record_final_exit,
    repeat_final_exit,
)
from pipeline.core.io import InputError
from pipeline.core.locks import controller_problem
from pipeline.core.orphans import die_with_parent
from pipeline.runtime.launching import TRAINING_ENGINES, plan_launch, visible_cuda_devices
from pipeline.runtime.preemption import PreemptionSignals
from pipeline.runtime.supervision import run_child, supervise
from pipeline.runtime.time_windows import arm_warning, close_window, may_requeue, warning_delay


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
    parser.add_argument(
        "--main-process-ip", default=None, help="rendezvous host of a per-node launcher (multi-node sets it)"
    )
    parser.add_argument(
        "--machine-rank", type=int, default=None, help="this machine's rank in a per-node launch (default SLURM_NODEID)"
    )
    parser.add_argument(
        "--engine",
        choices=TRAINING_ENGINES,
        default="auto",
        help="training engine (the config's training_engine): auto is ZeRO-2 on GPUs, DDP on CPU processes",
    )
    parser.add_argument(
        "--accelerate-config", type=Path, default=None, help="an accelerate config file (not --engine's)"
    )
    parser.add_argument(
        "--time-limit-warning",
        type=int,
        default=0,
        metavar="SECONDS",
        help="inside a Slurm job, send the stage SIGUSR1 this long before the job's time limit (0: never)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    signals = PreemptionSignals().install()
    die_with_parent()  # (its SIGTERM is recorded: passed on to the stage processes, as any other)
    repeated = repeat_final_exit("pipeline.launch")
    if repeated is not None:
        sys.exit(repeated)
    try:
        if problem := controller_problem():
            raise InputError(problem)
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
            engine=args.engine,
            accelerate_config=args.accelerate_config,
            main_port=args.main_port,
            main_process_ip=args.main_process_ip,
            machine_rank=args.machine_rank,
            available_cpus=len(os.sched_getaffinity(0)),
            time_limit_warning=args.time_limit_warning,
        )
        # the launcher the job step started requeues, not the per-node ones it starts (--main-process-ip)
        windows = may_requeue(os.environ) and args.main_process_ip is None
        # a multi-node launch passes the warning on to its per-node launchers, which send it to their processes
        delay = None if plan.mode == "multi-node" else warning_delay(args.time_limit_warning, os.environ)
    except InputError as error:
        print(f"pipeline.launch: error: {error}", file=sys.stderr)
        record_final_exit(INPUT_ERROR_EXIT_CODE)
        sys.exit(INPUT_ERROR_EXIT_CODE)
    if signals.received is not None:
        print(
            f"pipeline.launch: received {signals.received_name()} before starting {module}: nothing to save, "
            f"exiting {PREEMPTED_EXIT_CODE} (rerun or requeue)",
            file=sys.stderr,
        )
        if windows:
            close_window(PREEMPTED_EXIT_CODE, signals.received, os.environ, log_file())
        sys.exit(PREEMPTED_EXIT_CODE)
    print(
        f"pipeline.launch: mode {plan.mode} ({plan.reason}): {shlex.join(plan.argv)}",
        file=sys.stderr,
        flush=True,
    )
    if delay is not None:
        print(
            f"pipeline.launch: the time-limit warning (SIGUSR1) comes in {delay:.0f} s, "
            f"{args.time_limit_warning} s before Slurm job {os.environ['SLURM_JOB_ID']}'s limit",
            file=sys.stderr,
            flush=True,
        )
        arm_warning(delay)
    if plan.supervised or delay is not None:  # the launcher passes its own warning on to the stage processes
        status = supervise(plan, signals)
    elif windows:
        status = run_child(plan)
    else:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # kept across exec (the recording handlers are reset by it)
        os.execvp(plan.argv[0], plan.argv)
    # the stage processes record a final status too, unless their stderr is not the log (srun's per-node output)
    record_final_exit(status)
    if windows:
        close_window(status, signals.received, os.environ, log_file())
    sys.exit(status)


if __name__ == "__main__":
    main()
