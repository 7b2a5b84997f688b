"""The stages' exit statuses, and the gate that keeps a final one from being retried.

Snakemake retries every failed job (`retries` in profiles/slurm) and has no per-status rule (snakemake issue #2441:
`restart_times` is per rule). A retry only helps a failure that a rerun can heal. A stage that exits with one of
``FINAL_EXIT_CODES`` fails the same way on every retry: bad input (2) names a file, row or key that is still wrong,
a non-finite run (70) diverges again at the same step from the same checkpoint and seed, a collapsed run (80)
collapses again from its last healthy checkpoint, and a full disk (73: a checkpoint, a model, samples or any other
output that did not fit, ``pipeline.core.disk_full``) is still full. ``PREEMPTED_EXIT_CODE`` (75) is the opposite: a checkpoint was saved and a

The gate. The controller Snakemake (the Snakefile, parsed in its default mode) puts an id of its invocation in the
environment (``INVOCATION_VARIABLE``), which every job inherits (local jobs as children, Slurm jobs through
``--export=ALL``). A stage that ends with a final status writes a marker next to its log (the file its stderr
goes to: every rule redirects the stage's output to its `log`), ``<log>.final``: the invocation id and the status
on the first line, then the log as it was. A later attempt of the same job in the same invocation finds the
marker before it reads any input (``pipeline.launch`` before it starts training, ``pipeline.core.io.run_cli`` after the
stage's imports, before its ``main``), writes a line naming the first attempt's status and the first attempt's log below it into its
own log (which the rule's redirect has just emptied), and exits with the same status. A marker of another
invocation is removed and the job runs: a study started again after the input is fixed runs normally.

No third-party imports: every stage and the launcher read this module before anything else loads.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

INPUT_ERROR_EXIT_CODE = 2  # a bad input (config key, spec, file, row) named on stderr (pipeline.core.io.run_cli)
NONFINITE_EXIT_CODE = 70  # sysexits.h EX_SOFTWARE: the run diverged; a plain rerun would diverge again (nan_guard)
SAVE_FAILED_EXIT_CODE = (
    73  # sysexits.h EX_CANTCREAT: an output (a checkpoint, samples, ...) did not fit; free space, rerun
)
PREEMPTED_EXIT_CODE = 75  # sysexits.h EX_TEMPFAIL: "temporary failure, try again" (checkpoint saved, rerun resumes)
# The stall watchdog (pipeline.runtime.watchdog). Outside sysexits.h's 64-78, below the shell's 126-165 and not 1 or 2: a
# stall cannot be mistaken for another failure. Retryable: a stall is transient (a node, a file system, an engine),
# the rerun resumes from the last checkpoint.
STALL_EXIT_CODE = 79
# The training health check (pipeline.runtime.health): the run collapsed and stayed finite (reward, entropy and gradient
# norm flat, or the weights' norm grown past its bound); a plain rerun resumes from the last healthy checkpoint and
# collapses again. No sysexits.h meaning fits (70, EX_SOFTWARE, is the NaN guard's; 78, EX_CONFIG, would read as a
# config file error, which the stages report as 2), so like the stall's 79 it lies just past sysexits.h's 64-78,
# below the shell's 126-165: a collapse cannot be mistaken for another failure.
COLLAPSE_EXIT_CODE = 80
# The statuses a retry cannot change: a retry of the same job in the same Snakemake invocation exits at once.
FINAL_EXIT_CODES = frozenset({INPUT_ERROR_EXIT_CODE, NONFINITE_EXIT_CODE, SAVE_FAILED_EXIT_CODE, COLLAPSE_EXIT_CODE})
FINAL_EXIT_REASONS = {
    INPUT_ERROR_EXIT_CODE: "bad input",
    NONFINITE_EXIT_CODE: "non-finite training",
    COLLAPSE_EXIT_CODE: "collapsed training",
    SAVE_FAILED_EXIT_CODE: "an output did not fit on the disk",
}

INVOCATION_VARIABLE = "GRAIL_INVOCATION"
MARKER_SUFFIX = ".final"


def log_file(fd: int = 2) -> Path | None:
    """The regular file that descriptor ``fd`` writes to (a rule's `log`), None for a terminal, pipe or deleted file."""
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    path = Path(target)
    return path if path.is_absolute() and path.is_file() else None


def marker_path(log: Path) -> Path:
    """The final-exit marker of the job whose log is ``log``."""
    return log.with_name(log.name + MARKER_SUFFIX)


def is_single_writer(env: Mapping[str, str]) -> bool:
    """Whether this process writes the marker: the only process, or global rank 0 of a multi-process stage."""
    return env.get("RANK", "0") == "0"


def record_final_exit(status: int, env: Mapping[str, str] = os.environ, log: Path | None = None) -> Path | None:
    """After a final ``status`` inside a Snakemake invocation: write the marker next to the log; its path, or None
    when nothing was written (another status, no invocation, no log file, or a rank other than 0)."""
    invocation = env.get(INVOCATION_VARIABLE)
    log = log if log is not None else log_file()
    if status not in FINAL_EXIT_CODES or not invocation or log is None or not is_single_writer(env):
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    marker = marker_path(log)
    partial = marker.with_name(f".{marker.name}.{os.getpid()}.partial")
    with open(partial, "wb") as out:
        out.write((json.dumps({"invocation": invocation, "status": status}) + "\n").encode())
        with open(log, "rb") as text:
            shutil.copyfileobj(text, out)
    os.replace(partial, marker)
    return marker


def earlier_final_exit(env: Mapping[str, str] = os.environ, log: Path | None = None) -> tuple[int, Path] | None:
    """(status, marker) when an earlier attempt of this job in this Snakemake invocation ended with a final status;
    None otherwise. A marker of another invocation is removed (the study was started again, say after a fix)."""
    invocation = env.get(INVOCATION_VARIABLE)
    log = log if log is not None else log_file()
    if not invocation or log is None:
        return None
    marker = marker_path(log)
    try:
        with open(marker, "rb") as handle:
            header = json.loads(handle.readline())
    except (OSError, ValueError):
        return None
    if header.get("invocation") != invocation:
        marker.unlink(missing_ok=True)
        return None
    return int(header["status"]), marker


def repeat_final_exit(program: str, env: Mapping[str, str] = os.environ) -> int | None:
    """The gate: when an earlier attempt of this job in this invocation ended with a final status, write why this
    attempt does not run and the earlier attempt's log to stderr (this attempt's log) and return that status."""
    earlier = earlier_final_exit(env)
    if earlier is None:
        return None
    status, marker = earlier
    print(
        f"{program}: not run again: an earlier attempt of this job in this Snakemake run exited {status} "
        f"({FINAL_EXIT_REASONS.get(status, 'final')}), which fails the same way on every retry; fix the cause and "
        f"start the study again (docs/troubleshooting.md). That attempt's log follows (saved in {marker}):",
        file=sys.stderr,
        flush=True,
    )
    with open(marker, "rb") as handle:
        handle.readline()
        shutil.copyfileobj(handle, sys.stderr.buffer)
    sys.stderr.flush()
    return status
