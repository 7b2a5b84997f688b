"""The reference-numbers guard: the CI study's key numbers against a reference committed in the repository.

The CI study (tests/pipeline/configs/ci.yaml with ci_plugin.yaml: warm-up, every trained method for a few steps,
evaluation on two small benchmarks) runs once per test run for the tests that read a finished study
(tests/shared_studies.py); ``tests/pipeline/test_reference_numbers.py`` reads it too and compares what ``collect``
gathers from it with ``REFERENCE``: every stage runs on one CPU thread (the config's ``cpus``), so with the kernel
path pinned the numbers hold bit for bit across machines with the reference's CPU model (its header's ``cpu``).
On another CPU model they do not: on an Intel Xeon, against a reference made on an AMD EPYC, both on the pinned
AVX2 path, the rewards, token counts, correctness and completions were equal, but the losses, entropies and
gradient norms moved in their last bits (warm-up losses up to 1.3e-6 relative, gradient norms up to 1.7e-3, the
largest OAR-G's, whose perturbed forward amplifies them), and so did every weight digest. There the discrete
numbers are still compared exactly, the continuous ones within ``CROSS_CPU_RTOL``, and weight digests not at all.
What is held:

- per warm-up (``models/<model>/start``): the loss of every SFT step (its ``warmup_log.json``) and a digest of
  the model's tensors;
- per training run (``model/method/seedN``): per logged step the ``STEP_METRICS`` exactly as ``metrics.jsonl``
  logged them, and a digest of the final model's tensors. Besides loss, reward and gradient norm, the entropy and
  the tokens seen, which move with the rollouts even in a step where no group has mixed rewards (ci.yaml's warm-up
  makes the model earn some reward, so the losses, gradient norms and weights also move, and differ by method);
- per evaluation samples file (``model/method/seedN/checkpoint/benchmark``): each item's correctness, one
  character per sample in sample order (``1`` correct, ``0`` wrong), and a short digest of its completions and
  token counts, which a change to sampling moves even where it flips no item.

A digest covers tensor content (sorted names, dtype, shape and bytes, read with safetensors), not the file's bytes,
so that a change in how a file is written does not count as a change of numbers. Timings are left out (they vary
from run to run). Two runs of the CI study on the same machine gave identical numbers in every field held here.

    python -m tests.reference_numbers --check RESULTS_DIR   # compare a finished study's results; exit 1 on a difference
    python -m tests.reference_numbers --update              # run the CI study and rewrite the reference

An intended change of numbers regenerates the reference with ``UPDATE_COMMAND`` and says so in CHANGELOG.md under
a "Changed results" line (docs/contributing.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from pipeline.core.kernels import cpu_model
from pipeline.core.layout import FINAL_CHECKPOINT, METRICS_FILE, RUN_DIR, SAMPLES, START_MODEL
from pipeline.core.provenance import library_versions
from tests.shared_studies import REPO, run_ci_study
from tools.docs_numbers.summary import REFERENCE

UPDATE_COMMAND = "python -m tests.reference_numbers --update"
STEP_METRICS = ("loss", "reward", "grad_norm", "entropy", "num_tokens")
WARMUP_LOG = "warmup_log.json"  # pipeline.warmup's record beside the start model: {"losses": [per step], ...}
SECTIONS = ("warmup", "training", "evaluation")  # in the order the stages run: the first difference leads
ALL = {"model": "*", "method": "*", "seed": "*", "checkpoint": "*", "benchmark": "*"}
LISTED_ITEMS = 10  # item ids a line names before it says how many more
# Step metrics whose last bits follow the CPU model's kernels (the module docstring), and how far they may move on
# another CPU model: 1 %, six times the largest move seen (1.7e-3); a code change that moves no reward, token count
# or completion by less than that is caught only on the reference's CPU model.
CONTINUOUS_METRICS = ("loss", "grad_norm", "entropy")
CROSS_CPU_RTOL = 1e-2
CROSS_CPU_ATOL = 1e-6  # for losses near zero (OAR-G's: 1e-3 and below)


# ----------------------------------------------------------------------------------------------- collect


def tensors_digest(model_dir: Path) -> str:
    """sha256 of a model's tensors: for each name in sorted order its name, dtype and shape, then its bytes."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors file")
    location = {}
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            location |= dict.fromkeys(handle.keys(), path)
    digest = hashlib.sha256()
    for name in sorted(location):
        with safe_open(str(location[name]), framework="pt") as handle:
            tensor = handle.get_tensor(name).contiguous()
        digest.update(json.dumps([name, str(tensor.dtype), list(tensor.shape)]).encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def training_steps(metrics: Path) -> list[dict[str, Any]]:
    """``{"step", *STEP_METRICS}`` of every logged optimisation step (the lines with a ``loss``; the end-of-run
    summary line has ``train_loss`` instead). A metric a line lacks is None."""
    rows = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [{"step": row["step"], **{name: row.get(name) for name in STEP_METRICS}} for row in rows if "loss" in row]


def evaluation_items(samples: Path) -> dict[str, dict[str, str]]:
    """``{"correct": {item: "10"}, "completions": {item: digest}}`` of a samples file: per item id, the correctness
    of its samples in sample order, and the first 16 hex digits of a sha256 over its (completion, num_tokens)
    pairs in sample order."""
    rows = [json.loads(line) for line in samples.read_text(encoding="utf-8").splitlines() if line.strip()]
    by_item: dict[str, list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda row: (row["id"], row["sample"])):
        by_item.setdefault(row["id"], []).append(row)
    correct, completions = {}, {}
    for item, item_rows in by_item.items():
        correct[item] = "".join("1" if row["correct"] else "0" for row in item_rows)
        pairs = [[row["completion"], row["num_tokens"]] for row in item_rows]
        completions[item] = hashlib.sha256(json.dumps(pairs).encode()).hexdigest()[:16]
    return {"correct": correct, "completions": completions}


def collect(results_dir: Path) -> dict[str, Any]:
    """The guarded numbers of a finished study's ``results_dir`` (module docstring), JSON-serialisable, keyed by
    warm-up model, training run and samples file."""
    results_dir = Path(results_dir)
    warmup = {}
    for start in sorted(results_dir.glob(START_MODEL.format(**ALL))):
        losses = json.loads((start / WARMUP_LOG).read_text(encoding="utf-8"))["losses"]
        warmup[start.parent.name] = {"losses": losses, "weights": tensors_digest(start)}
    training = {}
    for run in sorted(results_dir.glob(RUN_DIR.format(**ALL))):
        key = run.relative_to(results_dir / "runs").as_posix()
        training[key] = {
            "steps": training_steps(run / METRICS_FILE),
            "final_weights": tensors_digest(run / FINAL_CHECKPOINT),
        }
    evaluation = {}
    for samples in sorted(results_dir.glob(SAMPLES.format(**ALL))):
        key = samples.relative_to(results_dir / "eval").with_suffix("").as_posix()
        evaluation[key] = evaluation_items(samples)
    return {"warmup": warmup, "training": training, "evaluation": evaluation}


# ----------------------------------------------------------------------------------------------- compare


def same(reference: Any, actual: Any, rtol: float = 0.0) -> bool:
    """Exact equality, NaN equal to NaN (a NaN the reference holds is a number it holds); with ``rtol`` > 0, two
    floats within ``|a - r| <= max(rtol * max(|a|, |r|), CROSS_CPU_ATOL)`` (math.isclose) are the same."""
    floats = isinstance(reference, float) and isinstance(actual, float)
    if floats and math.isnan(reference) and math.isnan(actual):
        return True
    if floats and rtol > 0 and math.isclose(reference, actual, rel_tol=rtol, abs_tol=CROSS_CPU_ATOL):
        return True
    return type(reference) is type(actual) and reference == actual


def value_change(reference: Any, actual: Any) -> str:
    """``reference R, actual A (+D)``: the values as JSON writes them (the shortest text that reads back as the
    same float, so two different floats never print alike), their difference when both are finite numbers."""
    text = f"reference {json.dumps(reference)}, actual {json.dumps(actual)}"
    numbers = all(isinstance(value, int | float) and not isinstance(value, bool) for value in (reference, actual))
    if numbers and math.isfinite(reference) and math.isfinite(actual):
        text += f" ({actual - reference:+.1e})"
    return text


def listed(items: list[str]) -> str:
    """The first LISTED_ITEMS items, comma-separated, and how many more."""
    shown = ", ".join(items[:LISTED_ITEMS])
    return shown if len(items) <= LISTED_ITEMS else f"{shown} and {len(items) - LISTED_ITEMS} more"


def keyed(
    label: str,
    reference: Mapping[str, Any],
    actual: Mapping[str, Any],
    compare_one: Callable[[str, Any, Any], list[str]],
) -> list[str]:
    """Entries only the reference or only the results have, then ``compare_one`` of each shared key, in key order."""
    lines = [
        f"{label} {key}: in the reference, missing from the results" for key in sorted(set(reference) - set(actual))
    ]
    lines += [f"{label} {key}: in the results, not in the reference" for key in sorted(set(actual) - set(reference))]
    for key in sorted(set(reference) & set(actual)):
        lines += compare_one(key, reference[key], actual[key])
    return lines


def digest_change(label: str, reference: str, actual: str) -> list[str]:
    if reference == actual:
        return []
    return [f"{label}: digest differs (reference {reference[:12]}…, actual {actual[:12]}…)"]


def compare_warmup(model: str, reference: dict[str, Any], actual: dict[str, Any], rtol: float) -> list[str]:
    label = f"warm-up {model}"
    lines = []
    ref_losses, act_losses = reference["losses"], actual["losses"]
    if len(ref_losses) != len(act_losses):
        lines.append(f"{label}: {len(ref_losses)} steps in the reference, {len(act_losses)} in the results")
    for step, (ref, act) in enumerate(zip(ref_losses, act_losses, strict=False), start=1):
        if not same(ref, act, rtol):
            lines.append(f"{label} step {step} loss: {value_change(ref, act)}")
    if rtol > 0:
        return lines
    return lines + digest_change(f"{label} weights", reference["weights"], actual["weights"])


def metric_order(name: str) -> tuple[int, str]:
    """STEP_METRICS in their order, then any other metric (a reference made with other STEP_METRICS) by name."""
    return (STEP_METRICS.index(name), "") if name in STEP_METRICS else (len(STEP_METRICS), name)


def compare_training(run: str, reference: dict[str, Any], actual: dict[str, Any], rtol: float) -> list[str]:
    ref_steps = {row["step"]: row for row in reference["steps"]}
    act_steps = {row["step"]: row for row in actual["steps"]}
    lines = [
        f"{run} step {step}: in the reference, missing from the results"
        for step in sorted(set(ref_steps) - set(act_steps))
    ]
    lines += [
        f"{run} step {step}: in the results, not in the reference" for step in sorted(set(act_steps) - set(ref_steps))
    ]
    for step in sorted(set(ref_steps) & set(act_steps)):
        ref_row, act_row = ref_steps[step], act_steps[step]
        for name in sorted((set(ref_row) | set(act_row)) - {"step"}, key=metric_order):
            ref, act = ref_row.get(name), act_row.get(name)
            if not same(ref, act, rtol if name in CONTINUOUS_METRICS else 0.0):
                lines.append(f"{run} step {step} {name}: {value_change(ref, act)}")
    if rtol > 0:
        return lines
    return lines + digest_change(f"{run} final weights", reference["final_weights"], actual["final_weights"])


def compare_evaluation(key: str, reference: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """Correctness and completions: exact on every CPU model."""
    label = f"eval {key}"
    lines = keyed(f"{label} item", reference["correct"], actual["correct"], lambda *_: [])
    shared = sorted(set(reference["correct"]) & set(actual["correct"]))
    worse, better, differing = [], [], []
    for item in shared:
        ref, act = reference["correct"][item], actual["correct"][item]
        if len(ref) != len(act):
            lines.append(f"{label} item {item}: {len(ref)} samples in the reference, {len(act)} in the results")
            continue
        flips = [(sample, was) for sample, (was, now) in enumerate(zip(ref, act, strict=True)) if was != now]
        worse += [f"{item}#{sample}" for sample, was in flips if was == "1"]
        better += [f"{item}#{sample}" for sample, was in flips if was == "0"]
        differing += [item] if flips else []
    if differing:
        lines.append(
            f"{label}: items {listed(differing)} differ (correct->wrong: {listed(worse) or 'none'}; "
            f"wrong->correct: {listed(better) or 'none'})"
        )
    changed = [item for item in shared if reference["completions"].get(item) != actual["completions"].get(item)]
    if changed:
        lines.append(f"{label}: completions of {len(changed)} of {len(shared)} items differ ({listed(changed)})")
    return lines


COMPARERS: dict[str, tuple[str, Callable[[str, Any, Any, float], list[str]]]] = {
    "warmup": ("warm-up", compare_warmup),
    "training": ("training run", compare_training),
    "evaluation": ("eval", lambda key, reference, actual, _rtol: compare_evaluation(key, reference, actual)),
}


def compare(reference: Mapping[str, Any], actual: Mapping[str, Any], cpu: str | None = None) -> list[str]:
    """Every difference between two ``collect`` results as a readable line, warm-up first, then training, then
    evaluation (the first line is the earliest stage that changed); empty when they are equal. The results were
    made on ``cpu`` (None: the reference's CPU model): on another model than the header's ``cpu``, the continuous
    numbers within ``CROSS_CPU_RTOL`` and no weight digests (the module docstring). The header is not compared."""
    made_on = reference.get("header", {}).get("cpu")
    rtol = CROSS_CPU_RTOL if cpu is not None and made_on is not None and cpu != made_on else 0.0
    lines = []
    for section in SECTIONS:
        label, compare_one = COMPARERS[section]
        lines += keyed(
            label,
            reference.get(section, {}),
            actual.get(section, {}),
            lambda key, ref, act, compare_one=compare_one: compare_one(key, ref, act, rtol),
        )
    return lines


def failure_message(differences: Iterable[str]) -> str:
    """The differences, then what to do when they are intended."""
    return "\n".join(
        [
            f"The CI study's numbers differ from the reference ({REFERENCE.relative_to(REPO)}):",
            *(f"  {line}" for line in differences),
            "",
            "If the change is intended, regenerate the reference with the one command",
            f"    {UPDATE_COMMAND}",
            'and add a "Changed results" line to CHANGELOG.md saying what changed the numbers and why.',
        ]
    )


# ----------------------------------------------------------------------------------------------- reference file


def stage_cpu_capability() -> str:
    """The kernel capability torch picks in a stage's process: asked of a fresh interpreter that imports this
    checkout's pipeline first, as every stage does (so a kernel pin that pipeline sets before torch loads is seen)."""
    code = "import pipeline, torch; print(torch.backends.cpu.get_cpu_capability())"
    command = [sys.executable, "-c", code]
    return subprocess.run(command, check=True, capture_output=True, text=True, cwd=REPO).stdout.strip()


def header() -> dict[str, Any]:
    """What made the reference: not compared; its ``cpu`` decides how ``compare`` holds another machine's numbers."""
    return {
        "about": "what made this reference; only cpu is read: on another CPU model the continuous numbers are "
        "compared within a tolerance (tests/reference_numbers.py)",
        "command": UPDATE_COMMAND,
        "python": platform.python_version(),
        "libraries": library_versions(),
        "cpu_capability": stage_cpu_capability(),
        "cpu": cpu_model(),
    }


def write_reference(numbers: dict[str, Any], path: Path = REFERENCE) -> None:
    """The header, then ``collect``'s numbers in its order (fixed by construction: sections in the order the stages
    run, runs and items sorted, each step's metrics in STEP_METRICS order), one value a line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"header": header(), **numbers}, indent=1, ensure_ascii=False)
    path.write_text(text + "\n", encoding="utf-8")


def read_reference(path: Path = REFERENCE) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def update() -> None:
    """Run the CI study in a temporary directory (as the test run's shared study runs) and rewrite REFERENCE."""
    with tempfile.TemporaryDirectory(prefix="grail_reference_") as directory:
        run_ci_study(Path(directory))
        write_reference(collect(Path(directory) / "results"))
    print(f"wrote {REFERENCE.relative_to(REPO)}")


def check(results_dir: Path) -> int:
    """0 when ``results_dir`` holds the reference's numbers; else print the differences and return 1."""
    reference = read_reference()
    differences = compare(reference, collect(results_dir), cpu_model())
    if differences:
        print(failure_message(differences))
        return 1
    exactly = "exactly" if reference["header"].get("cpu") in (None, cpu_model()) else "on another CPU model"
    print(f"{results_dir}: the reference's numbers, {exactly}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.reference_numbers", description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--update", action="store_true", help="run the CI study and rewrite the reference")
    action.add_argument("--check", type=Path, metavar="RESULTS_DIR", help="compare a finished study's results")
    args = parser.parse_args(argv)
    if args.update:
        update()
        return 0
    return check(args.check)


if __name__ == "__main__":
    sys.exit(main())
