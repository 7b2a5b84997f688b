"""The study numbers in the README and the docs come from recorded runs (tools.docs_numbers), and the recorded
runs from the current code (tied to the reference guard's numbers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.io import InputError
from tools.docs_numbers import record, render
from tools.docs_numbers import summary as summary_format

STUDIES = summary_format.load_studies()


def test_every_generated_block_is_what_the_recorded_studies_render() -> None:
    stale = render.stale_pages(STUDIES)
    assert not stale, f"stale study numbers in {stale}: run `python -m tools.docs_numbers`"


def test_every_recorded_study_was_recorded_under_the_current_reference_numbers() -> None:
    """The reference guard's file (tests/reference/ci_study.json) changes exactly when the code's numbers do: a
    study recorded under another one quotes numbers the current version does not give."""
    assert {"default", "ablations"} <= set(STUDIES)
    stale = summary_format.stale_summaries(STUDIES)
    assert not stale, (
        f"docs/numbers/{stale[0]}.json was recorded before the numbers last changed (the reference guard's file "
        "moved since): run the study (`snakemake --cores 2 [--configfile configs/STUDY.yaml]`), then "
        "`python -m tools.docs_numbers --record STUDY RESULTS_DIR` and `python -m tools.docs_numbers`, and say so "
        "in CHANGELOG under 'Changed results'"
    )


def test_a_reference_header_change_keeps_the_summaries_and_a_moved_number_makes_them_stale(tmp_path: Path) -> None:
    """The summaries are tied to the reference's numbers, not its header: naming the CPU model it was made on (as
    bb4f8cd did) changes no number; a moved loss does. Checked by breaking it: with the whole file digested, the
    header change makes every summary stale."""
    reference = json.loads(summary_format.REFERENCE.read_text())
    reference["header"]["cpu"] = "another CPU model"
    header_changed = tmp_path / "header_changed.json"
    header_changed.write_text(json.dumps(reference, indent=2))
    assert summary_format.stale_summaries(STUDIES, header_changed) == []
    run = next(iter(reference["training"].values()))
    run["steps"][0]["loss"] += 1e-9
    number_moved = tmp_path / "number_moved.json"
    number_moved.write_text(json.dumps(reference))
    assert sorted(summary_format.stale_summaries(STUDIES, number_moved)) == sorted(STUDIES)


def test_the_default_study_is_recorded_as_reproduced_across_kernel_environments() -> None:
    """The pin's claim in docs/fidelity.md: the same outputs with the machine's native kernels and with every
    library limited to AVX2 from outside."""
    default = STUDIES["default"]
    assert default["kernel_paths"] == ["pinned AVX2"]
    outside = [run["variables"] for run in default["reproduced_by"]]
    assert any(variables.get("MKL_ENABLE_INSTRUCTIONS") == "AVX2" for variables in outside)


def summary(rows: list[tuple[str, int, str, str, float]], item_tests: list[dict]) -> dict:
    """A hand-made summary: score rows (method, seed, benchmark, metric, value) at the right checkpoints."""
    scores = [
        {
            "model": "tiny",
            "method": method,
            "seed": seed,
            "checkpoint": "start" if method == "base" else "final",
            "benchmark": benchmark,
            "metric": metric,
            "value": value,
        }
        for method, seed, benchmark, metric, value in rows
    ]
    return {"study": "hand", "scores": scores, "item_tests": item_tests}


def test_scores_and_the_orientation_of_a_pair_tested_the_other_way_round() -> None:
    made = summary(
        [("base", 0, "a", "acc@4", 0.5), ("base", 1, "a", "acc@4", 0.6), ("grpo", 0, "a", "acc@4", 0.7)],
        [
            {
                "test": "paired_bootstrap",
                "metric": "acc@4",
                "benchmark": "a",
                "method_a": "grpo",
                "method_b": "grail",
                "statistic": 0.05,
                "ci_low": 0.01,
                "ci_high": 0.09,
            }
        ],
    )
    assert summary_format.run_scores(made, "base", "a", "acc@4") == pytest.approx([0.5, 0.6])
    assert summary_format.mean_sd_text(summary_format.run_scores(made, "base", "a", "acc@4")) == "55.0 ± 7.1"
    assert summary_format.mean_sd_text(summary_format.run_scores(made, "grpo", "a", "acc@4")) == "70.0"
    assert summary_format.gain(made, "grpo", "a", "acc@4") == pytest.approx(15.0)
    flipped = summary_format.item_test(made, "paired_bootstrap", "grail", "grpo", "a")
    assert (flipped["statistic"], flipped["ci_low"], flipped["ci_high"]) == (-0.05, -0.09, -0.01)
    with pytest.raises(InputError, match="no wilcoxon_items row of grail vs grpo on a"):
        summary_format.item_test(made, "wilcoxon_items", "grail", "grpo", "a")


def test_an_unknown_block_is_named() -> None:
    with pytest.raises(InputError, match=r"README\.md: unknown numbers block 'nope'"):
        render.render_page("<!-- numbers: nope -->\nx\n<!-- /numbers -->\n", {}, "README.md")


def write_study(root: Path, sample: str) -> Path:
    """A minimal finished-study tree: one samples file, one final model, one training log, one provenance."""
    run = root / "runs" / "tiny" / "grpo" / "seed0"
    (run / "final").mkdir(parents=True)
    (run / "final" / "model.safetensors").write_bytes(b"weights")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5, "train_runtime": 3.2}) + "\n")
    kernels = {"kernel_pin": True, "capability": "AVX2", "cpu_model": "CPU", "variables": {}}
    (run / "provenance.json").write_text(json.dumps({"libraries": {"torch": "2.13.0"}, "kernels": kernels}))
    samples = root / "eval" / "tiny" / "grpo" / "seed0" / "final"
    samples.mkdir(parents=True)
    (samples / "arith_add.jsonl").write_text(sample)
    return root


def test_a_reproduction_is_bit_for_bit_but_for_wall_clock_fields(tmp_path: Path) -> None:
    first = write_study(tmp_path / "first", '{"id": 1, "correct": true}\n')
    second = write_study(tmp_path / "second", '{"id": 1, "correct": true}\n')
    (second / "runs/tiny/grpo/seed0/metrics.jsonl").write_text('{"step": 1, "loss": 0.5, "train_runtime": 9.9}\n')
    assert record.reproductions(first, [second])[0]["outputs"] == 3
    third = write_study(tmp_path / "third", '{"id": 1, "correct": false}\n')
    with pytest.raises(InputError, match=r"1 of 3 outputs differ .*: eval/tiny/grpo/seed0/final/arith_add.jsonl"):
        record.reproductions(first, [third])


def test_the_planners_default_seed_spread_cites_the_recorded_default_study() -> None:
    """pipeline.power's DEFAULTS['seed_sd'] quotes GRPO's and GRAIL's sd over seeds in the recorded default study."""
    from pipeline.study.power_analysis import DEFAULTS

    default = STUDIES["default"]
    metric = summary_format.accuracy_metric(default)
    grpo, grail = (
        summary_format.mean_sd(summary_format.run_scores(default, method, "arith_add", metric))[1]
        for method in ("grpo", "grail")
    )
    cited = f"GRPO {grpo:.1f} and GRAIL {grail:.1f} points in the recorded run docs/numbers/default.json"
    assert cited in DEFAULTS["seed_sd"].source
