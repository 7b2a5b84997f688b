"""The aggregate stage end to end on synthetic samples files: scores.csv, summary tables, figures, errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import openpyxl
import pandas as pd
import pytest

from pipeline.aggregate import load_training_curves, main, seed_bands, training_curve_keys, training_curves_figure
from pipeline.core.io import InputError, run_cli
from pipeline.stats.metrics import parse_samples_path
from pipeline.stats.scores import RunKey, parse_run_path

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DOCS = Path(__file__).resolve().parents[2] / "docs"  # docs/examples/halfway.py is importable as examples.halfway


@pytest.fixture
def study(tmp_path: Path, write_samples) -> tuple[list[Path], list[Path]]:
    """One model; base/start (seed 0), grpo/final and grail/final (seeds 0, 1); benchmarks b1 (2 items), b2 (1)."""
    samples = [
        write_samples("m", "base", 0, "start", "b1", {"x": [False, False], "y": [False, False]}),
        write_samples("m", "base", 0, "start", "b2", {"z": [True, False]}),
        write_samples("m", "grpo", 0, "final", "b1", {"x": [True, False], "y": [False, False]}),
        write_samples("m", "grpo", 0, "final", "b2", {"z": [True, True]}),
        write_samples("m", "grpo", 1, "final", "b1", {"x": [True, True], "y": [True, False]}),
        write_samples("m", "grpo", 1, "final", "b2", {"z": [False, False]}),
        write_samples("m", "grail", 0, "final", "b1", {"x": [True, True], "y": [True, True]}),
        write_samples("m", "grail", 0, "final", "b2", {"z": [True, True]}),
        write_samples("m", "grail", 1, "final", "b1", {"x": [True, True], "y": [False, True]}),
        write_samples("m", "grail", 1, "final", "b2", {"z": [True, False]}),
    ]
    metrics = []
    for method in ("grpo", "grail"):
        for seed in (0, 1):
            path = tmp_path / "runs" / "m" / method / f"seed{seed}" / "metrics.jsonl"
            path.parent.mkdir(parents=True)
            records = [{"step": step, "reward": 0.1 * step + seed, "loss": 0.5} for step in (1, 2, 3)]
            if method == "grail":
                for record in records:
                    record.update({"grail/weight_mean": 1.0, "grail/clip_frac_max": 0.2})
            records.append({"step": 3, "train_runtime": 12.0})  # TRL's closing summary record: no reward
            path.write_text("".join(json.dumps(r) + "\n" for r in records))
            metrics.append(path)
    return samples, metrics


def run(tmp_path: Path, samples: list[Path], metrics: list[Path], *extra: str) -> tuple[Path, Path]:
    out, figures = tmp_path / "tables", tmp_path / "figures"
    argv = ["--samples", *map(str, samples), "--out-dir", str(out), "--figures-dir", str(figures), *extra]
    main([*argv, "--train-metrics", *map(str, metrics)] if metrics else argv)
    return out, figures


def score(scores: pd.DataFrame, method: str, seed: int, benchmark: str, metric: str) -> float:
    selected = scores.query("method == @method and seed == @seed and benchmark == @benchmark and metric == @metric")
    assert len(selected) == 1
    return float(selected["value"].iloc[0])


def test_scores_csv_holds_per_benchmark_scores_and_both_averages(tmp_path: Path, study) -> None:
    out, _ = run(tmp_path, *study)
    scores = pd.read_csv(out / "scores.csv")
    assert list(scores.columns) == ["model", "method", "seed", "checkpoint", "benchmark", "metric", "value"]
    assert score(scores, "grpo", 0, "b1", "acc@2") == pytest.approx(0.25)
    assert score(scores, "grpo", 0, "b1", "pass@2") == pytest.approx(0.5)
    assert score(scores, "grpo", 0, "b1", "pass@1") == pytest.approx(0.25)
    assert score(scores, "grpo", 0, "b1", "no_answer") == 3
    assert score(scores, "grpo", 0, "b2", "mean_tokens") == pytest.approx(15)
    # Unweighted: (0.25 + 1) / 2; item-weighted: (2 * 0.25 + 1 * 1) / 3; counts summed / averaged.
    assert score(scores, "grpo", 0, "average", "acc@2") == pytest.approx(0.625)
    assert score(scores, "grpo", 0, "weighted_average", "acc@2") == pytest.approx(0.5)
    assert score(scores, "grpo", 0, "weighted_average", "no_answer") == 3
    assert score(scores, "grpo", 0, "average", "no_answer") == 1.5
    assert score(scores, "grpo", 0, "weighted_average", "items") == 3
    assert set(scores.query("method == 'base'")["checkpoint"]) == {"start"}


def test_summary_tables_give_mean_and_std_over_seeds(tmp_path: Path, study) -> None:
    out, _ = run(tmp_path, *study)
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary[["method", "checkpoint"]].itertuples(index=False, name=None)) == [
        ("base", "start"),
        ("grail", "final"),
        ("grpo", "final"),
    ]
    grpo = summary.set_index("method").loc["grpo"]
    # b1 acc@2 over seeds: 0.25 and 0.75.
    assert grpo["b1/acc@2/mean"] == pytest.approx(0.5)
    assert grpo["b1/acc@2/std"] == pytest.approx(math.sqrt(2 * 0.25**2))
    assert grpo["seeds"] == 2
    assert math.isnan(summary.set_index("method").loc["base", "b1/acc@2/std"])
    columns = [c for c in summary.columns if c.endswith("/mean")]
    assert columns == [
        f"{b}/{m}/mean" for b in ("b1", "b2", "average", "weighted_average") for m in ("acc@2", "pass@2")
    ]

    markdown = (out / "summary.md").read_text()
    assert "| m | base | start | 1 | 0.0 | 0.0 | 50.0 | 100.0 |" in markdown
    assert "| m | grpo | final | 2 | 50.0 ± 35.4 |" in markdown

    workbook = openpyxl.load_workbook(out / "summary.xlsx")
    numbers = list(workbook["summary"].iter_rows(values_only=True))
    assert numbers[0][:5] == ("model", "method", "checkpoint", "seeds", "b1/acc@2/mean")
    assert numbers[3][:5] == ("m", "grpo", "final", 2, pytest.approx(0.5))
    formatted = list(workbook["formatted"].iter_rows(values_only=True))
    assert formatted[3][:5] == ("m", "grpo", "final", "2", "50.0 ± 35.4")


def test_figures_are_written(tmp_path: Path, study) -> None:
    _, figures = run(tmp_path, *study)
    for name in ("scores_by_benchmark.png", "training_curves.png", "training_diagnostics.png"):
        assert (figures / name).read_bytes().startswith(PNG_SIGNATURE)
    assert not list(figures.glob(".*tmp"))


def test_training_curves_are_optional(tmp_path: Path, study) -> None:
    _, figures = run(tmp_path, study[0], [])
    assert (figures / "training_curves.png").read_bytes().startswith(PNG_SIGNATURE)


def test_path_components_give_the_keys() -> None:
    key = parse_samples_path("results/eval/qwen3-4b/grail/seed2/step-50/math500.jsonl")
    assert tuple(key) == ("qwen3-4b", "grail", 2, "step-50", "math500")
    assert tuple(parse_run_path("results/runs/qwen3-4b/oar_g/seed1/metrics.jsonl")) == ("qwen3-4b", "oar_g", 1)


@pytest.mark.parametrize(
    "path", ["m/grail/seed0/final.jsonl", "x/m/grail/run0/final/b.jsonl", "x/m/grail/seed0/final/b.json"]
)
def test_samples_paths_outside_the_layout_are_refused(path: str) -> None:
    with pytest.raises(InputError, match=f"^{path}: "):
        parse_samples_path(path)


def test_bad_samples_path_stops_the_stage_naming_it(tmp_path: Path, study, capsys) -> None:
    stray = tmp_path / "stray.jsonl"
    stray.write_text(study[0][0].read_text())
    with pytest.raises(SystemExit) as exit_info:
        run_cli(
            main,
            ["--samples", str(stray), "--out-dir", str(tmp_path / "t"), "--figures-dir", str(tmp_path / "f")],
        )
    assert exit_info.value.code == 2
    assert str(stray) in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


def test_a_repeated_run_key_is_refused(tmp_path: Path, study) -> None:
    samples, _ = study
    with pytest.raises(InputError, match="same model/method/seed/checkpoint/benchmark"):
        run(tmp_path, [samples[0], samples[0]], [])


def test_a_metrics_record_without_step_is_refused(tmp_path: Path, study) -> None:
    samples, metrics = study
    metrics[0].write_text(json.dumps({"reward": 0.5}) + "\n")
    with pytest.raises(InputError, match=f"{metrics[0]}: record 1: missing or non-integer 'step'"):
        run(tmp_path, samples, metrics)


def test_a_file_whose_items_hold_unequal_sample_counts_is_refused_naming_them(tmp_path: Path, write_samples) -> None:
    """A samples file that lost its last row (its seal too) is refused, not summarized: its pass@k stopped at the
    smaller count and its method dropped out of the summary table (it was only a warning)."""
    samples = [write_samples("m", "grpo", 0, "final", "b1", {"x": [True, False, True], "y": [True, False]})]
    with pytest.raises(InputError, match=r"b1.jsonl: 1 of its 2 items do not hold 3 samples \('y' has 2\)"):
        run(tmp_path, samples, [])
    assert not (tmp_path / "tables").exists()


def test_a_file_whose_items_do_not_hold_the_study_n_samples_is_refused(tmp_path: Path, write_samples) -> None:
    """Every item with the same count, but not the study's n_samples (--samples-per-item): refused as well."""
    samples = [write_samples("m", "grpo", 0, "final", "b1", {"x": [True, False], "y": [True, False]})]
    with pytest.raises(InputError, match=r"2 of its 2 items do not hold 3 samples \('x' has 2, 'y' has 2\)"):
        run(tmp_path, samples, [], "--samples-per-item", "3")
    run(tmp_path, samples, [], "--samples-per-item", "2")


