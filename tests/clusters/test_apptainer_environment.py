"""An Apptainer-style job reads the hub cache the preflight checked.

Under Apptainer an image's variables (the Dockerfile's `ENV`, which `apptainer build` keeps, and grail.def's
`%environment`) take precedence over the host's of the same name; every other variable of the job's environment
passes in. The job's environment here is the one the Snakefile gives every job (`job_hf_home`, the function it
calls), composed with the image's variables as Apptainer composes them; a real process with that environment
looks up the study's hub revisions in its cache, as a stage does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.clusters import hub
from pipeline.models.hub_cache import job_hf_home, repo_cache_dir

from .conftest import REPO, study

CONTAINERS = REPO / "containers"
PAPER = REPO / "configs" / "paper.yaml"


def image_environment() -> dict[str, str]:
    """The variables the image defines: the Dockerfile's ENV (continuation lines joined) and grail.def's exports."""
    dockerfile = (CONTAINERS / "Dockerfile").read_text().replace("\\\n", " ")
    variables = {}
    for line in dockerfile.splitlines():
        if line.startswith("ENV "):
            variables |= dict(pair.split("=", 1) for pair in line.removeprefix("ENV ").split())
    definition = (CONTAINERS / "grail.def").read_text()
    variables |= dict(re.findall(r"^\s+export (\w+)=(\S+)$", definition, flags=re.MULTILINE))
    return variables


def cache(hf_home: Path, references: list[tuple[str, str, str]]) -> None:
    """A hub cache at ``hf_home`` holding a snapshot of every (repo id, type, revision), as `hf download` leaves it."""
    previous = os.environ.get("HF_HOME")
    os.environ["HF_HOME"], commit = str(hf_home), "a" * 40
    try:
        for repo_id, repo_type, revision in references:
            folder = repo_cache_dir(repo_id, repo_type)
            (folder / "snapshots" / (revision if len(revision) == 40 else commit)).mkdir(parents=True, exist_ok=True)
            if len(revision) != 40:
                (folder / "refs").mkdir(exist_ok=True)
                (folder / "refs" / revision).write_text(commit)
    finally:
        os.environ.pop("HF_HOME") if previous is None else os.environ.update(HF_HOME=previous)


@pytest.mark.parametrize("configured", [False, True], ids=["controller's HF_HOME", "study's hf_home"])
def test_an_apptainer_style_job_reads_the_cache_the_preflight_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, configured: bool
) -> None:
    """The preflight's hub check passes on a cache holding the paper study's revisions; a job with the image's
    environment finds every one of them there. Broken by an `ENV HF_HOME=...` in the Dockerfile: the job looks in
    the image's path and finds none; by a Snakefile that leaves a study's hf_home unset in the jobs: the job reads
    the controller's empty cache."""
    paper = study(PAPER)
    references = hub.hub_revisions(paper)
    controller_home, study_home = tmp_path / "controller-hf", tmp_path / "shared-hf"
    monkeypatch.setenv("HF_HOME", str(controller_home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    paper = paper.__class__(**{**paper.__dict__, "hf_home": str(study_home) if configured else None})

    job_environment = dict(os.environ)
    job_hf_home(paper.hf_home, job_environment)  # what the Snakefile sets for every job
    monkeypatch.setenv("HF_HOME", job_environment["HF_HOME"])  # the preflight sets the same before its check
    empty = hub.hub_check(paper, allow_downloads=False)  # its downloads go where the jobs read
    assert empty.status == "fail" and empty.fix.startswith(
        f"export HF_HOME={job_environment['HF_HOME']} && hf download"
    )
    cache(study_home if configured else controller_home, references)
    assert hub.hub_check(paper, allow_downloads=False).status == "pass"

    in_image = {**job_environment, **image_environment()}
    # huggingface_hub's own lookup, offline, as a stage loads a pinned revision
    lookup = (
        "import json, sys; from huggingface_hub import snapshot_download\n"
        "for repo_id, repo_type, revision in json.loads(sys.argv[1]):\n"
        "    snapshot_download(repo_id, repo_type=repo_type, revision=revision, local_files_only=True)"
    )
    found = subprocess.run(
        [sys.executable, "-c", lookup, json.dumps(references)],
        cwd=tmp_path,
        env={**in_image, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.returncode == 0, f"the job's HF_HOME is {in_image.get('HF_HOME')}: {found.stderr[-600:]}"
