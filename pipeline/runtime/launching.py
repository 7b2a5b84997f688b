"""Launch a stage module as one plain process, one process per GPU or CPU slot, or one launcher per Slurm node.

    python -m pipeline.launch --gpus G --nodes N -- pipeline.train ARGS...

Modes (printed to stderr before the launch):
- ``single-process``: G <= 1 and N <= 1: ``python -m MODULE ARGS``.
- ``cpu``: G > 1 or N > 1 but no CUDA device visible (a CPU machine): P = max(G, 1) x N processes on this machine
  on a free port, started by torch's elastic agent as on GPUs. DDP (engine ``ddp``, and ``auto`` here):
  ``accelerate launch --config_file configs/accelerate/multi_cpu.yaml --num_processes P --main_process_port 0
  --multi_gpu --num_cpu_threads_per_process T -m MODULE ARGS`` with ``ACCELERATE_USE_CPU=true``: DDP over gloo
  (``--multi_gpu`` picks the elastic agent: accelerate's own CPU launcher needs MPI for more than one process).
  DeepSpeed ZeRO-2 (engine ``zero2``, or a DeepSpeed ``--accelerate-config``): the same without ``--multi_gpu`` (it
  would override the config's DeepSpeed) and with ``DS_ACCELERATOR=cpu`` instead of ``ACCELERATE_USE_CPU`` (which
  would make the Trainer skip DeepSpeed); the training stage names the gloo backend (pipeline.train). The job's
  threads (``OMP_NUM_THREADS``, which Snakemake sets to the rule's threads, else the CPUs this process may use) are
  split: T = threads // P, at least 1, also exported as the other BLAS thread counts.
- ``single-node``: G > 1 on one node: ``accelerate launch --config_file configs/accelerate/zero2.yaml
  --num_processes G --main_process_port P -m MODULE ARGS`` (DeepSpeed ZeRO-2, one process per GPU; engine ``ddp``:
  configs/accelerate/ddp.yaml).

Engine and precision. ``--engine`` (the study's ``training_engine``) picks the accelerate config: ``auto`` ZeRO-2
where CUDA devices are visible (the paper's engine) and DDP on CPU processes, ``zero2`` or ``ddp`` everywhere;
``--accelerate-config`` names a file instead. Every ``accelerate launch`` gets ``--mixed_precision`` from the
module's ``--training-spec``/``--method-spec`` when it has them (``spec_mixed_precision``), so one zero2.yaml serves
bf16 on GPUs and fp32 on CPU processes, and DeepSpeed's precision cannot disagree with the Trainer's.
- ``multi-node``: N > 1 inside a Slurm allocation: ``srun`` starts this launcher once per node with the
  rendezvous address (the first host of ``SLURM_JOB_NODELIST``); on each node it becomes
- ``node``: ``accelerate launch ... --num_processes G*N --num_machines N --machine_rank $SLURM_NODEID
  --main_process_ip HEAD --main_process_port P --rdzv_backend static -m MODULE ARGS``. Outside Slurm a launcher
  started on each machine with ``--main-process-ip HEAD --machine-rank R --main-port P`` is one too. Without CUDA it
  runs its max(G, 1) processes as the cpu mode does (engine options, environment, thread split): tests run two on
  localhost as two machines.

Signals and exit status. Until the hand-over the launcher records SIGUSR1 and SIGTERM (``pipeline.runtime.preemption``);
one that came first (say while torch counts the GPUs) ends it with ``PREEMPTED_EXIT_CODE``, nothing started.
SIGUSR1 is ignored by every launcher layer: Slurm's ``--signal=USR1@<seconds>`` warning goes to every process of
the job step, and only the stage processes, which install their own handler at startup, may act on it;
``accelerate launch`` and torch's elastic agent would otherwise die of it (status 138) and take the job down while
their workers save a checkpoint.
- ``single-process`` and ``multi-node`` replace the launcher by the command (``os.execvp``): Slurm's signals reach
  the stage (or the per-node launchers) directly and its exit status is the launcher's. Inside a Slurm job with
  more than one time window (``pipeline.runtime.time_windows``) the launcher runs the command as a child instead and stays
  to requeue the job; with ``--time-limit-warning`` it stays as in the modes below, to send its own warning on
  (``multi-node`` passes the option to its per-node launchers instead).
- ``cpu``, ``single-node`` and ``node`` (``accelerate launch``) keep the launcher as the parent, because torch's
  elastic agent reports any failed worker as status 1, which would turn the stage's 75 ("checkpointed, requeue
  me") into a plain failure. The launcher makes a per-launch directory (``GRAIL_LAUNCH_DIR``) where each stage
  process registers its pid and records its exit status (``pipeline.runtime.preemption``, ``pipeline.core.io.run_cli``). It
  forwards SIGTERM and SIGUSR1 to the registered processes only (a SIGTERM to the elastic agent would make it
  kill its workers 30 s later, mid-checkpoint), and exits with the status every local process recorded when
  they agree (75 after a preemption, 2 after bad input), with ``STALL_EXIT_CODE`` (79) when any recorded it (the
  stall watchdog of a rank: pipeline.runtime.watchdog), else with ``accelerate launch``'s own. The command lines
  of the GPU modes are the ones this launcher always ran, plus the training spec's ``--mixed_precision``. SIGKILL cannot be forwarded: torch's elastic agent starts
  each worker in a session of its own, so ending such a job takes its whole process tree (Slurm ends every process
  of a job step), not its process group.

Time windows and final statuses. When the stage exits 75 after Slurm's time-limit warning (SIGUSR1) inside a Slurm
job, the launcher requeues the job while windows are left (``pipeline.runtime.time_windows``: the job runs again and
resumes, and Snakemake sees no failure). Before anything starts, a retry of a job whose earlier attempt in the same
Snakemake invocation exited with a final status (bad input, non-finite training, a full disk) exits with that
status at once (``pipeline.core.exit_codes``).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import yaml

from pipeline.core.io import InputError
from pipeline.core.repo import CONFIGS_DIR
from pipeline.core.specs import stage_spec

ACCELERATE_CONFIGS = CONFIGS_DIR / "accelerate"


DEFAULT_ACCELERATE_CONFIG = ACCELERATE_CONFIGS / "zero2.yaml"


CPU_ACCELERATE_CONFIG = ACCELERATE_CONFIGS / "multi_cpu.yaml"


GPU_DDP_ACCELERATE_CONFIG = ACCELERATE_CONFIGS / "ddp.yaml"


# config key `training_engine` and --engine: auto is ZeRO-2 on GPUs (the paper's), DDP on CPU processes
TrainingEngine = Literal["auto", "zero2", "ddp"]


TRAINING_ENGINES: tuple[str, ...] = get_args(TrainingEngine)


# The thread counts Snakemake exports as a job's threads; the cpu mode gives each process its share.
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


SUPERVISED_MODES = frozenset({"cpu", "single-node", "node"})


UPSTREAM_MAIN_PORT = 25679


SLURM_PORT_BASE = 29500


SLURM_PORT_SPAN = 1000


@dataclass(frozen=True)
class LaunchPlan:
    """What to execute and why: ``mode`` is one of single-process, cpu, single-node, multi-node, node.

    ``env`` holds the entries the command gets added to its environment; ``local_processes`` is the number of
    stage processes the command starts on this machine (their ranks are ``LOCAL_RANK`` 0 .. local_processes-1).
    """

    mode: str
    argv: list[str]
    reason: str
    env: dict[str, str] = field(default_factory=dict)
    local_processes: int = 1

    @property
    def supervised(self) -> bool:
        """Whether the launcher stays the parent (``accelerate launch``) instead of replacing itself."""
        return self.mode in SUPERVISED_MODES


def training_processes(gpus: int, nodes: int) -> int:
    """Stage processes a launch with ``--gpus gpus --nodes nodes`` runs: one per GPU (or CPU slot) and node when
    it asks for more than one, else one (``max(gpus, 1) x nodes``, or 1)."""
    return max(gpus, 1) * nodes if gpus > 1 or nodes > 1 else 1


def threads_per_process(processes: int, env: Mapping[str, str], available_cpus: int) -> int:
    """``threads // processes``, at least 1: the job's threads are ``OMP_NUM_THREADS`` (Snakemake exports the
    rule's threads) when set, else the CPUs this process may run on."""
    threads = env.get("OMP_NUM_THREADS", "")
    total = int(threads) if threads.isdigit() and int(threads) > 0 else available_cpus
    return max(1, total // processes)


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


def engine_accelerate_config(engine: TrainingEngine, cuda: bool) -> Path:
    """The accelerate config of ``engine``: zero2.yaml for ``zero2`` (and ``auto`` where CUDA devices are visible,
    the paper's engine), else DDP: multi_cpu.yaml on CPU processes, ddp.yaml on GPUs."""
    if engine == "zero2" or (engine == "auto" and cuda):
        return DEFAULT_ACCELERATE_CONFIG
    return GPU_DDP_ACCELERATE_CONFIG if cuda else CPU_ACCELERATE_CONFIG


def uses_deepspeed(config: Path) -> bool:
    """Whether an accelerate config file runs DeepSpeed (``distributed_type: DEEPSPEED``)."""
    try:
        loaded = yaml.safe_load(config.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise InputError(f"--accelerate-config {config}: unreadable ({error})") from None
    return isinstance(loaded, dict) and loaded.get("distributed_type") == "DEEPSPEED"


def spec_mixed_precision(spec: Mapping[str, Any]) -> str:
    """accelerate's ``--mixed_precision`` for a merged training spec: ``fp16`` when ``fp16`` is set, else ``bf16``
    when ``bf16`` is (TRL's GRPOConfig turns bf16 on when neither is given), else ``no`` (fp32)."""
    if spec.get("fp16"):
        return "fp16"
    return "bf16" if spec.get("bf16", True) else "no"


def precision_options(module_args: Sequence[str]) -> list[str]:
    """``["--mixed_precision", P]`` from the module's training and method specs, or ``[]`` when it has none (or
    they do not parse: the stage names that problem itself)."""
    spec = stage_spec(module_args)
    return [] if spec is None else ["--mixed_precision", spec_mixed_precision(spec)]


def _accelerate_launch(config: Path, num_processes: int, port: int, module_args: Sequence[str]) -> list[str]:
    return [
        "accelerate",
        "launch",
        "--config_file",
        str(config),
        "--num_processes",
        str(num_processes),
        "--main_process_port",
        str(port),
        *precision_options(module_args),
    ]


def plan_launch(
    gpus: int,
    nodes: int,
    module: str,
    module_args: Sequence[str],
    *,
    visible_gpus: int,
    env: Mapping[str, str],
    engine: TrainingEngine = "auto",
    accelerate_config: Path | None = None,
    main_port: int | None = None,
    main_process_ip: str | None = None,
    machine_rank: int | None = None,
    head_host: Callable[[str], str] = first_host,
    python: str = sys.executable,
    available_cpus: int = 1,
    time_limit_warning: int = 0,
) -> LaunchPlan:
    """Choose the launch mode and build its command line (pure apart from ``head_host`` and reading the
    accelerate config).

    ``gpus`` is per node; ``accelerate_config``, when given, replaces ``engine``'s file; ``main_process_ip`` is set
    on the per-node launchers (those ``srun`` starts, or one started by hand on each machine), whose machine rank is
    ``machine_rank`` or else ``SLURM_NODEID``; ``available_cpus`` (the CPUs this process may run on) is read only
    on CPU processes when ``OMP_NUM_THREADS`` is unset; ``time_limit_warning`` is passed on to per-node launchers.
    """
    if gpus < 0 or nodes < 1:
        raise InputError(f"--gpus must be >= 0 and --nodes >= 1, got --gpus {gpus} --nodes {nodes}")
    port = default_main_port(env) if main_port is None else main_port
    module_call = ["-m", module, *module_args]
    if gpus <= 1 and nodes <= 1:
        return LaunchPlan("single-process", [python, *module_call], f"{gpus} GPU(s) on {nodes} node")
    if accelerate_config is None:
        accelerate_config = engine_accelerate_config(engine, cuda=visible_gpus > 0)
    if main_process_ip is not None and nodes > 1:
        if 0 < visible_gpus < gpus:
            raise too_few_gpus(gpus, visible_gpus, env)
        rank = env.get("SLURM_NODEID", "") if machine_rank is None else str(machine_rank)
        per_node = max(gpus, 1)
        cpu = None if visible_gpus else cpu_processes(accelerate_config, per_node, env, available_cpus)
        return node_plan(per_node, nodes, rank, main_process_ip, port, module_call, accelerate_config, cpu)
    if visible_gpus == 0:
        processes = training_processes(gpus, nodes)
        cpu = cpu_processes(accelerate_config, processes, env, available_cpus)
        return cpu_plan(gpus, nodes, module_call, accelerate_config, main_port, cpu)
    if visible_gpus < gpus:
        raise too_few_gpus(gpus, visible_gpus, env)
    if nodes == 1:
        argv = [*_accelerate_launch(accelerate_config, gpus, port, module_args), *module_call]
        return LaunchPlan(
            "single-node", argv, f"{gpus} GPUs on one node, {accelerate_config.name}", local_processes=gpus
        )
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
        "--time-limit-warning",
        str(time_limit_warning),
        "--",
        module,
        *module_args,
    ]
    return LaunchPlan("multi-node", argv, f"{nodes} nodes x {gpus} GPUs, rendezvous {head}:{port}")


def too_few_gpus(gpus: int, visible_gpus: int, env: Mapping[str, str]) -> InputError:
    return InputError(
        f"--gpus {gpus} requested but only {visible_gpus} CUDA device(s) are visible "
        f"(CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '<unset>')})"
    )


@dataclass(frozen=True)
class CpuProcesses:
    """How ``accelerate launch`` runs stage processes on this machine's CPUs over gloo: its extra ``options``, the
    ``env`` entries and a ``description`` for the reason."""

    options: list[str]
    env: dict[str, str]
    description: str


def cpu_processes(accelerate_config: Path, processes: int, env: Mapping[str, str], available_cpus: int) -> CpuProcesses:
    """``processes`` CPU processes on this machine (DDP, or DeepSpeed when the accelerate config says so), the job's
    threads split between them."""
    threads = threads_per_process(processes, env, available_cpus)
    if uses_deepspeed(accelerate_config):
        # --multi_gpu would override the config's DeepSpeed and ACCELERATE_USE_CPU make the Trainer skip it;
        # DS_ACCELERATOR=cpu spares DeepSpeed's accelerator detection (a warning, then the same answer)
        launcher, device_env, engine = [], {"DS_ACCELERATOR": "cpu"}, "DeepSpeed ZeRO-2"
    else:
        launcher, device_env, engine = ["--multi_gpu"], {"ACCELERATE_USE_CPU": "true"}, "DDP"
    return CpuProcesses(
        [*launcher, "--num_cpu_threads_per_process", str(threads)],
        {**device_env, **dict.fromkeys(THREAD_VARIABLES, str(threads))},
        f"{engine} over gloo, {threads} thread(s) each",
    )


def cpu_plan(
    gpus: int, nodes: int, module_call: list[str], accelerate_config: Path, main_port: int | None, cpu: CpuProcesses
) -> LaunchPlan:
    """The cpu mode: every requested process on this machine."""
    processes = training_processes(gpus, nodes)
    argv = [
        # port 0: accelerate picks a free one (the processes all run here; two jobs on one machine cannot collide)
        *_accelerate_launch(accelerate_config, processes, 0 if main_port is None else main_port, module_call[2:]),
        *cpu.options,
        *module_call,
    ]
    return LaunchPlan(
        "cpu",
        argv,
        f"{gpus} GPU(s) x {nodes} node(s) requested but no CUDA device is visible: {processes} CPU processes on "
        f"this machine, {cpu.description}",
        env=cpu.env,
        local_processes=processes,
    )


def node_plan(
    per_node: int,
    nodes: int,
    rank: str,
    main_process_ip: str,
    port: int,
    module_call: list[str],
    accelerate_config: Path,
    cpu: CpuProcesses | None,
) -> LaunchPlan:
    """The node mode: this machine's ``per_node`` processes of a ``nodes``-machine run, machine rank ``rank``,
    rendezvous at ``main_process_ip:port`` (on GPUs, or on CPU processes over gloo when ``cpu`` says how)."""
    if not rank.isdigit():
        raise InputError(
            f"machine rank {rank!r}: the per-node launcher runs under srun (SLURM_NODEID) or gets --machine-rank"
        )
    argv = [
        *_accelerate_launch(accelerate_config, per_node * nodes, port, module_call[2:]),
        *([] if cpu is None else cpu.options),
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
    reason = f"node {rank} of {nodes}, rendezvous {main_process_ip}:{port}"
    if cpu is not None:
        reason += f", no CUDA device visible: {per_node} CPU process(es) here, {cpu.description}"
    return LaunchPlan("node", argv, reason, env={} if cpu is None else cpu.env, local_processes=per_node)
