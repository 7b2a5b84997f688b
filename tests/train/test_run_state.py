"""A run resumes only from state its own settings made (pipeline.training.run_state): checkpoints made under other settings
are set aside and training starts over; a larger max_steps continues a finished run only under a constant
schedule; one writer per run directory (the lock). docs/reruns.md "What a rerun keeps".

The compared runs train on the pseudo-random reward of ``tests.hold_stage`` (every step moves the weights, so a
continued run that resumed wrongly, or a republished old checkpoint, cannot look right)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from train_support import TRAINING_SPEC, run_train, train_command

from pipeline.core.io import InputError
from pipeline.training.run_state import (
    FINGERPRINT_FILE,
    LOCK_FILE,
    SET_ASIDE_DIR,
    WHY_FILE,
    continuable,
    fingerprint_components,
    fingerprint_record,
    prepare_working_dir,
    run_lock,
    set_aside_after,
    write_fingerprint,
)
from tests.hold_stage import pseudo_random_reward_env

REWARD = pseudo_random_reward_env()
CONSTANT = {**TRAINING_SPEC, "lr_scheduler_type": "constant", "num_iterations": 1}
LINEAR = {**TRAINING_SPEC, "num_iterations": 1}


def weights(run_dir) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "final" / "model.safetensors")


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def train(model_dir, train_jsonl, run_dir, spec) -> subprocess.CompletedProcess[str]:
    result = run_train(train_command(model_dir, train_jsonl, run_dir, training_spec=spec), REWARD)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


# ----------------------------------------------------------------------------------------------- stale state


def record(**spec) -> dict:
    return fingerprint_record(
        {"spec": spec, "seed": 0, "data": "d", "model": {"content": "m"}, "code": {"pipeline.train": "c"}}
    )


def test_state_of_other_settings_is_set_aside_with_its_published_outputs_and_why(tmp_path, caplog) -> None:
    working, final = tmp_path / "checkpoints", tmp_path / "final"
    old, new = record(learning_rate=1e-3), record(learning_rate=2e-3)
    prepare_working_dir(working, old, max_steps=4)
    (working / "checkpoint-2").mkdir()
    (working / "checkpoint-2" / FINGERPRINT_FILE).write_text(json.dumps(old))
    final.mkdir()
    (final / "model.safetensors").write_bytes(b"old")
    moved = prepare_working_dir(working, new, max_steps=4, published=[final, tmp_path / "metrics.jsonl"])
    assert moved is not None and moved.parent == tmp_path / SET_ASIDE_DIR
    assert (moved / "checkpoints" / "checkpoint-2").is_dir() and (moved / "final").is_dir() and not final.exists()
    assert json.loads((moved / WHY_FILE).read_text())["reasons"] == ["spec (learning_rate)"]
    assert json.loads((working / FINGERPRINT_FILE).read_text()) == new and not (working / "checkpoint-2").exists()
    assert (
        f"set aside {working} (checkpoint-2) made under other settings (spec (learning_rate)) to {moved}" in caplog.text
    )
    # the run's own state stays where it is
    assert prepare_working_dir(working, new, max_steps=4) is None and (working / FINGERPRINT_FILE).is_file()


def test_empty_output_parents_made_by_snakemake_are_not_stale_state(tmp_path) -> None:
    (tmp_path / "exports").mkdir()  # the parent of the exports/step-N outputs, made before the job runs
    assert prepare_working_dir(tmp_path / "checkpoints", record(), 4, published=[tmp_path / "exports"]) is None
    (tmp_path / "exports" / "step-2").mkdir()  # an export without the state it came from
    moved = prepare_working_dir(tmp_path / "checkpoints2", record(), 4, published=[tmp_path / "exports"])
    assert moved is not None and (moved / "exports" / "step-2").is_dir()


def test_a_checkpoint_without_a_fingerprint_is_not_resumed_and_delete_deletes(tmp_path, caplog) -> None:
    working = tmp_path / "checkpoints"
    prepare_working_dir(working, record(), max_steps=4)
    (working / "checkpoint-4").mkdir()  # made by a version that recorded no fingerprint
    assert prepare_working_dir(working, record(), max_steps=4, stale="delete") is None
    assert not (working / "checkpoint-4").exists() and not (tmp_path / SET_ASIDE_DIR).exists()
    assert "deleted" in caplog.text and "no fingerprint" in caplog.text


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ({"lr_scheduler_type": "constant", "warmup_steps": 0, "save_steps": 2, "logging_steps": 1}, True),
        ({"lr_scheduler_type": "constant_with_warmup", "warmup_steps": 3, "save_steps": 2, "logging_steps": 1}, True),
        (
            {"lr_scheduler_type": "constant_with_warmup", "warmup_steps": 0.1, "save_steps": 2, "logging_steps": 1},
            False,
        ),
        ({"lr_scheduler_type": "constant", "warmup_ratio": 0.1, "save_steps": 2, "logging_steps": 1}, False),
        ({"lr_scheduler_type": "constant", "save_steps": 0.5, "logging_steps": 1}, False),
        ({"lr_scheduler_type": "linear", "warmup_steps": 0, "save_steps": 2, "logging_steps": 1}, False),
        ({"lr_scheduler_type": "cosine", "warmup_steps": 0, "save_steps": 2, "logging_steps": 1}, False),
    ],
)
def test_only_a_schedule_independent_of_max_steps_is_continuable(setting, expected) -> None:
    assert continuable(setting) is expected


# ----------------------------------------------------------------------------------------------- the stage


@pytest.mark.slow
def test_larger_max_steps_continues_a_constant_schedule_and_restarts_a_decaying_one(
    model_dir, train_jsonl, tmp_path
) -> None:
    """Constant learning rate: 2 steps, then max_steps 4 in the same directory = 4 steps at once (steps 3, 4 only
    are trained). Linear decay (the default): the rate of step 1 depends on max_steps, so it starts over."""
    continued, fresh = tmp_path / "continued", tmp_path / "fresh"
    train(model_dir, train_jsonl, continued, {**CONSTANT, "max_steps": 2})
    result = train(model_dir, train_jsonl, continued, CONSTANT)
    assert "resuming from" in result.stderr and "checkpoint-2 (step 2)" in result.stderr
    assert not (continued / SET_ASIDE_DIR).exists()
    train(model_dir, train_jsonl, fresh, CONSTANT)
    assert same(weights(continued), weights(fresh))
    steps = [json.loads(line)["step"] for line in (continued / "metrics.jsonl").open()]
    assert steps == [json.loads(line)["step"] for line in (fresh / "metrics.jsonl").open()]


# the fingerprint components other than the spec (pipeline.training.run_state.fingerprint_components)
COMPONENTS = {
    "seed": 0,
    "processes": 1,
    "data_digest": "d",
    "model": {"content": "m"},
    "code": {},
    "libraries": None,
    "kernel_path": "pinned AVX2",
}


def test_the_kernel_path_is_in_the_fingerprint() -> None:
    """Checkpoints made on the machine's native AVX-512 kernels (kernel pin off) do not resume a pinned run."""
    pinned = fingerprint_record(fingerprint_components(LINEAR, continues=False, **COMPONENTS))
    native = {**COMPONENTS, "kernel_path": "native AVX512"}
    assert pinned != fingerprint_record(fingerprint_components(LINEAR, continues=False, **native))


