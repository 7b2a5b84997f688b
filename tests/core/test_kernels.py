"""The CPU kernel pin (pipeline.core.kernels): in effect in every stage's process, off on request, recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core import kernels
from pipeline.core.provenance import kernel_fields
from pipeline.report import kernel_path_section
from tests.shared_studies import KERNEL_PIN_VARIABLE

pytestmark = pytest.mark.skipif(not kernels.applies_here(), reason="the pin's variables are x86-64's")

REPO = Path(__file__).resolve().parents[2]
PROBE = (
    "import json, os, torch, pipeline; from pipeline import kernels; "
    "print(json.dumps({'capability': torch.backends.cpu.get_cpu_capability(), "
    "'variables': {name: os.environ.get(name) for name in kernels.OBSERVED}, 'path': kernels.kernel_path()}))"
)


def probe(**variables: str) -> dict:
    """What a fresh process that imports the package runs on, with ``variables`` set and the pin's unset."""
    environment = {
        k: v
        for k, v in os.environ.items()
        if k not in {*kernels.OBSERVED, kernels.KERNEL_PIN_VARIABLE, kernels.OUTSIDE_VARIABLE}
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env={**environment, **variables}, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def native_capability() -> str:
    """torch's own choice on this machine, without the package (and its pin) imported."""
    environment = {k: v for k, v in os.environ.items() if k not in kernels.OBSERVED}
    command = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    return subprocess.run([sys.executable, "-c", command], env=environment, capture_output=True, text=True).stdout


def test_the_tests_name_the_pins_variable_as_the_package_does() -> None:
    assert KERNEL_PIN_VARIABLE == kernels.KERNEL_PIN_VARIABLE


def test_importing_the_package_pins_torch_mkl_and_onednn_before_torch_reads_them() -> None:
    pinned = probe()
    assert pinned["capability"] == "AVX2"
    assert {name: pinned["variables"][name] for name in kernels.PINNED} == kernels.PINNED
    assert pinned["path"] == "pinned AVX2"


def test_the_pin_overrides_a_variable_set_from_outside_and_stays_off_on_request() -> None:
    assert probe(ATEN_CPU_CAPABILITY="default")["capability"] == "AVX2"
    unpinned = probe(**{kernels.KERNEL_PIN_VARIABLE: "0"})
    assert unpinned["capability"] == native_capability().strip()
    assert unpinned["path"] == f"native {unpinned['capability']}"
    assert not any(unpinned["variables"].values())


def test_configure_off_puts_back_what_the_environment_held_before_the_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Snakefile imports the package (which pins) and then applies the study's key: off must leave a variable
    set from outside as it was, and drop the ones only the pin set."""
    monkeypatch.setenv("MKL_CBWR", "AUTO")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv(kernels.KERNEL_PIN_VARIABLE, raising=False)
    monkeypatch.delenv(kernels.OUTSIDE_VARIABLE, raising=False)
    kernels.apply()
    assert {name: os.environ[name] for name in kernels.PINNED} == kernels.PINNED
    kernels.configure(False)
    assert os.environ[kernels.KERNEL_PIN_VARIABLE] == "0"
    assert os.environ["MKL_CBWR"] == "AUTO"
    assert "ATEN_CPU_CAPABILITY" not in os.environ and "ONEDNN_MAX_CPU_ISA" not in os.environ
    kernels.configure(True)
    assert {name: os.environ[name] for name in kernels.PINNED} == kernels.PINNED


def test_provenance_records_the_cpu_the_capability_and_the_pins(tmp_path) -> None:
    """A stage's provenance (written in a fresh process that imports the package, as a stage does)."""
    path = tmp_path / "provenance.json"
    write = f"from pipeline.core.provenance import write_provenance; write_provenance(__import__('pathlib').Path({str(path)!r}), 'evaluate')"
    environment = {
        k: v
        for k, v in os.environ.items()
        if k not in {*kernels.OBSERVED, kernels.KERNEL_PIN_VARIABLE, kernels.OUTSIDE_VARIABLE}
    }
    subprocess.run([sys.executable, "-c", write], env=environment, check=True)
    record = json.loads(path.read_text())["kernels"]
    assert record["cpu_model"] == kernels.cpu_model() and record["cpu_model"] != "unknown"
    assert record["capability"] == "AVX2" and record["kernel_pin"] is True
    assert record["variables"]["MKL_CBWR"] == "COMPATIBLE,STRICT"
    assert record["mkl"] and record["onednn"] and record["threads"] >= 1


PROBE_STAGE = """import os, sys, torch
from pipeline.core import kernels
kernels.run_natively("probe_stage", sys.argv[1:], "a test")
print(torch.backends.cpu.get_cpu_capability(), sys.argv[1:], os.environ.get("ONEDNN_MAX_CPU_ISA"), os.environ.get("MKL_CBWR"))
"""


def test_run_natively_runs_the_stage_again_unpinned_with_its_arguments(tmp_path) -> None:
    """What the evaluation stage does before it starts vLLM on the CPU, whose kernels abort under the pin: in a job
    of a pinned study, which inherits the pinned variables from Snakemake, and with one set from outside."""
    (tmp_path / "probe_stage.py").write_text(PROBE_STAGE)
    outside = {k: v for k, v in os.environ.items() if k not in {*kernels.OBSERVED, kernels.OUTSIDE_VARIABLE}}
    with pytest.MonkeyPatch.context() as patch:  # as the Snakefile's configure(True) leaves the job environment
        patch.setattr(os, "environ", {**outside, "MKL_CBWR": "AUTO"})
        environment = kernels.pinned_environment()
    assert environment["ONEDNN_MAX_CPU_ISA"] == "AVX2" and environment["MKL_CBWR"] == "COMPATIBLE,STRICT"
    done = subprocess.run(
        [sys.executable, "-m", "probe_stage", "--out", "x y"],
        cwd=tmp_path,
        env={**environment, "PYTHONPATH": str(REPO)},  # this checkout's package, as the Snakefile's jobs import it
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == f"{native_capability().strip()} ['--out', 'x y'] None AUTO"
    assert "probe_stage: a test: running on the machine's native kernels (no kernel pin)" in done.stderr
    assert done.stderr.count("running on the machine's native kernels") == 1  # the unpinned run goes on


def test_the_report_names_one_kernel_path_or_every_output_off_it() -> None:
    pinned = {"cpu_model": "CPU A", "capability": "AVX2", "kernel_pin": True, "variables": kernels.PINNED}
    native = {"cpu_model": "CPU B", "capability": "AVX512", "kernel_pin": False, "variables": {}}
    same = kernel_path_section({"run": kernel_fields(pinned), "eval": kernel_fields({**pinned, "cpu_model": "CPU B"})})
    assert "ran on one CPU kernel path: capability AVX2, kernel pin on" in same
    assert "ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE,STRICT ONEDNN_MAX_CPU_ISA=AVX2" in same
    assert "CPU: CPU A; CPU B" in same and "hold on any x86-64 CPU with AVX2" in same
    mixed = kernel_path_section({"run": kernel_fields(pinned), "eval": kernel_fields(native)})
    assert mixed.startswith("**Mixed kernel paths**")
    assert "- capability AVX512: 1 outputs (`eval`)" in mixed and "- kernel pin off: 1 outputs (`eval`)" in mixed
    alone = kernel_path_section({"eval": kernel_fields(native)})
    assert "**The kernel pin is off**" in alone