def test_seed_bands_smooth_each_seed_then_take_mean_and_range() -> None:
    curves = {
        RunKey("m", "grpo", 0): pd.DataFrame({"reward": [0.0, 1.0, 2.0]}, index=[1, 2, 3]),
        RunKey("m", "grpo", 1): pd.DataFrame({"reward": [2.0, 3.0, 4.0]}, index=[1, 2, 3]),
        RunKey("m", "grail", 0): pd.DataFrame({"loss": [1.0]}, index=[1]),  # no reward: no band
    }
    bands = seed_bands(curves, "reward", window=2)
    assert list(bands) == [("m", "grpo")]
    # seed 0 smoothed: 0, 0.5, 1.5; seed 1: 2, 2.5, 3.5
    assert bands["m", "grpo"]["mean"].tolist() == [1.0, 1.5, 2.5]
    assert bands["m", "grpo"]["low"].tolist() == [0.0, 0.5, 1.5]
    assert bands["m", "grpo"]["high"].tolist() == [2.0, 2.5, 3.5]


def test_training_curves_lead_with_the_reward_one_line_and_band_per_method(study) -> None:
    _, metrics = study
    curves = load_training_curves(list(map(str, metrics)))
    figure = training_curves_figure(curves)
    reward, *diagnostics = figure.axes
    assert reward.get_title().startswith("reward ")
    assert sorted(line.get_label() for line in reward.lines) == ["grail", "grpo"]
    assert len(reward.collections) == 2  # one seed band per method
    grpo = next(line for line in reward.lines if line.get_label() == "grpo")
    # rewards 0.1 step + seed over seeds 0 and 1, moving average of up to 5: mean = 0.5 + 0.1 * (step + 1) / 2
    assert grpo.get_ydata().tolist() == pytest.approx([0.6, 0.65, 0.7])
    assert [axis.get_title().split(" ")[0] for axis in diagnostics] == ["grail/clip_frac_max"]  # GRAIL's headline
    assert reward.get_position().width > 2 * diagnostics[0].get_position().width
    assert training_curve_keys(curves) == (["reward", "grail/clip_frac_max"], ["grail/weight_mean"])