def test_a_deepspeed_run_has_a_fingerprint_of_its_own_and_the_others_keep_theirs() -> None:
    """DeepSpeed's checkpoints (one optimizer shard per rank) do not resume under DDP, nor DDP's under DeepSpeed;
    the runs made before the engine was recorded keep their fingerprints."""
    common = {**COMPONENTS, "processes": 2}
    ddp = fingerprint_components(LINEAR, continues=False, **common)
    zero2 = fingerprint_components(LINEAR, continues=False, deepspeed=True, **common)
    assert "engine" not in ddp and zero2 == {**ddp, "engine": "deepspeed"}
    assert fingerprint_record(ddp)["fingerprint"] != fingerprint_record(zero2)["fingerprint"]


def test_gpu_determinism_has_a_fingerprint_of_its_own_and_the_runs_without_keep_theirs() -> None:
    """Turning the study's ``gpu_determinism`` on reruns the train jobs: they must train again, deterministically,
    not republish checkpoints made without it; off leaves the fingerprints of the runs made before it existed."""
    off = fingerprint_components(LINEAR, continues=False, **COMPONENTS)
    on = fingerprint_components(LINEAR, continues=False, gpu_determinism=True, **COMPONENTS)
    assert "gpu_determinism" not in off and on == {**off, "gpu_determinism": True}
    assert fingerprint_record(off)["fingerprint"] != fingerprint_record(on)["fingerprint"]


def test_max_steps_is_in_the_fingerprint_unless_the_schedule_is_continuable(tmp_path, caplog) -> None:
    """A decaying schedule's rate at step 1 depends on max_steps: a larger max_steps sets the old run aside."""
    common = COMPONENTS
    short, long = ({**LINEAR, "max_steps": steps} for steps in (2, 4))
    decaying = [fingerprint_record(fingerprint_components(spec, continues=False, **common)) for spec in (short, long)]
    constant = [fingerprint_record(fingerprint_components(spec, continues=True, **common)) for spec in (short, long)]
    assert decaying[0] != decaying[1] and constant[0] == constant[1]
    working = tmp_path / "checkpoints"
    prepare_working_dir(working, decaying[0], max_steps=2)
    assert prepare_working_dir(working, decaying[1], max_steps=4) is not None and "spec (max_steps)" in caplog.text
    # a constant-schedule run whose max_steps was lowered below its newest checkpoint starts over too
    prepare_working_dir(working, constant[1], max_steps=4)
    (working / "checkpoint-4").mkdir()
    write_fingerprint(working / "checkpoint-4", constant[1])
    assert prepare_working_dir(working, constant[0], max_steps=2) is not None
    assert "checkpoints past max_steps 2: checkpoint-4" in caplog.text


