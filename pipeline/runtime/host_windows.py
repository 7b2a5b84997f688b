"""The ``apptainer`` of every job under ``--sdm apptainer``: GPUs seen, and time windows closed from the host side.

    python -m pipeline.runtime.host_windows ARGS...     # what SHIM_DIR/apptainer runs: the real apptainer ARGS

Under ``--sdm apptainer`` the Snakefile puts ``SHIM_DIR`` first on PATH (``shim_environment``), so the ``apptainer``
Snakemake runs each job with is the shim, and the shim runs this module around the real one (``apptainer``, else
``singularity``, the first on PATH after the shim). Every ``apptainer exec`` gets ``--nv`` once (``with_gpus``), so
GPU jobs see the node's GPUs (a CPU node only warns) without the study's asking Snakemake to change its settings.

The image has no Slurm client, so inside a Slurm job the shim tells the container when the job's limit ends
(``time_windows.JOB_END_VARIABLES``, from the host's ``scontrol``; the launcher's time-limit warning counts from
it), and it requeues: for ``apptainer exec`` in a job that
may requeue (``time_windows.may_requeue``) it names a request file in the job's environment
(``time_windows.WINDOW_REQUEST_VARIABLE``; the environment passes into the container, and the file lies in the
working directory, which Snakemake binds as the container's home). A launcher whose time window ended writes its
log's path there instead of calling ``scontrol``, and exits 75 as ever; once the container has exited, this side
requeues the job (``time_windows.close_window``, with the host's ``scontrol``), keeps the window's log, and exits
with the container's status. Any other call, and a job that does not requeue, is the real apptainer's, exec'd.

Slurm's time-limit warning reaches every process of the job step: this one ignores it (the stage inside the
container acts on it), as the jobstep's Snakemake does.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pipeline.runtime.cluster import APPTAINER_GPU_FLAG
from pipeline.runtime.time_windows import (
    JOB_END_VARIABLES,
    WINDOW_REQUEST_VARIABLE,
    close_window,
    job_end_time,
    may_requeue,
)

SHIM_DIR = Path(__file__).resolve().parent / "apptainer_shim"
HOST_PYTHON_VARIABLE = "GRAIL_HOST_PYTHON"  # the Python the shim runs this module with (the jobstep's own)
REQUESTS_DIR = Path(".snakemake") / "grail-time-windows"  # under the working directory, the container's home


def shim_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The variables that make ``env``'s ``apptainer`` the shim: SHIM_DIR first on PATH (once), and this Python."""
    path = env.get("PATH", "")
    if path.split(os.pathsep)[0] != str(SHIM_DIR):
        path = os.pathsep.join([str(SHIM_DIR), *(part for part in path.split(os.pathsep) if part)])
    return {"PATH": path, HOST_PYTHON_VARIABLE: sys.executable}


def real_apptainer(path: str) -> str | None:
    """The first ``apptainer``, else ``singularity``, on ``path`` outside SHIM_DIR."""
    search = os.pathsep.join(part for part in path.split(os.pathsep) if part and Path(part).resolve() != SHIM_DIR)
    return shutil.which("apptainer", path=search) or shutil.which("singularity", path=search)


def with_gpus(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--nv`` after ``exec`` unless it has it; any other subcommand as it is."""
    if argv[:1] == ["exec"] and APPTAINER_GPU_FLAG not in argv:
        return ["exec", APPTAINER_GPU_FLAG, *argv[1:]]
    return list(argv)


def with_job_end(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the Slurm job's end (epoch seconds) for the container, when the host's Slurm names one."""
    end = job_end_time(env)
    return dict(env) if end is None else {**env, JOB_END_VARIABLES[-1]: f"{end:.0f}"}


def main(argv: Sequence[str]) -> None:
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    argv = with_gpus(argv)
    real = real_apptainer(os.environ.get("PATH", ""))
    if real is None:
        print("pipeline.runtime.host_windows: no apptainer or singularity on PATH after the shim", file=sys.stderr)
        sys.exit(127)
    if not argv or argv[0] != "exec":
        os.execv(real, [real, *argv])
    env = with_job_end(os.environ)
    if not may_requeue(env):
        os.execve(real, [real, *argv], env)
    request = Path.cwd() / REQUESTS_DIR / f"{os.environ['SLURM_JOB_ID']}-{os.getpid()}"
    request.parent.mkdir(parents=True, exist_ok=True)
    request.unlink(missing_ok=True)
    status = subprocess.call([real, *argv], env={**env, WINDOW_REQUEST_VARIABLE: str(request)})
    status = 128 - status if status < 0 else status
    if request.exists():
        log = request.read_text(encoding="utf-8").strip()
        request.unlink()
        # the launcher wrote the request only after the warning (SIGUSR1) ended its window
        close_window(status, signal.SIGUSR1, os.environ, Path(log) if log else None)
    sys.exit(status)


if __name__ == "__main__":
    main(sys.argv[1:])
