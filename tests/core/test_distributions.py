"""``importlib.metadata.packages_distributions`` scanned once per set of installed packages
(pipeline/core/distributions.py): once per process, and kept on disk for the next process until a distribution is
installed, upgraded or removed."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core import distributions

REPO = Path(__file__).resolve().parents[2]
# A process's answer, printed as JSON; with STANDARD the standard library's own scan, and with SCAN_REFUSED that scan
# raises instead of running, so a process that answers has read the kept answer.
ANSWER_SCRIPT = (
    "import json, os, pipeline.core.distributions as d\n"
    "if os.environ.get('STANDARD'):\n"
    "    d.packages_distributions = d._ORIGINAL\n"
    "if os.environ.get('SCAN_REFUSED'):\n"
    "    def refused(): raise AssertionError('scanned although an answer was kept')\n"
    "    d._ORIGINAL = refused\n"
    "print(json.dumps(d.packages_distributions()))\n"
)


def answer_of_a_process(
    cache: Path, site: Path, *, scan_refused: bool = False, standard: bool = False
) -> dict[str, list[str]]:
    """What a fresh process started in ``site`` (also on its path) answers, keeping its answers under ``cache``
    (``standard``: what the standard library answers there)."""
    environment = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": os.pathsep.join([str(REPO), str(site)])}
    environment.update({"SCAN_REFUSED": "1"} if scan_refused else {}, **({"STANDARD": "1"} if standard else {}))
    command = [sys.executable, "-c", ANSWER_SCRIPT]
    result = subprocess.run(command, cwd=site, env=environment, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def install_distribution(site: Path, name: str, version: str, top_level: str) -> Path:
    """A minimal installed distribution in ``site``, as pip lays one out: its metadata directory and its package."""
    metadata = site / f"{name}-{version}.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (metadata / "top_level.txt").write_text(f"{top_level}\n")
    (site / top_level).mkdir(exist_ok=True)
    (site / top_level / "__init__.py").write_text("")
    return metadata


@pytest.fixture
def fresh_scan(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """This process's scan forgotten and its answers kept under ``tmp_path``; the real scan is back afterwards, whether
    the test passed or not."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    distributions._scanned_once.cache_clear()
    yield tmp_path / "cache" / "grail-pipeline" / "packages"
    distributions._scanned_once.cache_clear()


def test_the_scan_runs_once_and_every_caller_gets_its_own_copy(monkeypatch: pytest.MonkeyPatch, fresh_scan) -> None:
    scans: list[int] = []

    def counting_scan() -> dict[str, list[str]]:
        scans.append(1)
        return {"yaml": ["PyYAML"]}

    monkeypatch.setattr(distributions, "_ORIGINAL", counting_scan)
    first = distributions.packages_distributions()
    first["yaml"].append("changed by a caller")
    assert distributions.packages_distributions() == {"yaml": ["PyYAML"]}
    assert len(scans) == 1
    assert [json.loads(path.read_text()) for path in fresh_scan.glob("*.json")] == [{"yaml": ["PyYAML"]}]


def test_a_stage_process_answers_as_the_standard_library_does() -> None:
    """Importing the package swaps the function in before any stage imports transformers or TRL; the answer is
    the standard library's (read from the disk or scanned, whichever this machine's cache holds)."""
    script = (
        "import importlib.metadata as m; expected = m.packages_distributions(); import pipeline; "
        "from pipeline.core.distributions import packages_distributions; "
        "assert m.packages_distributions is packages_distributions; "
        "assert m.packages_distributions() == expected"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert importlib.metadata.packages_distributions is distributions.packages_distributions


def test_the_next_process_reads_the_kept_answer_until_a_distribution_is_installed_or_removed(tmp_path: Path) -> None:
    cache, site = tmp_path / "cache", tmp_path / "site"
    site.mkdir()
    first = answer_of_a_process(cache, site)
    assert first == answer_of_a_process(cache, site, standard=True)
    assert answer_of_a_process(cache, site, scan_refused=True) == first

    metadata = install_distribution(site, "demo-credit", "1.0", "demo_credit")
    installed = answer_of_a_process(cache, site)
    assert installed == answer_of_a_process(cache, site, standard=True)
    assert set(installed["demo_credit"]) == {"demo-credit"}  # twice when two path entries name the site
    assert answer_of_a_process(cache, site, scan_refused=True) == installed

    for path in sorted(metadata.iterdir()):  # uninstalled, as pip does: the metadata directory goes
        path.unlink()
    metadata.rmdir()
    assert "demo_credit" not in answer_of_a_process(cache, site)


def test_an_upgrade_in_place_changes_the_key(tmp_path: Path) -> None:
    """pip writes an upgraded distribution's metadata directory anew: even under the same name (a reinstall of the
    same version) its modification time moves the key."""
    site = tmp_path / "site"
    site.mkdir()
    metadata = install_distribution(site, "demo-credit", "1.0", "demo_credit")
    before = distributions.installed_key([str(site)])
    os.utime(metadata, ns=(metadata.stat().st_atime_ns, metadata.stat().st_mtime_ns + 1_000_000))
    assert distributions.installed_key([str(site)]) != before


def test_a_directory_without_metadata_leaves_the_key_alone(tmp_path: Path) -> None:
    """A stage's working directory is on its path (``python -m``): a study's many job directories share one answer."""
    site, working = tmp_path / "site", tmp_path / "job"
    site.mkdir()
    working.mkdir()
    (working / "config.yaml").write_text("seeds: [0]\n")
    install_distribution(site, "demo-credit", "1.0", "demo_credit")
    assert distributions.installed_key([str(working), str(site)]) == distributions.installed_key([str(site)])


def test_an_unusable_cache_means_scanning(monkeypatch: pytest.MonkeyPatch, fresh_scan: Path, tmp_path: Path) -> None:
    """A kept answer that does not parse is scanned again and replaced; a cache that cannot be written (a read-only
    home in a container) is no error."""
    expected = distributions._ORIGINAL()
    fresh_scan.mkdir(parents=True)
    answer_file = fresh_scan / f"{distributions.installed_key(sys.path)}.json"
    answer_file.write_text('{"yaml": "PyYAML"')
    assert distributions.packages_distributions() == expected
    assert json.loads(answer_file.read_text()) == expected

    blocked = tmp_path / "not_a_directory"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    distributions._scanned_once.cache_clear()
    assert distributions.packages_distributions() == expected
