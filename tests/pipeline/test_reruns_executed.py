"""Reruns executed, not only planned: in a copy of the finished CI study, one change of each kind that reruns
training (a GRAIL option, a training option, the training data, an executable code change), then Snakemake for
real, restricted to the GRAIL run's final model. The new final weights must equal those of a from-scratch run of
the training stage with the new settings and differ from the old ones, and the log must name the checkpoints it
set aside. (Before run fingerprints, each rerun republished the old checkpoint-4: the old weights, new label.)

The changed runs and their references train on the pseudo-random reward of ``tests.hold_stage``: with the outcome
reward the CI study's tiny model scores 0 in every group, no step has a gradient, and every setting gives the same
weights. Each reference runs beside its Snakemake rerun (one core each).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from safetensors.torch import load_file

from pipeline.core.io import canonical_json, read_jsonl
from pipeline.core.seal import file_seal_path, seal_problem, write_seal
from pipeline.study.load import load_study
from pipeline.training.run_state import SET_ASIDE_DIR, WHY_FILE
from tests.hold_stage import pseudo_random_reward_env
from tests.pipeline.test_workflow_e2e import code_copy
from tests.shared_studies import CI_CONFIG, CI_CONFIG_FILES, EXAMPLES_DIR, PLUGIN_CONFIG, REPO, with_examples

pytestmark = pytest.mark.slow

RUN = ("tiny", "grail", 0)
RUN_DIR = Path("results/runs/tiny/grail/seed0")
FINAL = RUN_DIR / "final"


def weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(model_dir / "model.safetensors")


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def environment(code: Path) -> dict[str, str]:
    """The jobs' environment: ``code`` first on the path, the pseudo-random reward's hook, docs/ (examples)."""
    hook = pseudo_random_reward_env()
    paths = [str(code), hook.pop("PYTHONPATH")]
    return {**with_examples(*paths), **hook}


def snakemake_in(study_dir: Path, code: Path = REPO) -> list[str]:
    """``snakemake`` with ``code``'s Snakefile, working in ``study_dir``."""
    return [sys.executable, "-m", "snakemake", "--snakefile", str(code / "Snakefile"), "--directory", str(study_dir)]


def changed_config(tmp_path: Path, edit: dict[str, dict[str, object]]) -> Path:
    """ci.yaml with ``edit`` ({section: {key: value}}, one level deep) applied, as a file."""
    config = yaml.safe_load(CI_CONFIG.read_text())
    for section, values in edit.items():
        for key, value in values.items():
            target = config[section]
            *parents, leaf = key.split(".")
            for parent in parents:
                target = target[parent]
            target[leaf] = value
    path = tmp_path / "changed.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def reference_command(study_dir: Path, config: Path, out: Path) -> list[str]:
    """``python -m pipeline.train`` of the GRAIL run as the train rule would run it from ``config``, into ``out``."""
    study = load_study([config])
    model, method, seed = RUN
    results = study_dir / "results"
    return [
        sys.executable, "-m", "pipeline.train", "--model", str(results / "models" / model / "start"),
        "--training-spec", canonical_json(study.training_spec(model)),
        "--method-spec", canonical_json(study.methods[method].spec),
        "--data", str(results / "data" / "train.jsonl"), "--seed", str(seed), "--out", str(out),
    ]  # fmt: skip


