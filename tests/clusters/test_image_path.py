"""One image path, and site flags that leave training's warning alone (docs/cluster.md).

- `containers/build.sh names` is the one place that names the images: the config's default `container_image` is
  the .sif file it writes, and the Kubernetes profile's `container-image` is what its `push` pushes.
- `--sdm apptainer` with a missing image stops the plan naming the build command; with an image, every job runs
  with `--nv` (a stand-in `apptainer` records its command line and runs the job's shell command locally:
  Apptainer cannot be installed on the CI machine).
- A site's `slurm_extra` (`--set-resources`, or `default-resources`) follows Snakemake's order; training keeps
  its time-limit warning, which is no flag (dry run here; tests/faults/test_slurm_warning.py runs such a job on the
  real Slurm).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from pipeline.runtime import cluster

from .conftest import REPO, run_command

PROFILE = REPO / "profiles" / "slurm"
STAND_IN_APPTAINER = """#!/bin/sh
# apptainer exec --home DIR ARGS... IMAGE SHELL -c COMMAND: record the line, run `SHELL -c COMMAND` here
if [ "$1" = --version ]; then echo "apptainer version 1.3.6"; exit 0; fi
printf '%s\\n' "$*" >> "$APPTAINER_RECORD"
if [ -n "$GRAIL_WINDOW_REQUEST" ]; then echo "$GRAIL_WINDOW_REQUEST" >> "$APPTAINER_RECORD.request"; fi
while [ $# -gt 3 ]; do shift; done
exec "$@"
"""


def build_names(**env: str) -> dict[str, list[str]]:
    """`containers/build.sh names`: kind -> the references (gpu, cpu, apptainer, push)."""
    output = subprocess.run(
        ["bash", "containers/build.sh", "names"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **env},
        check=True,
    ).stdout
    names: dict[str, list[str]] = {}
    for line in output.splitlines():
        kind, reference = line.split()
        names.setdefault(kind, []).append(reference)
    return names


def test_config_default_image_is_the_file_build_sh_writes() -> None:
    schema = yaml.safe_load((REPO / "configs" / "schema.yaml").read_text())
    default = schema["properties"]["container_image"]["default"]
    assert build_names()["apptainer"] == [default] == [cluster.SIF_IMAGE]
    for config in sorted((REPO / "configs").glob("*.yaml")):
        image = (yaml.safe_load(config.read_text()) or {}).get("container_image")
        assert image in (None, default), f"{config.name}: container_image {image} is not what build.sh makes"


def test_kubernetes_profile_image_is_the_one_build_sh_pushes() -> None:
    """The profile's example is what build.sh pushes, with COMMIT for the commit that every tag carries (so that a
    rebuilt image never reuses a tag that nodes cached); build.sh refuses to push a tag of uncommitted files."""
    image = yaml.safe_load((REPO / "profiles" / "kubernetes" / "config.yaml").read_text())["container-image"]
    registry_name = image.rsplit(":", 1)[0]
    pushed = build_names(IMAGE=registry_name)["push"]
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True)
    assert all(f"-{commit.stdout.strip()}-" in name for name in pushed), pushed
    examples = [re.sub(r"-[0-9a-f]{12}(-dirty)?-", "-COMMIT-", name) for name in pushed]
    assert image in examples, f"profiles/kubernetes container-image {image}; build.sh pushes {pushed}"
    assert image.endswith("-gpu")  # the GPU image: training and evaluation need CUDA
    env = {**os.environ, "IMAGE": registry_name, "TAG": "0.1.0-0123456789ab-dirty"}
    refused = subprocess.run(["bash", "containers/build.sh", "push"], cwd=REPO, env=env, capture_output=True, text=True)
    assert refused.returncode == 1 and "not pushing 0.1.0-0123456789ab-dirty: commit first" in refused.stderr


def test_apptainer_without_the_image_stops_the_plan_naming_the_build_command(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apptainer").write_text(STAND_IN_APPTAINER)
    (bin_dir / "apptainer").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    missing = tmp_path / "absent.sif"
    command = ["snakemake", "-n", "--sdm", "apptainer", "--directory", str(tmp_path / "work")]
    result = run_command([*command, "--config", f"container_image={missing}"], cwd=REPO, timeout=120, env=env)
    assert result.returncode != 0
    assert f"the image file {missing} does not exist" in result.stdout
    assert cluster.SIF_BUILD_COMMAND in result.stdout


@pytest.mark.parametrize("slurm_job", [None, "41"], ids=["local", "slurm_job"])
def test_apptainer_jobs_run_in_the_image_with_nv(tmp_path: Path, slurm_job: str | None) -> None:
    """One real job (a generated benchmark) through the stand-in: the image and `--nv` without the user's flag, added
    by the shim of pipeline.runtime.host_windows (Snakemake's settings untouched); inside a Slurm job (SLURM_JOB_ID)
    the shim also names the file a launcher ending a time window writes for the host side
    (tests/clusters/test_time_windows.py)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apptainer").write_text(STAND_IN_APPTAINER)
    (bin_dir / "apptainer").chmod(0o755)
    image = tmp_path / "grail.sif"
    image.touch()
    record = tmp_path / "apptainer.txt"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "APPTAINER_RECORD": str(record)}
    env.pop("SLURM_JOB_ID", None)
    if slurm_job:
        env["SLURM_JOB_ID"] = slurm_job
    command = ["snakemake", "--cores", "1", "--sdm", "apptainer", "--apptainer-args", "--bind /tmp"]
    command += ["--directory", str(tmp_path / "work"), "--config", f"container_image={image}"]
    result = run_command([*command, "--", "eval_data/arith_add_hard.jsonl"], cwd=REPO, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-3000:]
    (line,) = record.read_text().splitlines()
    assert line.startswith("exec ")
    options = line.split(f" {image} bash -c ", 1)[0]  # apptainer's arguments before the image
    assert options.split().count("--nv") == 1, line  # added once, without the user's asking
    assert " --bind /tmp " in options, line  # the user's arguments kept
    assert "pipeline.prepare_benchmarks" in line
    assert (tmp_path / "work" / "eval_data" / "arith_add_hard.jsonl").exists()
    requests = Path(f"{record}.request")
    if slurm_job:
        (request,) = requests.read_text().splitlines()
        assert Path(request).parent == tmp_path / "work" / ".snakemake" / "grail-time-windows"
    else:
        assert not requests.exists()


