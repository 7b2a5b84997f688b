"""Stand-in tests of `--profile profiles/kubernetes`: the real Snakemake Kubernetes executor plugin against
scripts/k8s_standin.py (a stand-in API server: strict schema validation of every Job, commands run locally)
with S3 storage served by a local moto server.

Covered: the plugin's API calls, the Job manifests (image, namespace, CPU/memory/GPU requests and limits, the
NVIDIA toleration, secrets for the S3 keys, the volumes: working directory, checkpoint claim and the memory-backed
/dev/shm of the profile's executor, grail-kubernetes), source deployment and file transfer through S3, job success; a
training pod evicted mid-run, retried by Snakemake, resuming from the checkpoint on the profile's claim; the
preflight's S3 checks.
Not covered (no Kubernetes can run here): scheduling, image pulls (commands run on the host's Python, not in
the image), resource enforcement, GPUs, real admission control beyond the schema and the extended-resource rule.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from .conftest import REPO, TINY_WORKFLOW, run_command

PROFILE = REPO / "profiles" / "kubernetes"
TRAIN_WORKFLOW = TINY_WORKFLOW.with_name("train.smk")
STANDIN = REPO / "scripts" / "k8s_standin.py"
BUCKET = "grail-ci"
S3_KEY = "standin-key"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(condition, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not come up within {timeout} s")
        time.sleep(0.2)


def start(command: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log, "wb") as handle:
        return subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env)


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()


@contextlib.contextmanager
def running_standin(tmp_path: Path, env: dict[str, str] | None = None) -> Iterator[dict[str, Path]]:
    """A running stand-in API server whose pods get ``env`` (default: this process's): its kubeconfig, the
    directory where it records submitted Jobs and the one that holds its pods' working directories and logs."""
    paths = {"kubeconfig": tmp_path / "kubeconfig", "records": tmp_path / "records", "work": tmp_path / "pods"}
    command = [sys.executable, str(STANDIN), "--kubeconfig", str(paths["kubeconfig"])]
    command += ["--record-dir", str(paths["records"]), "--work-root", str(paths["work"])]
    server = start(command, tmp_path / "standin.log", env)
    try:
        wait_for(paths["kubeconfig"].exists, "the stand-in API server")
        yield paths
    finally:
        stop(server)


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[dict[str, Path]]:
    with running_standin(tmp_path) as paths:
        yield paths


def s3_client(endpoint: str):
    """A boto3 S3 client of the moto server at ``endpoint`` with the test's keys."""
    import boto3

    return boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=S3_KEY, aws_secret_access_key=S3_KEY, region_name="us-east-1"
    )


