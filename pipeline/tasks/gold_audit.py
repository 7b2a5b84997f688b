"""Gold audit: which golds each grading mode refuses when the gold itself is the answer.

An item whose ``\\boxed{gold}`` is not graded correct against its own gold can never be scored correct: a
method-independent ceiling on that benchmark's accuracy. The clean grader should accept every gold that upstream's
plain math-verify accepts, so a gold refused by clean alone is a grader defect, reported by prepare_benchmarks
(the audit file), evaluate (its log) and the report (its first screen).
"""

from __future__ import annotations

from typing import Any

from tqdm import tqdm

from pipeline.tasks.grading import GRADING_MODES
from pipeline.tasks.rewards import gold_self_check


def audit_golds(benchmark: str, items: list[dict[str, str]]) -> dict[str, Any]:
    """Gold self-consistency audit per grading mode: an item whose boxed gold is not graded correct against itself
    can never be scored correct in that mode.

    Returns ``{"benchmark", "items", "modes": {mode: {"failures": [{"id", "answer"}], "failure_count"}},
    "clean_only"}``, where ``clean_only`` lists the golds the clean grader refuses although upstream's plain
    math-verify accepts them (the clean grader should accept everything upstream does: each is a grader bug).
    """
    refused: dict[str, list[dict[str, str]]] = {mode: [] for mode in GRADING_MODES}
    for item in tqdm(items, desc=f"gold audit {benchmark}", unit="item"):
        for mode in GRADING_MODES:
            if not gold_self_check(item["answer"], mode):
                refused[mode].append({"id": item["id"], "answer": item["answer"]})
    upstream_refused = {failure["id"] for failure in refused["upstream"]}
    return {
        "benchmark": benchmark,
        "items": len(items),
        "modes": {mode: {"failures": failures, "failure_count": len(failures)} for mode, failures in refused.items()},
        "clean_only": [failure for failure in refused["clean"] if failure["id"] not in upstream_refused],
    }


def clean_only_warning(audit: dict[str, Any]) -> str | None:
    """The warning for golds that the clean grader refuses and upstream's math-verify accepts, naming the benchmark
    and the item ids; None when there are none."""
    refused = audit.get("clean_only", [])
    if not refused:
        return None
    ids = ", ".join(failure["id"] for failure in refused)
    return (
        f"benchmark {audit['benchmark']}: the clean grader refuses {len(refused)} gold(s) that upstream's plain "
        f"math-verify accepts, so in clean mode these items can never be graded correct: {ids}"
    )
