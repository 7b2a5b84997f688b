"""Which planned jobs a reviewed code change can be accepted for (the DAG runs are in tests/pipeline/test_workflow_e2e.py)."""

from __future__ import annotations

from pipeline.why_rerun import Plan, acceptable


def plan(job: str, *, code: bool = True, other: bool = False, inputs: tuple[str, ...] = ()) -> Plan:
    return Plan(
        rule=job,
        job=job,
        outputs=[f"{job}.out"],
        snakemake_job=None,
        code={"pipeline.metrics": "changed"} if code else {},
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