def rerun_beside_reference(
    study_dir: Path, config: Path, tmp_path: Path, code: Path = REPO, allowed: tuple[str, ...] = ("train",)
) -> tuple[Path, str]:
    """Snakemake (of ``code``'s Snakefile) for the GRAIL run's final model with ``config``, only ``allowed``
    rules; meanwhile the reference run of the training stage. Returns the reference's run dir and the job's log."""
    env = environment(code)
    reference = tmp_path / "reference"
    # the job's thread count: Snakemake exports OMP_NUM_THREADS (and its BLAS cousins) = the job's threads, and
    # another count sums in another order (the weights then differ in the last bits from step 3 on)
    threads = {name: "1" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    started = subprocess.Popen(
        reference_command(study_dir, config, reference),
        cwd=code,
        env={**env, **threads},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    command = snakemake_in(study_dir, code)
    # the target first: --configfile takes every argument after it
    command += [
        str(FINAL),
        "--cores",
        "1",
        "--allowed-rules",
        *allowed,
        "--configfile",
        str(config),
        str(PLUGIN_CONFIG),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1200, env=env)
    _, reference_errors = started.communicate(timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    assert started.returncode == 0, reference_errors[-3000:]
    log = (study_dir / "results/logs/train/tiny/grail/seed0.log").read_text()
    return reference, log


def assert_retrained(study_dir: Path, old: dict[str, torch.Tensor], reference: Path, log: str, reason: str) -> None:
    """New final weights = the reference's, not the old ones; the old checkpoints set aside, named in the log."""
    new = weights(study_dir / FINAL)
    assert same(new, weights(reference / "final")), "the rerun's weights are not those of a run with the new settings"
    assert not same(new, old), "the rerun returned the old weights"
    (moved,) = (study_dir / RUN_DIR / SET_ASIDE_DIR).iterdir()
    assert sorted(path.name for path in (moved / "checkpoints").glob("checkpoint-*")) == [
        "checkpoint-2",
        "checkpoint-4",
    ]
    (line,) = [line for line in log.splitlines() if "made under other settings" in line]
    assert "(checkpoint-2, checkpoint-4)" in line and reason in line
    assert f"to {moved.relative_to(study_dir)}: training starts from scratch" in line
    assert "training finished at" not in log and "resuming from" not in log
    assert any(found.startswith(reason) for found in json.loads((moved / WHY_FILE).read_text())["reasons"])


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        ({"methods": {"grail.grail_w_max": 2.0}}, "spec (grail_w_max)"),
        ({"training": {"learning_rate": 1.0e-4}}, "spec (learning_rate)"),
    ],
    ids=["grail_option", "training_option"],
)
def test_changed_setting_retrains(ci_study_copy: Path, tmp_path: Path, edit: dict, reason: str) -> None:
    old = weights(ci_study_copy / FINAL)
    config = changed_config(tmp_path, edit)
    reference, log = rerun_beside_reference(ci_study_copy, config, tmp_path)
    assert_retrained(ci_study_copy, old, reference, log, reason)


def test_changed_training_data_retrains(ci_study_copy: Path, tmp_path: Path) -> None:
    """Training rows replaced (the last quarter dropped); the warm-up is held back (--allowed-rules train) so that
    only the data differs."""
    old = weights(ci_study_copy / FINAL)
    data = ci_study_copy / "results/data/train.jsonl"
    rows = data.read_text().splitlines(keepends=True)
    data.write_text("".join(rows[: 3 * len(rows) // 4]))
    write_seal(data)  # as data preparation would have published other rows (unsealed, the plan would redo them)
    reference, log = rerun_beside_reference(ci_study_copy, CI_CONFIG, tmp_path)
    assert_retrained(ci_study_copy, old, reference, log, "data")


def test_executable_code_change_retrains(ci_study_copy: Path, tmp_path: Path) -> None:
    """GRAIL's weight at z = 0 (a default the CI study does not set) changed in a copy of the code, which plans
    and runs the rerun and its reference; why_rerun --accept was not used, so the change reruns training."""
    code = code_copy(tmp_path)
    grail = code / "pipeline/credit/methods/grail.py"
    text = grail.read_text()
    assert "grail_mean: float = field(default=1.0," in text
    grail.write_text(text.replace("grail_mean: float = field(default=1.0,", "grail_mean: float = field(default=1.5,"))
    old = weights(ci_study_copy / FINAL)
    reference, log = rerun_beside_reference(ci_study_copy, CI_CONFIG, tmp_path, code=code)
    assert_retrained(ci_study_copy, old, reference, log, "code (pipeline.credit.methods.grail)")


def test_changed_benchmark_regenerates_only_its_samples(
    ci_study_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One benchmark's setting changed (arith_add_hard: 12 items -> 9): the plan reruns the evaluate jobs of every
    (run, checkpoint) that reads it and not the token analysis's step-2 job (arith_add alone); executed for one of
    them, the job gives back arith_add's samples byte for byte without sampling them, and arith_add_hard's equal
    those of the stage run alone on the new benchmark."""
    config = changed_config(tmp_path, {"benchmarks": {"arith_add_hard.generated.count": 9}})
    study_dir = ci_study_copy
    eval_dir = study_dir / "results/eval/tiny/grpo/seed0/final"
    kept_before = (eval_dir / "arith_add.jsonl").read_bytes()
    base = snakemake_in(study_dir)
    settings = ["--cores", "1", "--configfile", str(config), str(PLUGIN_CONFIG)]
    plan = subprocess.run([*base, "-n", *settings], capture_output=True, text=True, timeout=600, env=with_examples())
    assert plan.returncode == 0, plan.stderr[-3000:]
    monkeypatch.syspath_prepend(str(EXAMPLES_DIR))  # the plugin config's method
    study = load_study([config, PLUGIN_CONFIG])
    rules = [rule for rule, _, benchmarks in study.evaluation_jobs() if "arith_add_hard" in benchmarks]
    assert f"evaluate {len(rules)}" in " ".join(plan.stdout.split()) and "evaluate_analysed" not in plan.stdout
    target = "results/eval/tiny/grpo/seed0/final/arith_add_hard.jsonl"  # as the rule names it
    allowed = ["--allowed-rules", "prepare_benchmarks", "evaluate"]
    run = subprocess.run(
        [*base, target, *allowed, *settings], capture_output=True, text=True, timeout=1200, env=with_examples()
    )
    assert run.returncode == 0, run.stderr[-3000:]
    log = (study_dir / "results/logs/evaluate/tiny/grpo/seed0/final.log").read_text()
    assert "evaluate: arith_add: the samples kept from an earlier run of this job" in log
    assert "evaluate: arith_add_hard: no partial results; 18 samples to generate" in log
    assert (eval_dir / "arith_add.jsonl").read_bytes() == kept_before
    alone = tmp_path / "alone.jsonl"
    reference = [
        sys.executable, "-m", "pipeline.evaluate", "--model", str(study_dir / "results/runs/tiny/grpo/seed0/final"),
        "--benchmark", str(study_dir / "eval_data/arith_add_hard.jsonl"), "--spec", canonical_json(study.evaluation.spec),
        "--seed", "0", "--out", str(alone),
    ]  # fmt: skip
    threads = {name: "1" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    subprocess.run(
        reference, cwd=REPO, check=True, capture_output=True, timeout=600, env={**with_examples(), **threads}
    )
    assert (eval_dir / "arith_add_hard.jsonl").read_bytes() == alone.read_bytes()


def test_grader_change_regrades_instead_of_giving_back_the_kept_samples(ci_study_copy: Path, tmp_path: Path) -> None:
    """The grader changed in a copy of the code (every boxed answer accepted: the CI study's samples all box one
    and none is right): the evaluate job reruns for its code, and must sample and grade again rather than give
    back the samples it kept from the earlier code (before the kept samples were keyed by the rule's rerun params,
    it gave them back, rc 0, and the tables did not move)."""
    code = code_copy(tmp_path)
    sampling = code / "pipeline/evaluation/sampling.py"
    graded = "return extracted, is_correct(extracted, gold, spec.grading_timeout_seconds, spec.grading)"
    assert graded in sampling.read_text()
    sampling.write_text(sampling.read_text().replace(graded, "return extracted, extracted is not None"))
    eval_dir = ci_study_copy / "results/eval/tiny/grpo/seed0/final"
    before = read_jsonl(eval_dir / "arith_add.jsonl")
    assert not any(row["correct"] for row in before) and all(row["extracted"] is not None for row in before)
    command = [*snakemake_in(ci_study_copy, code), str(eval_dir.relative_to(ci_study_copy) / "arith_add.jsonl")]
    command += ["--cores", "1"]
    command += ["--allowed-rules", "evaluate", *CI_CONFIG_FILES]
    run = subprocess.run(command, capture_output=True, text=True, timeout=1200, env=with_examples(code))
    assert run.returncode == 0, run.stderr[-3000:]
    log = (ci_study_copy / "results/logs/evaluate/tiny/grpo/seed0/final.log").read_text()
    assert "kept from an earlier run" not in log
    assert "evaluate: arith_add: no partial results; 24 samples to generate" in log
    after = read_jsonl(eval_dir / "arith_add.jsonl")
    assert [row["extracted"] for row in after] == [row["extracted"] for row in before]
    assert all(row["correct"] for row in after), "the samples were not graded by the changed code"


def test_lost_and_cut_outputs_of_a_finished_study_are_named_and_made_again(ci_study_copy: Path) -> None:
    """A finished study loses a published model (GRPO's final, deleted), a table (summary.csv, deleted) and the seal
    and last row of a samples file (OAR-G's): a plain run names each, makes them again and what was made from them,
    and leaves the rest as it was. (Before: "Nothing to be done" with the model and the table missing, and the cut
    samples summarized, OAR-G gone from the summary table.)"""
    results = ci_study_copy / "results"
    final = results / "runs/tiny/grpo/seed0/final"
    cut = results / "eval/tiny/oar_g/seed0/final/arith_add.jsonl"
    summary = results / "tables/summary.csv"
    untouched = results / "eval/tiny/grail/seed0/final/arith_add.jsonl"
    old_weights, old_rows, untouched_since = weights(final), cut.read_text(), untouched.stat().st_mtime_ns
    shutil.rmtree(final)
    summary.unlink()
    file_seal_path(cut).unlink()
    cut.unlink()  # rewritten without its last row (a new file: the kept hard link keeps the whole one)
    cut.write_text("".join(old_rows.splitlines(keepends=True)[:-1]))
    command = [*snakemake_in(ci_study_copy), "--cores", "2", *CI_CONFIG_FILES]
    run = subprocess.run(command, capture_output=True, text=True, timeout=1200, env=with_examples())
    assert run.returncode == 0, run.stderr[-3000:]
    assert "results/runs/tiny/grpo/seed0/final: missing from the finished study" in run.stderr
    assert "results/tables/summary.csv: missing from the finished study" in run.stderr
    assert (
        f"{cut.relative_to(ci_study_copy)}: damaged: 23 samples, where eval_data/arith_add.jsonl has 12 items"
        in run.stderr
    )
    assert seal_problem(final) is None and same(weights(final), old_weights)
    assert cut.read_text() == old_rows and seal_problem(cut) is None
    methods = set(pd.read_csv(summary)["method"])
    assert {"grpo", "oar_g", "grail"} <= methods
    assert untouched.stat().st_mtime_ns == untouched_since
    train_log = (results / "logs/train/tiny/grpo/seed0.log").read_text()
    assert "training finished at" in train_log  # published again from its last checkpoint, not trained again