@pytest.fixture
def s3_endpoint(tmp_path: Path) -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 with an empty bucket."""
    if shutil.which("moto_server") is None:
        pytest.skip("moto_server is not installed (pip install 'moto[server]')")
    port = free_port()
    server = start(["moto_server", "-H", "127.0.0.1", "-p", str(port)], tmp_path / "moto.log")
    endpoint = f"http://127.0.0.1:{port}"
    try:
        client = s3_client(endpoint)

        def bucket_created() -> bool:
            try:
                client.create_bucket(Bucket=BUCKET)
            except Exception:  # the server is still starting
                return False
            return True

        wait_for(bucket_created, "moto_server")
        yield endpoint
    finally:
        stop(server)


def manifests(records: Path) -> dict[str, dict]:
    """Recorded Jobs by the rule they run (read from the job's Snakemake command line)."""
    by_rule = {}
    for path in records.glob("*.json"):
        job = json.loads(path.read_text())
        command = job["spec"]["template"]["spec"]["containers"][0]["args"][-1]
        rule = command.split("--allowed-rules ", 1)[1].split()[0]
        by_rule[rule] = job
    return by_rule


SHM_MOUNT = {"name": "grail-dshm", "mountPath": "/dev/shm"}


def shm_volume(size: str) -> dict:
    """The pod volume of /dev/shm that the profile's executor (grail-kubernetes) adds: memory-backed, ``size`` at most."""
    return {"name": "grail-dshm", "emptyDir": {"medium": "Memory", "sizeLimit": size}}


def test_standin_tiny_dag_runs_through_the_kubernetes_profile(
    tmp_path: Path, standin: dict[str, Path], s3_endpoint: str
) -> None:
    workdir = tmp_path / "workflow"
    workdir.mkdir()
    shutil.copy(TINY_WORKFLOW, workdir / "Snakefile")  # sources are deployed relative to the working directory
    (workdir / "config.yaml").write_text("{}\n")
    env = {**os.environ, "KUBECONFIG": str(standin["kubeconfig"])}
    command = ["snakemake", "--profile", str(PROFILE), "--configfile", "config.yaml"]
    command += ["--default-storage-prefix", f"s3://{BUCKET}/run", "--storage-s3-endpoint-url", s3_endpoint]
    command += ["--storage-s3-access-key", S3_KEY, "--storage-s3-secret-key", S3_KEY]
    command += ["--seconds-between-status-checks", "1"]
    result = run_command(command, cwd=workdir, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-5000:]

    client = s3_client(s3_endpoint)
    gpu_record = json.loads(client.get_object(Bucket=BUCKET, Key="run/out/gpu_step.json")["Body"].read())
    assert gpu_record["inputs"][0]["threads"] == 2  # the GPU job read the CPU job's output through S3

    profile = yaml.safe_load(PROFILE.joinpath("config.yaml").read_text())
    jobs = manifests(standin["records"])
    assert set(jobs) == {"cpu_step", "gpu_step"}
    for job in jobs.values():
        pod = job["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["image"] == profile["container-image"]
        assert job["metadata"]["namespace"] == profile["grail-kubernetes-namespace"]
        assert (job["spec"]["backoffLimit"], pod["restartPolicy"]) == (0, "Never")
        secrets = {variable["name"] for variable in container["env"] if "valueFrom" in variable}
        assert {"SNAKEMAKE_STORAGE_S3_ACCESS_KEY", "SNAKEMAKE_STORAGE_S3_SECRET_KEY"} <= secrets
        assert container["resources"]["limits"]["memory"] == container["resources"]["requests"]["memory"]
        # the working directory, the profile's checkpoint claim, and grail-kubernetes's memory-backed /dev/shm
        assert pod["volumes"] == [
            {"name": "workdir", "emptyDir": {}},
            {"name": "grail-checkpoints", "persistentVolumeClaim": {"claimName": "grail-checkpoints"}},
            shm_volume(profile["grail-kubernetes-shm-size"]),
        ]
        assert container["volumeMounts"] == [
            {"name": "workdir", "mountPath": "/workdir"},
            {"name": "grail-checkpoints", "mountPath": "/checkpoints"},
            SHM_MOUNT,
        ]

    cpu = jobs["cpu_step"]["spec"]["template"]["spec"]
    resources = cpu["containers"][0]["resources"]
    assert resources["requests"]["cpu"] == "1900m"  # 2 threads x kubernetes-cpu-scalar 0.95
    assert resources["limits"]["cpu"] == "2000m"
    assert resources["requests"]["memory"] == "600M"
    assert "nvidia.com/gpu" not in resources["limits"]
    assert not cpu.get("tolerations")

    gpu = jobs["gpu_step"]["spec"]["template"]["spec"]
    resources = gpu["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] == "1"
    assert resources["requests"]["memory"] == "500M"
    toleration = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}
    assert gpu["tolerations"] == [toleration]


def job_body(resources: dict, **container_extra) -> dict:
    container = {"name": "snakemake", "image": "busybox", "command": ["/bin/sh"], "args": ["-c", "true"]}
    return {
        "metadata": {"name": "probe"},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{**container, **container_extra, "resources": resources}],
                }
            },
        },
    }


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (job_body({}, colour="blue"), "colour"),  # strict: unknown fields are errors
        (job_body({"requests": {"nvidia.com/gpu": "1"}}), "Limit must be set for non overcommitable resources"),
        (job_body({"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}}), "must be equal"),
    ],
)
def test_standin_refuses_invalid_jobs_like_the_api_server(standin: dict[str, Path], body: dict, message: str) -> None:
    import kubernetes

    client = kubernetes.config.new_client_from_config(str(standin["kubeconfig"]))
    api = kubernetes.client.BatchV1Api(client)
    with pytest.raises(kubernetes.client.exceptions.ApiException) as refused:
        api.create_namespaced_job("default", body)
    assert refused.value.status == 422
    assert message in json.loads(refused.value.body)["message"]
    assert not list(standin["records"].glob("*.json"))  # nothing ran


def test_standin_runs_a_valid_job_and_reports_its_exit_code(standin: dict[str, Path]) -> None:
    import kubernetes

    client = kubernetes.config.new_client_from_config(str(standin["kubeconfig"]))
    batch, core = kubernetes.client.BatchV1Api(client), kubernetes.client.CoreV1Api(client)
    body = job_body({}, args=["-c", "echo hello from the pod; exit 3"])
    batch.create_namespaced_job("default", body)
    wait_for(lambda: batch.read_namespaced_job_status("probe", "default").status.failed == 1, "the job's failure")
    (pod,) = core.list_namespaced_pod("default", label_selector="job-name=probe").items
    assert pod.status.container_statuses[0].state.terminated.exit_code == 3
    assert "hello from the pod" in core.read_namespaced_pod_log(pod.metadata.name, "default", container="snakemake")
    batch.delete_namespaced_job("probe", "default")
    with pytest.raises(kubernetes.client.exceptions.ApiException) as gone:
        batch.read_namespaced_job_status("probe", "default")
    assert gone.value.status == 404


def test_preflight_s3_checks_name_each_problem_in_one_line(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The preflight's S3 checks against the moto server: a usable bucket passes all four; a missing bucket and an
    endpoint nobody serves each fail one named check and skip the ones after it, without a traceback."""
    from pipeline.clusters.check import Check
    from pipeline.clusters.kubernetes import s3_checks

    for variable in [name for name in os.environ if name.startswith("SNAKEMAKE_STORAGE_S3_")]:
        monkeypatch.delenv(variable)
    profile = yaml.safe_load(PROFILE.joinpath("config.yaml").read_text())
    profile |= {
        "storage-s3-endpoint-url": s3_endpoint,
        "storage-s3-access-key": S3_KEY,
        "storage-s3-secret-key": S3_KEY,
    }

    def statuses(checks: list[Check]) -> list[tuple[str, str]]:
        return [(check.name, check.status) for check in checks]

    assert statuses(s3_checks({**profile, "default-storage-prefix": f"s3://{BUCKET}/run"})) == [
        ("S3 keys", "pass"),
        ("S3 endpoint", "pass"),
        ("S3 bucket", "pass"),
        ("S3 write", "pass"),
    ]
    client = s3_client(s3_endpoint)
    assert client.list_objects_v2(Bucket=BUCKET).get("KeyCount", 0) == 0  # the write probe cleaned up
    missing = s3_checks({**profile, "default-storage-prefix": "s3://no-such-bucket/run"})
    assert statuses(missing) == [
        ("S3 keys", "pass"),
        ("S3 endpoint", "pass"),
        ("S3 bucket", "fail"),
        ("S3 write", "skipped"),
    ]
    assert "has no bucket 'no-such-bucket'" in missing[2].detail
    nobody = f"http://127.0.0.1:{free_port()}"
    unreachable = s3_checks(
        {**profile, "default-storage-prefix": f"s3://{BUCKET}/run", "storage-s3-endpoint-url": nobody}
    )
    assert statuses(unreachable) == [
        ("S3 keys", "pass"),
        ("S3 endpoint", "fail"),
        ("S3 bucket", "skipped"),
        ("S3 write", "skipped"),
    ]
    assert unreachable[1].detail.startswith(f"{nobody} did not answer: Could not connect")


def test_an_evicted_training_pod_is_retried_and_resumes_from_the_checkpoint_claim(
    tmp_path: Path, s3_endpoint: str
) -> None:
    """The train stage (the training tests' 4-step spec on the untrained tiny model) through the Kubernetes profile
    with the checkpoint claim at a host directory: the pod holds after checkpoint-2, the stand-in evicts it (its
    processes killed, the Job failed), Snakemake's retry starts a fresh pod (a new working directory), which resumes
    at step 2 from the claim, and the metrics hold each step once. Broken by keeping the working directory in the
    run directory (``checkpoint_volume`` ignored by layout.working_dir): the retry trained from step 0."""
    from pipeline.models.tiny_model import TinyModelSpec, save_tiny_model
    from tests.hold_stage import hold_training_env
    from tests.train.train_support import TRAINING_SPEC, training_rows

    model = save_tiny_model(TinyModelSpec(), tmp_path / "model")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in training_rows(32, seed=1)), encoding="utf-8")
    claim = tmp_path / "claim"
    claim.mkdir()
    workdir = tmp_path / "workflow"
    workdir.mkdir()
    shutil.copy(TRAIN_WORKFLOW, workdir / "Snakefile")
    config = {"model": str(model), "data": str(data), "training_spec": TRAINING_SPEC}
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    output = tmp_path / "snakemake.out"
    with running_standin(tmp_path, {**os.environ, **hold_training_env(2)}) as cluster:
        command = ["snakemake", "--profile", str(PROFILE), "--configfile", "config.yaml"]
        command += ["--default-storage-prefix", f"s3://{BUCKET}/run", "--storage-s3-endpoint-url", s3_endpoint]
        command += ["--storage-s3-access-key", S3_KEY, "--storage-s3-secret-key", S3_KEY]
        command += ["--grail-kubernetes-persistent-volumes", f"grail-checkpoints:{claim}"]
        command += ["--grail-kubernetes-shm-size", "512Mi"]  # the setting reaches the pods' /dev/shm
        command += ["--config", f"checkpoint_volume={claim}", "--seconds-between-status-checks", "1"]
        env = {**os.environ, "KUBECONFIG": str(cluster["kubeconfig"]), "PYTHONPATH": str(REPO)}
        with open(output, "w") as log:
            snakemake = subprocess.Popen(command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:

            def holding() -> bool:
                assert snakemake.poll() is None, output.read_text()[-5000:]
                logs = cluster["work"].glob("*.log")
                return any("holding after checkpoint-2" in path.read_text(errors="replace") for path in logs)

            wait_for(holding, "the training pod's hold after checkpoint-2", timeout=300)
            import kubernetes

            core = kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(str(cluster["kubeconfig"])))
            (evicted,) = [path.stem for path in cluster["records"].glob("*.json")]
            (pod,) = core.list_namespaced_pod("default", label_selector=f"job-name={evicted}").items
            eviction = kubernetes.client.V1Eviction(metadata=kubernetes.client.V1ObjectMeta(name=pod.metadata.name))
            core.create_namespaced_pod_eviction(pod.metadata.name, "default", eviction)

            def finished() -> bool:
                for path in cluster["work"].glob("*.log"):  # a retry that started over holds at checkpoint-2 again
                    text = path.read_text(errors="replace")
                    assert path.name.startswith(evicted) or "holding after checkpoint-2" not in text, text[-3000:]
                return snakemake.poll() is not None

            wait_for(finished, "the end of Snakemake", timeout=300)
            assert snakemake.returncode == 0, output.read_text()[-5000:]
        finally:
            if snakemake.poll() is None:
                snakemake.kill()

    jobs = {path.stem: json.loads(path.read_text()) for path in cluster["records"].glob("*.json")}
    assert len(jobs) == 2 and evicted in jobs  # the evicted pod's Job, then the retry's
    for job in jobs.values():
        pod_spec = job["spec"]["template"]["spec"]
        assert {"name": "grail-checkpoints", "persistentVolumeClaim": {"claimName": "grail-checkpoints"}} in (
            pod_spec["volumes"]
        )
        assert {"name": "grail-checkpoints", "mountPath": str(claim)} in pod_spec["containers"][0]["volumeMounts"]
        assert shm_volume("512Mi") in pod_spec["volumes"] and SHM_MOUNT in pod_spec["containers"][0]["volumeMounts"]
    (retry,) = set(jobs) - {evicted}
    (retry_log,) = cluster["work"].glob(f"{retry}-*.log")
    resumed = re.search(r"resuming from (\S+)/checkpoint-2 \(step 2\)", retry_log.read_text())
    assert resumed and resumed[1].startswith(f"{claim}/"), retry_log.read_text()[-5000:]
    client = s3_client(s3_endpoint)
    rows = client.get_object(Bucket=BUCKET, Key="run/runs/tiny/grpo/seed0/metrics.jsonl")["Body"].read().splitlines()
    steps = [json.loads(row)["step"] for row in rows if "train_runtime" not in json.loads(row)]
    assert steps == [1, 2, 3, 4]  # steps 1-2 logged by the evicted pod, on the claim; 3-4 by the retry
