"""Dry runs of the real Snakefile: bad configs are refused before any job; the paper's study is planned in full."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.study import cost, plan
from pipeline.study.load import load_study

REPO = Path(__file__).resolve().parents[2]
SNAKEFILE = REPO / "Snakefile"


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the repository's Snakefile in ``workdir`` (so nothing is written into the repository)."""
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(SNAKEFILE), "--directory", str(workdir), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def job_counts(output: str) -> dict[str, int]:
    """The dry run's "Job stats" table as {rule: count}."""
    table = output.split("Job stats:", 1)[1]
    rows = re.findall(r"^(\w+)\s+(\d+)$", table, flags=re.MULTILINE)
    return {rule: int(count) for rule, count in rows if rule != "total"}


def write_config(directory: Path, config: dict) -> Path:
    path = directory / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def default_config() -> dict:
    return yaml.safe_load((REPO / "configs" / "default.yaml").read_text())


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda c: c["models"]["tiny"]["warmup"].update(hidden_sise=8), "models.tiny.warmup.hidden_sise"),
        (lambda c: c["training"].update(max_steps="ten"), "training.max_steps"),
        (lambda c: c["methods"]["oar_g"].update(credit="oarg"), "methods.oar_g.credit"),
        (lambda c: c["benchmarks"]["arith_add"].update(kind="gsm9k"), "benchmarks.arith_add.kind"),
        (lambda c: c["token_analysis"].update(benchmark="aime24"), "token_analysis.benchmark"),
    ],
    ids=["unknown-nested-key", "wrong-type", "unknown-credit", "unknown-benchmark-kind", "unknown-benchmark-ref"],
)
def test_bad_config_is_refused_before_any_job(tmp_path: Path, edit, key: str) -> None:
    config = default_config()
    edit(config)
    result = snakemake(tmp_path, "-n", "--configfile", str(write_config(tmp_path, config)))
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"config key `{key}`" in output
    assert "Job stats" not in output
    assert not (tmp_path / "results").exists() and not (tmp_path / "eval_data").exists()


def test_paper_config_plans_the_full_study(tmp_path: Path) -> None:
    result = snakemake(tmp_path, "-n", "-p", "--configfile", str(REPO / "configs" / "paper.yaml"))
    assert result.returncode == 0, result.stderr[-3000:]
    paper = yaml.safe_load((REPO / "configs" / "paper.yaml").read_text())
    models, methods, seeds = len(paper["models"]), len(paper["methods"]), len(paper["seeds"])
    benchmarks = len(paper["benchmarks"])
    analysed_steps = len([c for c in paper["token_analysis"]["checkpoints"] if c != "final"])
    counts = job_counts(result.stdout)
    assert counts["train"] == 15 * len(paper["seeds"]) == models * methods * seeds
    # one evaluation job per (run, checkpoint), on every benchmark; the starting models (baseline) likewise
    assert counts["evaluate"] == models * methods * seeds * len(paper["evaluation"]["checkpoints"]) + models * seeds
    # GRAIL checkpoints only the token analysis reads: MATH-500 alone
    assert counts["evaluate_analysed"] == models * seeds * analysed_steps
    evaluations = re.findall(r"pipeline\.evaluate (.*?) --spec", result.stdout)
    assert sorted(call.count("--benchmark ") for call in evaluations) == [1] * 15 + [benchmarks] * 20
    assert counts["prepare_benchmarks"] == benchmarks and counts["prepare_data"] == 1
    assert counts["token_analysis"] == models * seeds  # one GRAIL run per model and seed
    assert "warmup" not in counts  # hub models start from their hub id
    assert counts["aggregate"] == counts["significance"] == counts["report"] == 1
    # the command line's --configfile replaced the default study instead of extending it
    assert "/tiny/" not in result.stdout
    train = next(line for line in result.stdout.splitlines() if "pipeline.train --model Qwen/Qwen3-8B" in line)
    assert "pipeline.launch --gpus 4 --nodes 1 --engine auto --" in train and "--model-revision main" in train
    assert "--export-steps 50 100 150" in train
    # the GPUs each evaluate job asks for are its sized engine layout (pipeline.study.gpu_sizing), and the cost
    # table the preflight prints lists them per model with the reason
    study = load_study([REPO / "configs" / "paper.yaml"])
    jobs = [job for job in plan.plan(None, REPO / "configs" / "paper.yaml", []) if job.rule in cost.EVALUATE_RULES]
    assert [job.gpus for job in jobs] == [study.evaluation_layout(job.wildcards).gpus for job in jobs] == [4] * 35
    # and the engines each job's command starts are the ones whose GPUs it asked for (TP1 x DP4)
    specs = [
        json.loads(spec)["vllm"] for spec in re.findall(r"pipeline\.evaluate .*? --spec '(\{.*?\})'", result.stdout)
    ]
    assert [(spec["tensor_parallel_size"], spec["data_parallel_size"]) for spec in specs] == [(1, 4)] * 35
    table = plan.cost_table(plan.estimate(study, jobs, concurrent_gpus=16)).splitlines()
    assert (
        "GPUs per evaluation job (layout sized: 80 GB GPUs, one engine per 256 sequences, at most 4 GPUs a job):"
        in table
    )
    assert (
        "  qwen3_4b: 4 GPUs a job, 4 jobs on every benchmark; 8.0 GB bf16 + 16 GB KV cache fit one 80 GB GPU at 0.95 "
        "utilization: TP1 x DP4 for 3,726 sequences"
    ) in table
    assert (
        "  qwen3_8b: 4 GPUs a job, 3 jobs on math500; 16.0 GB bf16 + 16 GB KV cache fit one 80 GB GPU at 0.95 "
        "utilization: TP1 x DP4 for 1,500 sequences"
    ) in table