def train_resources(dry_run_output: str) -> list[str]:
    """The `resources:` line of every planned training job."""
    blocks = dry_run_output.split("rule train:")[1:]
    return [re.search(r"^\s+resources: (.*)$", block, flags=re.MULTILINE).group(1) for block in blocks]


def test_a_site_slurm_extra_takes_the_place_of_the_study_flags_but_not_of_the_warning(tmp_path: Path) -> None:
    """Snakemake's own order: `--set-resources RULE:slurm_extra` replaces the rule's flags, `--default-resources`
    fills the rules without any; training's time-limit warning is a resource of its own that neither touches.
    Broken by a warning that rides in slurm_extra (configs/paper.yaml's `--signal=USR1@600` before): the site's
    `--exclusive` dropped it."""
    command = ["snakemake", "-n", "--profile", str(PROFILE), "--directory", str(tmp_path)]
    command += ["--set-resources", "train:slurm_extra='--exclusive'", "--default-resources", "slurm_extra='--nice=5'"]
    result = run_command(command, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    trains = train_resources(result.stdout)
    assert trains
    for resources in trains:
        assert "slurm_extra=--exclusive," in resources and "time_limit_warning_s=600" in resources, resources
    evaluate = re.search(r"rule evaluate:.*?^\s+resources: (.*?)$", result.stdout, flags=re.MULTILINE | re.DOTALL)
    assert "slurm_extra=--nice=5," in evaluate.group(1)  # the site's default for every other rule