def test_an_out_of_tree_methods_headline_leads_the_training_curves(tmp_path: Path, study, monkeypatch) -> None:
    """docs/examples/halfway.py named by import path, as a study names it: its `headline` statistic leads the
    training curves as a built-in method's does, its others go to the diagnostics; left unnamed, its statistics
    are refused rather than dropped from both figures."""
    monkeypatch.syspath_prepend(str(DOCS))
    samples, metrics = study
    path = tmp_path / "runs" / "m" / "mine" / "seed0" / "metrics.jsonl"  # the study's name for it: mine
    path.parent.mkdir(parents=True)
    stats = {"halfway/weight_std": 0.4, "halfway/advantages_scale_ratio": 1.5, "halfway/weight_mean": 1.3}
    path.write_text("".join(json.dumps({"step": step, "reward": 0.5, **stats}) + "\n" for step in (1, 2)))
    metrics = [*metrics, path]
    credits = ["grail", "grpo", "examples.halfway"]
    headline, rest = training_curve_keys(load_training_curves(list(map(str, metrics))), credits)
    assert headline == ["reward", "grail/clip_frac_max", "halfway/weight_mean"]
    assert rest == ["grail/weight_mean", "halfway/advantages_scale_ratio", "halfway/weight_std"]
    _, figures = run(tmp_path, samples, metrics, "--credit-methods", *credits)
    assert (figures / "training_curves.png").read_bytes().startswith(PNG_SIGNATURE)
    with pytest.raises(InputError, match=r"credit method\(s\) \['halfway'\], which no --credit-methods names"):
        run(tmp_path / "unnamed", samples, metrics)
    assert not (tmp_path / "unnamed").exists()  # refused before anything is written


def test_a_samples_file_missing_items_of_its_benchmark_is_refused(tmp_path: Path, study) -> None:
    samples, metrics = study
    benchmarks = tmp_path / "eval_data"
    benchmarks.mkdir()
    (benchmarks / "b1.jsonl").write_text("".join(json.dumps({"id": item}) + "\n" for item in ("x", "y", "w", "v")))
    (benchmarks / "b2.jsonl").write_text(json.dumps({"id": "z"}) + "\n")
    with pytest.raises(InputError) as refused:
        run(tmp_path, samples, metrics, "--benchmarks", str(benchmarks / "b1.jsonl"), str(benchmarks / "b2.jsonl"))
    assert str(refused.value) == (
        f"{samples[0]}: 2 of the 4 items of benchmark 'b1' have no sample: the file is incomplete or from another"
        " benchmark"
    )
    (benchmarks / "b1.jsonl").write_text("".join(json.dumps({"id": item}) + "\n" for item in ("x", "y")))
    out, _ = run(tmp_path, samples, metrics, "--benchmarks", str(benchmarks / "b1.jsonl"), str(benchmarks / "b2.jsonl"))
    assert (out / "scores.csv").is_file()