def test_paper_evaluations_per_benchmark_ask_for_the_gpus_their_sequences_need() -> None:
    """`evaluation.job_per: benchmark` on the paper's study: AIME24's job (90 sequences) asks for one GPU, MATH-500's
    (1,500) for four, as Study.evaluation_layout sizes them (three targets: a small dry run). Broken by planning
    every job's resources without its wildcards: both asked for 4."""
    study = load_study([REPO / "configs" / "paper.yaml"], {"evaluation": {"job_per": "benchmark"}})
    evaluations = f"{study.results_dir}/eval/qwen3_4b/base/seed42/start"
    targets = [f"{evaluations}/{name}.jsonl" for name in ("aime24", "math500", "amc23")]
    per_benchmark = ["--config", "evaluation={job_per: benchmark}"]
    planned = plan.plan(None, REPO / "configs" / "paper.yaml", [*targets, *per_benchmark])
    jobs = [job for job in planned if job.rule == "evaluate"]
    assert {job.wildcards["benchmark"]: job.gpus for job in jobs} == {"aime24": 1, "math500": 4, "amc23": 1}
    assert all(job.gpus == study.evaluation_layout(job.wildcards).gpus for job in jobs)
    (aime24,) = [job for job in jobs if job.wildcards["benchmark"] == "aime24"]
    assert study.evaluation_layout(aime24.wildcards).reason == (
        "8.0 GB bf16 + 16 GB KV cache fit one 80 GB GPU at 0.95 utilization: TP1 x DP1 for 90 sequences"
    )


def test_default_config_plans_every_rule(tmp_path: Path) -> None:
    result = snakemake(tmp_path, "-n")
    assert result.returncode == 0, result.stderr[-3000:]
    counts = job_counts(result.stdout)
    assert set(counts) == {
        "prepare_benchmarks",
        "prepare_data",
        "warmup",
        "train",
        "evaluate",
        "evaluate_analysed",
        "aggregate",
        "significance",
        "token_analysis",
        "token_viewer",
        "report",
        "all",
    }
    assert counts["train"] == 6 and counts["warmup"] == 1


def test_nested_command_line_override_plans_the_evaluations_with_it(tmp_path: Path) -> None:
    """`--config 'evaluation={temperature: 0.7}'`: Snakemake hands the nested 0.7 over as text; it is accepted as
    the number it spells and reaches every evaluation job's spec (so a finished study reruns its evaluations)."""
    result = snakemake(tmp_path, "-n", "-p", "--config", "evaluation={temperature: 0.7}")
    assert result.returncode == 0, result.stderr[-3000:]
    specs = re.findall(r"pipeline\.evaluate .*?--spec '(\{.*?\})'", result.stdout)
    counts = job_counts(result.stdout)
    assert len(specs) == counts["evaluate"] + counts["evaluate_analysed"] > 0
    assert {json.loads(spec)["temperature"] for spec in specs} == {0.7}


def test_methods_only_plans_the_chosen_methods_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    """`--config 'methods_only=[grpo,grail]'` on the default study: only GRPO's and GRAIL's runs (2 seeds each) and
    their evaluations are planned, and the token analysis and viewer name only those two. Broken by ignoring the
    key in Study.from_config: all 6 runs were planned."""
    result = snakemake(tmp_path, "-n", "-p", "--config", "methods_only=[grpo,grail]")
    assert result.returncode == 0, result.stderr[-3000:]
    counts = job_counts(result.stdout)
    assert counts["train"] == 4
    # each run's final model and the base model (2 seeds), one job on both benchmarks each; GRAIL's step-125 export
    # on arith_add
    assert counts["evaluate"] == 4 + 2 and counts["evaluate_analysed"] == 2
    trained = set(re.findall(r"--method-spec '\{\"credit\":\"(\w+)\"", result.stdout))
    assert trained == {"grpo", "grail"}
    refused = snakemake(tmp_path, "-n", "--config", "methods_only=[grpo,grail_typo]")
    assert refused.returncode != 0
    output = refused.stdout + refused.stderr
    assert "config key `methods_only`: grail_typo not among the study's methods (grpo, grail, oar_g)" in output
    assert "Job stats" not in output


