"""Stand-in tests of `--profile profiles/kubernetes`: the real Snakemake Kubernetes executor plugin against
scripts/k8s_standin.py (a stand-in API server: strict schema validation of every Job, commands run locally)
with S3 storage served by a local moto server.

Covered: the plugin's API calls, the Job manifests (image, namespace, CPU/memory/GPU requests and limits, the
NVIDIA toleration, secrets for the S3 keys), source deployment and file transfer through S3, job success.
Not covered (no Kubernetes can run here): scheduling, image pulls (commands run on the host's Python, not in
the image), resource enforcement, GPUs, real admission control beyond the schema and the extended-resource rule.
"""

from __future__ import annotations

import json
import os
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


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """A running stand-in API server: its kubeconfig and the directory where it records submitted Jobs."""
    paths = {"kubeconfig": tmp_path / "kubeconfig", "records": tmp_path / "records", "work": tmp_path / "pods"}
    command = [sys.executable, str(STANDIN), "--kubeconfig", str(paths["kubeconfig"])]
    command += ["--record-dir", str(paths["records"]), "--work-root", str(paths["work"])]
    server = start(command, tmp_path / "standin.log")
    try:
        wait_for(paths["kubeconfig"].exists, "the stand-in API server")
        yield paths
    finally:
        stop(server)


@pytest.fixture
def s3_endpoint(tmp_path: Path) -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 with an empty bucket."""
    if shutil.which("moto_server") is None:
        pytest.skip("moto_server is not installed (pip install 'moto[server]')")
    import boto3

    port = free_port()
    server = start(["moto_server", "-H", "127.0.0.1", "-p", str(port)], tmp_path / "moto.log")
    endpoint = f"http://127.0.0.1:{port}"
    try:
        client = boto3.client(
            "s3", endpoint_url=endpoint, aws_access_key_id=S3_KEY, aws_secret_access_key=S3_KEY, region_name="us-east-1"
        )

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

    import boto3

    client = boto3.client(
        "s3", endpoint_url=s3_endpoint, aws_access_key_id=S3_KEY, aws_secret_access_key=S3_KEY, region_name="us-east-1"
    )
    gpu_record = json.loads(client.get_object(Bucket=BUCKET, Key="run/out/gpu_step.json")["Body"].read())
    assert gpu_record["inputs"][0]["threads"] == 2  # the GPU job read the CPU job's output through S3

    profile = yaml.safe_load(PROFILE.joinpath("config.yaml").read_text())
    jobs = manifests(standin["records"])
    assert set(jobs) == {"cpu_step", "gpu_step"}
    for job in jobs.values():
        pod = job["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["image"] == profile["container-image"]
        assert job["metadata"]["namespace"] == profile["kubernetes-namespace"]
        assert (job["spec"]["backoffLimit"], pod["restartPolicy"]) == (0, "Never")
        secrets = {variable["name"] for variable in container["env"] if "valueFrom" in variable}
        assert {"SNAKEMAKE_STORAGE_S3_ACCESS_KEY", "SNAKEMAKE_STORAGE_S3_SECRET_KEY"} <= secrets
        assert container["resources"]["limits"]["memory"] == container["resources"]["requests"]["memory"]

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
    from pipeline import preflight

    for variable in [name for name in os.environ if name.startswith("SNAKEMAKE_STORAGE_S3_")]:
        monkeypatch.delenv(variable)
    profile = yaml.safe_load(PROFILE.joinpath("config.yaml").read_text())
    profile |= {
        "storage-s3-endpoint-url": s3_endpoint,
        "storage-s3-access-key": S3_KEY,
        "storage-s3-secret-key": S3_KEY,
    }

    def statuses(checks: list[preflight.Check]) -> list[tuple[str, str]]:
        return [(check.name, check.status) for check in checks]

    assert statuses(preflight.s3_checks({**profile, "default-storage-prefix": f"s3://{BUCKET}/run"})) == [
        ("S3 keys", "pass"),
        ("S3 endpoint", "pass"),
        ("S3 bucket", "pass"),
        ("S3 write", "pass"),
    ]
    import boto3

    client = boto3.client(
        "s3", endpoint_url=s3_endpoint, aws_access_key_id=S3_KEY, aws_secret_access_key=S3_KEY, region_name="us-east-1"
    )
    assert client.list_objects_v2(Bucket=BUCKET).get("KeyCount", 0) == 0  # the write probe cleaned up
    missing = preflight.s3_checks({**profile, "default-storage-prefix": "s3://no-such-bucket/run"})
    assert statuses(missing) == [
        ("S3 keys", "pass"),
        ("S3 endpoint", "pass"),
        ("S3 bucket", "fail"),
        ("S3 write", "skipped"),
    ]
    assert "has no bucket 'no-such-bucket'" in missing[2].detail
    nobody = f"http://127.0.0.1:{free_port()}"
    unreachable = preflight.s3_checks(
        {**profile, "default-storage-prefix": f"s3://{BUCKET}/run", "storage-s3-endpoint-url": nobody}
    )
    assert statuses(unreachable) == [
        ("S3 keys", "pass"),
        ("S3 endpoint", "fail"),
        ("S3 bucket", "skipped"),
        ("S3 write", "skipped"),
    ]
    assert unreachable[1].detail.startswith(f"{nobody} did not answer: Could not connect")
