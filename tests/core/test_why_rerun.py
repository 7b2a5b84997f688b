"""Which planned jobs a reviewed code change can be accepted for (the DAG runs are in tests/pipeline/test_workflow_e2e.py)."""

from __future__ import annotations

import json

from pipeline.core.source_digest import CODE_TAG, parse_source_digest, source_digest
from pipeline.why_rerun import Plan, acceptable, explain_params


def plan(job: str, *, code: bool = True, other: bool = False, inputs: tuple[str, ...] = ()) -> Plan:
    return Plan(
        rule=job,
        job=job,
        outputs=[f"{job}.out"],
        snakemake_job=None,
        code={"pipeline.stats.metrics": "changed"} if code else {},
        other_reasons=other,
        remade_inputs={f"{name}.out" for name in inputs},
    )


def test_accepts_code_only_jobs_and_those_whose_inputs_only_accepted_jobs_remake() -> None:
    plans = [
        plan("a"),  # its code only
        plan("b", inputs=("a",)),  # its code, and an input a remakes
        plan("c", code=False, inputs=("a",)),  # only downstream of a: nothing to re-record
        plan("d", other=True, inputs=("a",)),  # a setting changed too: runs
        plan("e", inputs=("d",)),  # d runs, so e must
        plan("f", inputs=("c",)),  # c does not run once a is accepted
        plan("g", inputs=("elsewhere",)),  # an input remade by no planned job here
    ]
    assert [accepted.job for accepted in acceptable(plans)] == ["a", "b", "f"]


class Change:
    def __init__(self, old: list, new: list) -> None:
        self.only_old, self.only_new = {repr(value) for value in old}, {repr(value) for value in new}


class Job:
    def __init__(self, **params: object) -> None:
        self.params = params


def test_params_are_explained_down_to_the_module_and_by_name() -> None:
    now = source_digest("pipeline.core.layout")
    before = CODE_TAG + json.dumps({**parse_source_digest(now), "pipeline.core.layout": "0" * 16}, sort_keys=True)
    explained = plan("report", code=False)
    explain_params(explained, Job(spec='{"a":2}', code=now), Change([before, '{"a":1}'], [now, '{"a":2}']))
    assert explained.reasons == ["code changed: pipeline.core.layout (changed)", "settings changed: params.spec"]
    assert explained.other_reasons and explained.made_with["pipeline.core.layout"] == "0" * 16

    legacy = plan("report", code=False)
    explain_params(legacy, Job(code=now), Change(["0123456789abcdef"], [now]))
    assert legacy.reasons == ["code changed: recorded before per-module digests (which module is unknown)"]
    assert legacy.other_reasons and not legacy.code