def test_nested_command_line_override_that_is_no_number_is_refused_by_name(tmp_path: Path) -> None:
    result = snakemake(tmp_path, "-n", "--config", "evaluation={temperature: 0.7x}")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "config key `evaluation.temperature`: '0.7x' is not of type 'number'" in output
    assert "Job stats" not in output


def test_source_and_warmup_config_plans_source_to_warmup_to_training(tmp_path: Path) -> None:
    """A model built from its package (prepare_model) feeds its warm-up, whose output every run of that model starts
    from; a source without a warm-up is the starting point itself."""
    config = Path(__file__).resolve().parent / "configs" / "source_warmup.yaml"
    result = snakemake(tmp_path, "-n", "-p", "--configfile", str(config))
    assert result.returncode == 0, result.stderr[-3000:]
    counts = job_counts(result.stdout)
    assert counts["prepare_model"] == 2 and counts["warmup"] == 1 and counts["train"] == 4
    assert counts["prepare_benchmarks"] == 2 and counts["prepare_data"] == 1
    assert re.search(r"pipeline\.warmup --model results/models/smol/source --spec", result.stdout)
    trained_from = re.findall(r"pipeline\.train --model (\S+)", result.stdout)
    assert sorted(set(trained_from)) == ["results/models/smol/start", "results/models/smol_cold/source"]
    assert "pipeline.prepare_model --spec" in result.stdout
    baseline = re.findall(r"pipeline\.evaluate --model (results/models/\S+) ", result.stdout)
    assert sorted(set(baseline)) == ["results/models/smol/start", "results/models/smol_cold/source"]


BAD_BENCHMARK_LINES = [
    '{"id": "a", "problem": "1+1=?", "answer": "2"}',
    "{not json",
    '{"id": "a", "problem": "2+2=?", "answer": "4"}',
    '{"id": "c", "problem": "3+3=?"}',
]


def test_bad_inputs_are_refused_at_plan_time_every_problem_at_once(tmp_path: Path) -> None:
    """A benchmark file of the user's with a line that is no JSON, a repeated id and a row without an answer, and
    model paths that are neither a model directory nor a pinned hub id: one refusal names them all, before any job."""
    (tmp_path / "mine.jsonl").write_text("".join(line + "\n" for line in BAD_BENCHMARK_LINES), encoding="utf-8")
    (tmp_path / "no_config").mkdir()
    config = default_config()
    config["benchmarks"]["mine"] = {"kind": "qwen_jsonl", "path": "mine.jsonl"}
    config["models"].update(
        gone={"path": "models/gone/"}, unpinned={"path": "Qwen/Qwen3-4B"}, empty={"path": "no_config"}
    )
    result = snakemake(tmp_path, "-n", "--configfile", str(write_config(tmp_path, config)))
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "the study's inputs have 6 problem(s)" in output, output[-3000:]
    for problem in (
        "benchmarks.mine.path: mine.jsonl:2: not valid JSON",
        "benchmarks.mine.path: mine.jsonl:3: duplicate id 'a' (first at mine.jsonl:1)",
        "benchmarks.mine.path: mine.jsonl:4: missing answer field",
        "models.gone.path: models/gone/: no such model directory",
        "models.unpinned.path: Qwen/Qwen3-4B: no such model directory; as a hub id it needs models.unpinned.revision",
        "models.empty.path: no_config: a model directory, but without a config.json",
    ):
        assert problem in output, output[-3000:]
    assert "Job stats" not in output
    assert not (tmp_path / "results").exists() and not (tmp_path / "eval_data").exists()


def test_good_local_inputs_plan_and_skipped_rows_are_named(tmp_path: Path) -> None:
    """A usable benchmark file (one row the stage skips: a warning with its line) and a local model directory plan."""
    (tmp_path / "mine.jsonl").write_text(
        "".join(line + "\n" for line in (BAD_BENCHMARK_LINES[0], BAD_BENCHMARK_LINES[3])), encoding="utf-8"
    )
    (tmp_path / "local_model").mkdir()
    (tmp_path / "local_model" / "config.json").write_text("{}", encoding="utf-8")
    config = default_config()
    config["benchmarks"]["mine"] = {"kind": "qwen_jsonl", "path": "mine.jsonl"}
    config["models"].update(local={"path": "local_model"}, hub={"path": "Qwen/Qwen3-4B", "revision": "main"})
    result = snakemake(tmp_path, "-n", "--configfile", str(write_config(tmp_path, config)))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "input check: benchmarks.mine.path: mine.jsonl:2: missing answer field" in result.stderr
    assert job_counts(result.stdout)["prepare_benchmarks"] == len(config["benchmarks"])
