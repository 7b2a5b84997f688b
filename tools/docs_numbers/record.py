"""A finished study -> its recorded summary (the format: ``summary``), with the runs that reproduced it bit for bit
(``python -m tools.docs_numbers --record STUDY RESULTS_DIR [--same-as OTHER_RESULTS_DIR ...]``)."""

from __future__ import annotations

import datetime
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.core.io import InputError, read_jsonl
from pipeline.core.layout import CREDIT_PLACEMENT, FINAL_CHECKPOINT, SIGNIFICANCE, START_CHECKPOINT, TABLES_DIR
from pipeline.stats.seed_aware import SEED_BOOTSTRAP_TEST
from tools.docs_numbers.summary import ITEM_TESTS, REFERENCE, reference_numbers_sha256


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def reward_quarters(metrics: list[dict[str, Any]]) -> dict[str, float]:
    """Mean logged reward over the first and the last quarter of a run's logged steps."""
    rewards = [row["reward"] for row in metrics if "reward" in row and "step" in row]
    if not rewards:
        raise InputError("a training log without reward rows")
    quarter = max(1, len(rewards) // 4)
    return {"first": sum(rewards[:quarter]) / quarter, "last": sum(rewards[-quarter:]) / quarter}


WALL_CLOCK = re.compile(r"time|runtime|per_second")


def outputs_digest(results_dir: Path) -> dict[str, str]:
    """SHA-256 of every output whose bits a kernel path could move: evaluation samples, the warm-up's and each run's
    final weights, and each run's training log without its wall-clock fields; by path under ``results_dir``."""
    digests = {}
    for path in sorted([*results_dir.glob("eval/**/*.jsonl"), *results_dir.glob("**/*.safetensors")]):
        if "checkpoints" not in path.parts and "set_aside" not in path.parts:
            digests[str(path.relative_to(results_dir))] = file_sha256(path)
    for path in sorted(results_dir.glob("runs/*/*/seed*/metrics.jsonl")):
        rows = [{k: v for k, v in row.items() if not WALL_CLOCK.search(k)} for row in read_jsonl(path)]
        digests[str(path.relative_to(results_dir))] = hashlib.sha256(json.dumps(rows).encode()).hexdigest()
    return digests


def provenance_records(results_dir: Path) -> list[dict[str, Any]]:
    """The provenance records of a finished study's training runs and evaluations."""
    paths = sorted(results_dir.glob("runs/*/*/seed*/provenance.json")) + sorted(
        results_dir.glob("eval/**/*.provenance.json")
    )
    if not paths:
        raise InputError(f"{results_dir}: no provenance files (not a finished study)")
    return [json.loads(path.read_text()) for path in paths]


def run_environment(results_dir: Path) -> dict[str, Any]:
    """What a study ran on: kernel paths, CPUs, the kernel variables in effect and the library versions."""
    records = provenance_records(results_dir)
    return {
        "kernel_paths": sorted(
            {f"{'pinned' if r['kernels']['kernel_pin'] else 'native'} {r['kernels']['capability']}" for r in records}
        ),
        "cpus": sorted({r["kernels"]["cpu_model"] for r in records}),
        "variables": records[0]["kernels"]["variables"],
        "libraries": records[0]["libraries"],
    }


def reproductions(results_dir: Path, others: list[Path]) -> list[dict[str, Any]]:
    """The environments of ``others``, each checked to hold the same outputs as ``results_dir`` bit for bit; an
    InputError names the files that differ."""
    expected = outputs_digest(results_dir)
    found = []
    for other in others:
        actual = outputs_digest(other)
        differing = sorted(path for path in expected.keys() | actual.keys() if expected.get(path) != actual.get(path))
        if differing:
            shown = ", ".join(differing[:5]) + (" ..." if len(differing) > 5 else "")
            raise InputError(f"{other}: {len(differing)} of {len(expected)} outputs differ from {results_dir}: {shown}")
        found.append(run_environment(other) | {"outputs": len(actual)})
    return found


def record(study: str, results_dir: Path, config: str, same_as: list[Path], commit: str) -> dict[str, Any]:
    """The summary of a finished study (the format: ``summary``), with the runs that reproduced it bit for bit."""
    scores = pd.read_csv(results_dir / TABLES_DIR / "scores.csv")
    wanted = scores["metric"].str.match(r"^(acc|pass)@\d+$") & scores["checkpoint"].isin(
        [FINAL_CHECKPOINT, START_CHECKPOINT]
    )
    significance = json.loads((results_dir / SIGNIFICANCE).read_text())
    runs = {
        "/".join(path.parent.parts[-3:]): reward_quarters(read_jsonl(path))
        for path in sorted(results_dir.glob("runs/*/*/seed*/metrics.jsonl"))
    }
    return {
        "study": study,
        "config": config,
        "recorded": datetime.date.today().isoformat(),
        "commit": commit,
        "reference_numbers_sha256": reference_numbers_sha256(REFERENCE),
        **run_environment(results_dir),
        "reproduced_by": reproductions(results_dir, same_as),
        "scores": scores[wanted].to_dict(orient="records"),
        "rewards": runs,
        "item_tests": [row for row in significance if row["test"] in ITEM_TESTS],
        "seed_tests": [row for row in significance if row["test"] == SEED_BOOTSTRAP_TEST],
        "placement": {
            path.parent.name: json.loads(path.read_text())
            for path in sorted(results_dir.glob(f"{CREDIT_PLACEMENT.format(model='*')}/placement.json"))
        },
    }
