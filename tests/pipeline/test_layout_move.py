"""A study finished before the layout move (CHANGELOG 0.9: modules moved into subpackages, the run-time settings' one
route) reruns nothing after one ``python -m pipeline.why_rerun --accept``: only the report is remade, to name the
accepted change, and then nothing is left to do.

The finished CI study is rewound to what the code before the move recorded in Snakemake's metadata: the module
names of every job's code digests as they were (``BEFORE_MOVE``: a module split out of an entry module was part of
it), and the train and evaluate commands with the ``--watchdog`` argument that the run-time settings replaced. Every
other param is what that code recorded too: the settings did not change.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.shared_studies import CI_CONFIG_FILES, REPO, with_examples

# Where each module of the package was before the move (the new name -> the old one).
BEFORE_MOVE = {
    **{
        f"pipeline.{package}.{module}": f"pipeline.{module}"
        for package, modules in {
            "core": "io exit_codes launch_dir layout file_digest kernels progress specs provenance",
            "tasks": "arith boxed grading rewards prompts gsm benchmarks gold_audit generation",
            "models": "loading tiny_model qwen_vocabulary vllm_cpu",
            "runtime": "cluster preemption time_windows watchdog disk_space",
            "training": "trainer trainer_metrics grpo_config resume run_state nan_guard tracking",
            "stats": "metrics variance seed_aware",
            "study": "config cost",
        }.items()
        for module in modules.split()
    },
    "pipeline.core.source_digest": "pipeline.code_digest",
    "pipeline.runtime.launching": "pipeline.launch",
    "pipeline.stats.scores": "pipeline.aggregate",
    "pipeline.stats.paired_tests": "pipeline.significance",
    "pipeline.stats.wording": "pipeline.significance",
    "pipeline.evaluation.token_weights": "pipeline.token_analysis",
    "pipeline.evaluation.sampling": "pipeline.evaluate",
    "pipeline.evaluation.eval_spec": "pipeline.evaluate",
    "pipeline.evaluation.backends": "pipeline.evaluate",
    "pipeline.evaluation.hf_backend": "pipeline.evaluate",
    "pipeline.evaluation.vllm_backend": "pipeline.evaluate",
    "pipeline.study.plan": "pipeline.preflight",
    "pipeline.study.power_analysis": "pipeline.power",
}
# The commands' text before the run-time settings' route: (rule, the text now, the text then)
COMMANDS_BEFORE = {
    "train": (" > {log:q} 2>&1", " --watchdog {params.watchdog:q} > {log:q} 2>&1"),
    "evaluate": (" --seed {wildcards.seed}", " --seed {wildcards.seed} --watchdog {params.watchdog:q}"),
}

REWIND = """
import ast, json, sys
from pipeline.core.source_digest import CODE_TAG, parse_source_digest
from pipeline.why_rerun import parse_args, planned_workflow

before, commands = json.loads(sys.argv[1]), json.loads(sys.argv[2])
rewound = 0
with planned_workflow(parse_args(sys.argv[3:])) as workflow:
    persistence = workflow.persistence
    for job in workflow.dag.jobs:
        for output in job.output:
            key = persistence._get_key(output)
            record = persistence._read_record(key)
            if record is None:
                continue
            params = []
            for value in record.params:
                quoted = isinstance(value, str) and value.startswith("'")  # a param as Snakemake serialized it
                digests = parse_source_digest(ast.literal_eval(value) if quoted else value)
                if digests is not None:
                    old = {}
                    for module, digest in digests.items():
                        if module in ("pipeline.core.repo",) or module.count(".") == 1 and module.split(".")[1] in (
                            "core", "tasks", "models", "runtime", "training", "evaluation", "stats", "study"
                        ):
                            continue  # added by the move: the repo paths, the subpackages' __init__
                        old[before.get(module, module)] = digest
                    rewound_value = CODE_TAG + json.dumps(old, sort_keys=True, separators=(",", ":"))
                    value = repr(rewound_value) if quoted else rewound_value
                params.append(value)
            record.params = sorted(params)
            if job.rule.name in commands:
                now, then = commands[job.rule.name]
                assert now in record.code, (job.rule.name, record.code)
                record.code = record.code.replace(now, then)
            persistence._write_record(key, record)
            rewound += 1
print(f"rewound {rewound} outputs")
"""


def snakemake(study: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(study)]
    return subprocess.run([*command, *args, *CI_CONFIG_FILES], capture_output=True, text=True, env=with_examples())


def planned(study: Path) -> dict[str, int]:
    """Jobs per rule that ``snakemake -n`` plans (the target rule ``all`` left out)."""
    result = snakemake(study, "-n", "--quiet", "rules")
    assert result.returncode == 0, result.stderr[-3000:]
    counts = {}
    for line in (result.stdout + result.stderr).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and parts[0] not in ("all", "total", "job"):
            counts[parts[0]] = int(parts[1])
    return counts


def python(study: Path, *args: str) -> str:
    command = [sys.executable, *args, "--directory", str(study), *CI_CONFIG_FILES]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=with_examples())
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


def test_a_study_finished_before_the_move_reruns_nothing_after_one_accept(ci_study_copy: Path) -> None:
    study = ci_study_copy
    assert not planned(study), "the finished CI study plans nothing"
    print(python(study, "-c", REWIND, json.dumps(BEFORE_MOVE), json.dumps(COMMANDS_BEFORE)))
    before_accept = planned(study)
    assert before_accept["train"] > 0 and before_accept["evaluate"] > 0, before_accept  # the move reruns everything
    why = python(study, "-m", "pipeline.why_rerun", "--accept")
    assert "code changed: " in why and "pipeline.io (removed)" in why and "pipeline.core.io (added)" in why, why
    assert "the rule's command changed: -`--watchdog {params.watchdog:q}`" in why, why
    assert "still run" in why and " 0 planned jobs still run" in why, why[-2000:]
    assert planned(study) == {"report": 1}  # to name the accepted change in its provenance
    result = snakemake(study, "--cores", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert not planned(study)
    accepted = [json.loads(line) for line in (study / "results/provenance/accepted_code_changes.jsonl").open()]
    assert {entry["rule"] for entry in accepted} >= {"train", "evaluate", "warmup", "prepare_data"}
    assert all("watchdog" in entry["command"]["made_with"] for entry in accepted if entry["rule"] == "train")
