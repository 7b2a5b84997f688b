"""The hub cache: every hub model and dataset revision the study reads is in the Hugging Face cache the jobs
read. Jobs run with HF_HUB_OFFLINE=1 (compute nodes are often offline), so an uncached revision fails its job;
the check names the exact `hf download` commands, into that cache.
"""

from __future__ import annotations

import shlex

from pipeline.clusters.check import Check
from pipeline.models.hub_cache import cached_commit, download_command, hf_home, hub_cache_dir
from pipeline.study.config import Study
from pipeline.study.hub_references import hub_references


def hub_revisions(study: Study) -> list[tuple[str, str, str]]:
    """(repo id, repo type, revision) of every hub model and dataset the study reads."""
    return list(dict.fromkeys((ref.repo_id, ref.repo_type, ref.revision) for ref in hub_references(study)))


def hub_check(study: Study, allow_downloads: bool) -> Check:
    """Every hub revision in the Hugging Face cache the jobs read, else the exact `hf download` commands, which
    download into that cache (a shell's own HF_HOME may be another)."""
    wanted = hub_revisions(study)
    if not wanted:
        return Check("hub cache", "pass", "the study reads no hub model or dataset")
    missing = [download_command(*reference) for reference in wanted if cached_commit(*reference) is None]
    if not missing:
        return Check("hub cache", "pass", f"all {len(wanted)} revisions are cached in {hub_cache_dir()}")
    status = "skipped" if allow_downloads else "fail"
    detail = (
        f"{len(missing)} of {len(wanted)} revisions are not cached in {hub_cache_dir()} (jobs with "
        "HF_HUB_OFFLINE=1 cannot load them)"
    )
    into = f"export HF_HOME={shlex.quote(str(hf_home()))} && "
    return Check("hub cache", status, detail, into + " && ".join(missing))