def test_keeping_and_waiting_settings_are_not_in_the_fingerprint() -> None:
    """save_steps and save_total_limit do not change what is trained: a rerun with new values resumes (the collective
    timeout is a run-time setting, outside the spec: pipeline.runtime.settings)."""
    common = COMPONENTS
    specs = [LINEAR, {**LINEAR, "save_steps": 3, "save_total_limit": 1}]
    records = [fingerprint_record(fingerprint_components(spec, continues=False, **common)) for spec in specs]
    assert records[0] == records[1]


# ----------------------------------------------------------------------------------------------- the lock


def test_a_second_writer_is_refused_naming_the_holder(untrained_model, train_jsonl, tmp_path) -> None:
    """A live holder (this test process) on this host: the stage exits 2 naming it and touches no checkpoint."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    marker = run_dir / "checkpoints" / "checkpoint-2" / "trainer_state.json"
    marker.write_text("{}")
    holder = {"host": socket.gethostname(), "pid": os.getpid(), "slurm_job_id": "4242", "started": "earlier"}
    (run_dir / LOCK_FILE).write_text(json.dumps(holder))
    before = sorted((path.relative_to(run_dir), path.stat().st_mtime_ns) for path in run_dir.rglob("*"))
    result = run_train(train_command(untrained_model, train_jsonl, run_dir))
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"another writer is training this run (pid {os.getpid()} on {socket.gethostname()}" in result.stderr
    assert "Slurm job 4242" in result.stderr
    assert sorted((path.relative_to(run_dir), path.stat().st_mtime_ns) for path in run_dir.rglob("*")) == before


def test_a_stale_lock_is_broken_with_a_log_line(tmp_path, caplog) -> None:
    """Its holder's pid is not running on this host (a process that has exited)."""
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(finished.stdout)
    lock = tmp_path / LOCK_FILE
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": dead_pid, "slurm_job_id": None, "started": "x"}))
    with run_lock(tmp_path) as me:
        assert json.loads(lock.read_text())["pid"] == me.pid == os.getpid()
    assert not lock.exists()
    assert f"breaking the stale lock {lock}" in caplog.text and f"pid {dead_pid} is not running" in caplog.text


def test_a_requeued_slurm_job_breaks_its_own_earlier_lock(tmp_path, monkeypatch) -> None:
    """Slurm requeues a job under its own id: the lock of its earlier run (another host, say) is its own."""
    (tmp_path / LOCK_FILE).write_text(
        json.dumps({"host": "node-that-died", "pid": 1, "slurm_job_id": "77", "started": "x"})
    )
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    with run_lock(tmp_path):
        pass
    monkeypatch.setenv("SLURM_JOB_ID", "78")  # another job's lock on another host, squeue unavailable: refused
    monkeypatch.setenv("PATH", str(tmp_path))
    (tmp_path / LOCK_FILE).write_text(
        json.dumps({"host": "other-node", "pid": 1, "slurm_job_id": "77", "started": "x"})
    )
    with pytest.raises(InputError, match="pid 1 on other-node, Slurm job 77"), run_lock(tmp_path):
        pass


@pytest.mark.slurm
def test_a_lock_of_a_slurm_job_that_slurm_no_longer_runs_is_broken(tmp_path, caplog) -> None:
    """Another host's lock names a Slurm job that squeue does not know (the local Slurm of .ci/run)."""
    if shutil.which("squeue") is None or subprocess.run(["squeue", "-h"], capture_output=True).returncode != 0:
        pytest.skip("Slurm is not running (scripts/slurm-single-node.sh)")
    (tmp_path / LOCK_FILE).write_text(
        json.dumps({"host": "other-node", "pid": 1, "slurm_job_id": "999999", "started": "x"})
    )
    with run_lock(tmp_path):
        pass
    assert "Slurm job 999999 is no longer running" in caplog.text


@pytest.mark.parametrize("stale", ["set_aside", "delete"])
def test_the_checkpoints_after_a_collapse_are_moved_out_of_the_runs_way(tmp_path, stale):
    working = tmp_path / "checkpoints"
    for name in ["checkpoint-1", "checkpoint-2", "checkpoint-3", "checkpoint-10", "exports/step-2", "exports/step-3"]:
        (working / name).mkdir(parents=True)
    (working / "metrics.jsonl").write_text('{"step": 3}\n')
    moved, where = set_aside_after(working, 2, ["collapsed training: step 3"], {"healthy_through": 2}, stale)
    assert moved == ["checkpoint-10", "checkpoint-3", "exports/step-3"]
    left = sorted(str(path.relative_to(working)) for path in working.rglob("*") if path.is_dir())
    assert left == ["checkpoint-1", "checkpoint-2", "exports", "exports/step-2"]
    if stale == "delete":
        assert where is None and not (tmp_path / "set_aside").exists()
        return
    assert where.parent == tmp_path / "set_aside"
    assert sorted(path.name for path in (where / "checkpoints").iterdir()) == [
        "checkpoint-10", "checkpoint-3", "exports", "metrics.jsonl"
    ]  # fmt: skip
    assert json.loads((where / "why.json").read_text()) == {
        "reasons": ["collapsed training: step 3"], "healthy_through": 2
    }  # fmt: skip
    assert set_aside_after(working, 2, [], {}, stale) == ([], None)  # nothing after step 2 is left
