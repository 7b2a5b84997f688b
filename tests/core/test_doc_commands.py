"""Every command the documentation shows in a ```bash block runs, or is checked as far as this machine allows.

- `snakemake ...`: run as shown, as a dry run (`-n` added), in a scratch directory that links the repository's
  Snakefile, configs, profiles, eval_data and docs (so nothing is written into the repository);
- `python -m pipeline.<stage> ...`, `python -m tools.<tool> ...` and `python benchmarks/<script>.py ...`: `--help`
  runs, and every option the command shows is one the stage accepts;
- `bash scripts/install.sh ...`, `pip install -e '.[extras]' [PROJECT_DIR ...]`, `containers/build.sh <target>`: the
  options, extras, project directories and targets exist (installing or building is not a test's job);
- the rest is named here with the reason it cannot run in a test (a finished run, a cluster, credentials).

A command that fits none of these fails the test, so a new command in the docs gets a check or a stated reason.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md"]
LINKED = ("Snakefile", "configs", "profiles", "eval_data", "docs")  # docs/: the example method, examples.halfway
# Commands shown that no test can run here, by their first words, with the reason.
NOT_RUNNABLE = {
    ("bash", "scripts/test.sh"): "the whole test suite",
    ("python3", "-m", "venv"): "creates a virtual environment",
    (".", ".venv/bin/activate"): "activates a virtual environment",
    ("tensorboard",): "needs a finished run with tracking.report_to: tensorboard",
    ("wandb", "sync"): "needs an offline W&B run and the network",
    ("export",): "sets credentials for the Kubernetes run",
    ("pgrep",): "lists a killed controller's jobs (tests/faults/test_controller.py finds them by their parent)",
    ("bash", "scripts/gpu_smoke.sh"): "the GPU smoke run (tests/benchmarks/test_gpu_smoke.py runs its CPU fallback)",
}
# Dry runs that cannot run here, by a part of the command, with the reason.
NOT_DRY_RUNNABLE = {
    "--profile profiles/kubernetes": "its default storage is an S3 bucket (tests/clusters runs it against a stand-in)",
    "--sdm apptainer": "Apptainer cannot be installed here (tests/clusters checks the definition file)",
    "--report": "needs a finished study's outputs",
}


def shown_commands() -> list[tuple[str, str]]:
    """(where, command) for every command in a ```bash block: continuation lines joined, comments dropped, `&&`
    chains split."""
    commands = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in re.finditer(r"^```bash\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
            line_number = text.count("\n", 0, block.start()) + 2
            for offset, line in enumerate(block.group(1).replace("\\\n", " ").splitlines()):
                words = shlex.split(line, comments=True)
                while words:
                    end = words.index("&&") if "&&" in words else len(words)
                    where = f"{page.relative_to(REPO)}:{line_number + offset}"
                    commands.append((where, shlex.join(words[:end])))
                    words = words[end + 1 :]
    return commands


