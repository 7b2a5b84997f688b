"""The rerun key (pipeline.core.rerun_key): a known answer, a change of any param changes it, and the evaluate rules
of a planned study key their kept samples with every param that reruns them, no more and no less."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.rerun_key import RERUN_KEY_TAG, is_rerun_key, rerun_key, rerun_key_param
from tests.shared_studies import CI_CONFIG, PLUGIN_CONFIG, REPO

# what an evaluate rule's params hold beside its rerun params: where its files are, and the key itself
NOT_RERUN_PARAMS = {"arguments", "rerun_key"}


def test_known_answer() -> None:
    expected = hashlib.sha256(b'{"code":"c","kernels":"pinned"}').hexdigest()
    assert rerun_key({"kernels": "pinned", "code": "c"}) == RERUN_KEY_TAG + expected
    assert is_rerun_key(rerun_key({})) and not is_rerun_key("code {}") and not is_rerun_key(3)


@given(
    st.dictionaries(st.sampled_from(["spec", "libraries", "kernels", "code"]), st.text(), min_size=1),
    st.data(),
)
def test_a_change_of_any_param_changes_the_key(params: dict[str, str], data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(params)))
    changed = data.draw(st.text().filter(lambda value: value != params[name]))
    assert rerun_key({**params, name: changed}) != rerun_key(params)


def test_the_param_evaluates_functions_of_the_wildcards_and_constants() -> None:
    param = rerun_key_param({"spec": lambda wildcards: f"spec of {wildcards['seed']}", "kernels": "native"})
    assert param({"seed": 1}) == rerun_key({"spec": "spec of 1", "kernels": "native"})
    assert param({"seed": 2}) != param({"seed": 1})


def test_every_evaluate_job_keys_its_samples_with_all_its_rerun_params(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planned for real (Snakemake's own DAG of the CI study): each evaluate job's ``rerun_key`` is the key of its
    other params but where its files are, so a param added to the rule without the key fails here."""
    from pipeline.why_rerun import parse_args, planned_workflow

    monkeypatch.syspath_prepend(str(REPO / "docs"))  # the plugin config's method
    args = parse_args(["--configfile", str(CI_CONFIG), str(PLUGIN_CONFIG), "--directory", str(tmp_path)])
    with planned_workflow(args) as workflow:
        jobs = [job for job in workflow.dag.jobs if job.rule.name.startswith("evaluate")]
        assert {job.rule.name for job in jobs} == {"evaluate", "evaluate_analysed"}
        for job in jobs:
            params = dict(job.params.items())
            rerun = {name: value for name, value in params.items() if name not in NOT_RERUN_PARAMS}
            assert {"spec", "libraries", "kernels", "code"} <= rerun.keys()
            assert params["rerun_key"] == rerun_key(rerun), job