def without_environment(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """Leading `NAME=value` words as an environment, and the command after them."""
    environment = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        environment[name] = value
    return environment, words


def not_runnable(command: str) -> str | None:
    """Why ``command`` is not run here, or None."""
    _, words = without_environment(shlex.split(command))
    for prefix, reason in NOT_RUNNABLE.items():
        if tuple(words[: len(prefix)]) == prefix:
            return reason
    return next((reason for part, reason in NOT_DRY_RUNNABLE.items() if part in command), None)


SHOWN = shown_commands()
# each distinct command once, named by the first place that shows it
FIRST_SHOWN = {command: where for where, command in reversed(SHOWN)}
COMMANDS = [(where, command) for command, where in reversed(FIRST_SHOWN.items()) if not_runnable(command) is None]


def options_shown(words: list[str]) -> set[str]:
    return {word.split("=", 1)[0] for word in words if word.startswith("--")}


@functools.cache
def help_text(*command: str) -> str:
    """``command --help``, once per command (a stage's help imports torch and TRL: seconds of CPU each)."""
    result = subprocess.run(
        [*command, "--help"], cwd=REPO, capture_output=True, text=True, timeout=300, env=python_environment()
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def check_help(command: list[str], shown: list[str]) -> None:
    text = help_text(*command)
    unknown = sorted(option for option in options_shown(shown) if not re.search(rf"{re.escape(option)}(?![\w-])", text))
    assert unknown == [], f"{shlex.join(command)} --help does not list {unknown}"


def python_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment with the repository on PYTHONPATH, after a PYTHONPATH the command shows."""
    extra = dict(extra or {})
    path = os.pathsep.join(part for part in (extra.pop("PYTHONPATH", ""), str(REPO)) if part)
    return {**os.environ, **extra, "PYTHONPATH": path}


def dry_run(environment: dict[str, str], words: list[str], workdir: Path) -> None:
    for name in LINKED:
        (workdir / name).symlink_to(REPO / name)
    arguments = words[1:] if any(word in ("-n", "--dry-run", "--dryrun") for word in words) else [*words[1:], "-n"]
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", *arguments],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
        env=python_environment(environment),
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    # `--unlock` plans nothing: it removes Snakemake's lock and says so
    done = ["Unlocked working directory."] if "--unlock" in words else ["Job stats:", "Nothing to be done"]
    assert any(line in output for line in done), output[-3000:]


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_shown_command(where: str, command: str, tmp_path: Path) -> None:
    environment, words = without_environment(shlex.split(command))
    if words[0] == "snakemake":
        for index, word in enumerate(words):
            if word == "--configfile" and not (REPO / words[index + 1]).is_file():
                pytest.fail(f"{where}: {words[index + 1]} does not exist")
        dry_run(environment, words, tmp_path)
    elif words[:2] in (["python", "-m"], ["python3", "-m"]) and words[2].startswith(("pipeline.", "tools.")):
        check_help([sys.executable, "-m", words[2]], words[3:])
    elif words[0] in ("python", "python3") and words[1].startswith("benchmarks/"):
        check_help([sys.executable, str(REPO / words[1])], words[2:])
    elif words[:2] == ["bash", "scripts/install.sh"]:
        script = (REPO / "scripts" / "install.sh").read_text()
        unknown = [option for option in words[2:] if f"{option})" not in script]
        assert unknown == [], f"{where}: scripts/install.sh does not take {unknown}"
    elif words[:3] == ["pip", "install", "-e"]:
        extras = re.fullmatch(r"\.\[([a-z,]+)\]", words[3])
        assert extras, f"{where}: expected pip install -e '.[extras]', got {words[3]!r}"
        declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        unknown = [extra for extra in extras.group(1).split(",") if extra not in declared]
        assert unknown == [], f"{where}: pyproject.toml has no extra {unknown}"
        projects = [path for path in words[4:] if not (REPO / path / "pyproject.toml").is_file()]
        assert projects == [], f"{where}: no project (pyproject.toml) at {projects}"
    elif words[0] == "containers/build.sh":
        script = (REPO / "containers" / "build.sh").read_text()
        assert re.search(rf"^\s*{re.escape(words[1])}\)", script, flags=re.MULTILINE), f"{where}: no target {words[1]}"
    else:
        pytest.fail(f"{where}: no check for {command!r}: run it here, or add it to NOT_RUNNABLE with the reason")


def test_every_command_left_out_is_still_shown() -> None:
    """The reasons above stay honest: each names a command the docs still show."""
    shown = [command for _, command in SHOWN]
    unused = [
        key
        for key in [*(" ".join(prefix) for prefix in NOT_RUNNABLE), *NOT_DRY_RUNNABLE]
        if not any(key in command for command in shown)
    ]
    assert unused == []
    assert len(COMMANDS) > 20  # the extraction still finds the docs' commands
