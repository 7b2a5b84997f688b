"""The Kubernetes checks of a cluster run, in the order a problem would otherwise show: the profile's own settings
without the network (the image is one containers/build.sh pushed from a commit with this checkout's environment
files, the storage prefix is a bucket of the site's, ``checkpoint_volume`` is a claim's mount path), then the S3
storage one line a problem (keys, endpoint, bucket, write), then through the current kubectl context the namespace
and a node offering the GPUs the jobs ask for. Each would otherwise surface as a pod that cannot start, a botocore
traceback, or training that starts over after an eviction.
"""

from __future__ import annotations

import os
import posixpath
import re
import subprocess
import uuid
from typing import Any

from pipeline.clusters.check import Check
from pipeline.core.repo import REPO_DIR
from pipeline.study import cost
from pipeline.study.config import Study


def kubernetes_static_checks(profile: dict[str, Any], study: Study) -> list[Check]:
    """The profile's own settings, read without the network: the image, the storage prefix, the checkpoint claim."""
    prefix = str(profile.get("default-storage-prefix", ""))
    return [
        image_check(str(profile.get("container-image", ""))),
        Check("storage prefix", "fail", f"{prefix!r} is the profile's example", "set your bucket in SITE SETTINGS")
        if not prefix or EXAMPLE_BUCKET in prefix
        else Check("storage prefix", "pass", prefix),
        checkpoint_claim_check(profile, study),
    ]


def checkpoint_claim_check(profile: dict[str, Any], study: Study) -> Check:
    """Training's checkpoints outlive an evicted pod: ``checkpoint_volume`` (the profile's ``config`` entry, else the
    study's) is the mount path of one of the profile's PersistentVolumeClaims."""
    overrides = dict(str(entry).partition("=")[::2] for entry in profile.get("config") or [])
    volume = overrides.get("checkpoint_volume") or study.checkpoint_volume
    claims = [str(spec).partition(":") for spec in profile.get("grail-kubernetes-persistent-volumes") or []]
    mounted = {path: claim for claim, _, path in claims}
    fix = "mount a claim (grail-kubernetes-persistent-volumes: [CLAIM:PATH]) and set config: [checkpoint_volume=PATH]"
    if volume is None:
        return Check("checkpoint claim", "warn", "no checkpoint_volume: an evicted training pod starts over", fix)
    if volume not in mounted:
        detail = f"checkpoint_volume {volume} is not the mount path of a claim ({', '.join(mounted) or 'none'})"
        return Check("checkpoint claim", "fail", f"{detail}: the checkpoints would go with the pod", fix)
    return Check("checkpoint claim", "pass", f"training checkpoints on claim {mounted[volume]} at {volume}")


# containers/build.sh's tag of the GPU image: VERSION-COMMIT-gpu (12 hex digits of the commit it was built from)
IMAGE_TAG = re.compile(r"^.+-(?P<commit>[0-9a-f]{12})-gpu$")
# What a pod's environment comes from; its code is this checkout's, which Snakemake deploys to every pod.
IMAGE_ENVIRONMENT = ("containers", "pyproject.toml")


def image_check(image: str) -> Check:
    """``container-image`` names a GPU image that containers/build.sh pushed from a commit of this repository whose
    environment files (``IMAGE_ENVIRONMENT``) this checkout still has; the fix names the image to build and push."""
    repository, _, tag = image.rpartition(":")
    names = subprocess.run(
        ["bash", "containers/build.sh", "names"],
        cwd=REPO_DIR,
        capture_output=True,
        text=True,
        env={**os.environ, "IMAGE": repository},
        timeout=30,
    ).stdout
    pushed = [line.split()[1] for line in names.splitlines() if line.startswith("push ") and line.endswith("-gpu")]
    fix = f"containers/build.sh gpu && IMAGE={repository or 'REGISTRY/NAME'} containers/build.sh push"
    fix += f", then set container-image to {pushed[0]}" if pushed else ""
    match = IMAGE_TAG.match(tag)
    if match is None:
        return Check("image reference", "fail", f"{image!r} carries no commit (build.sh tags VERSION-COMMIT-gpu)", fix)
    commit = match["commit"]
    diff = subprocess.run(
        ["git", "diff", "--quiet", commit, "--", *IMAGE_ENVIRONMENT], cwd=REPO_DIR, capture_output=True, timeout=30
    )
    if diff.returncode == 0:
        detail = f"{image}: built from {commit}, whose {' and '.join(IMAGE_ENVIRONMENT)} this checkout has"
        return Check("image reference", "pass", detail)
    if diff.returncode == 1:
        detail = f"{image}: {' or '.join(IMAGE_ENVIRONMENT)} changed since {commit}, which it was built from"
        return Check("image reference", "fail", detail, fix)
    return Check("image reference", "fail", f"{image}: {commit} is not a commit of this repository", fix)


EXAMPLE_BUCKET = "my-grail-bucket"  # profiles/kubernetes's default-storage-prefix, until a site sets its own
S3_CHECKS = ("S3 keys", "S3 endpoint", "S3 bucket", "S3 write")


def s3_setting(profile: dict[str, Any], name: str) -> str | None:
    """A setting of the S3 storage plugin as Snakemake reads it: the profile's ``storage-s3-NAME``, else the
    environment's ``SNAKEMAKE_STORAGE_S3_NAME`` (the variables the plugin hands to every pod as a secret)."""
    value = profile.get(f"storage-s3-{name}") or os.environ.get(
        f"SNAKEMAKE_STORAGE_S3_{name.upper().replace('-', '_')}"
    )
    return str(value) if value else None


def s3_checks(profile: dict[str, Any]) -> list[Check]:
    """What the S3 storage must allow before any job runs, one line each, in order: the keys are set, the endpoint
    answers, the bucket lists, an object under the prefix can be written and deleted. A failure shows the checks after
    it as skipped; botocore's exceptions become the line's detail, never a traceback."""
    if profile.get("default-storage-provider") != "s3":
        return [Check("S3", "skipped", f"default-storage-provider is {profile.get('default-storage-provider')!r}")]
    prefix = str(profile.get("default-storage-prefix", ""))
    bucket, _, folder = prefix.removeprefix("s3://").partition("/")
    if not prefix.startswith("s3://") or not bucket or EXAMPLE_BUCKET in prefix:
        return [Check(name, "skipped", "no bucket of yours in default-storage-prefix") for name in S3_CHECKS]
    access_key, secret_key = s3_setting(profile, "access-key"), s3_setting(profile, "secret-key")
    if not (access_key and secret_key):
        unset = [
            f"SNAKEMAKE_STORAGE_S3_{name}"
            for name, value in (("ACCESS_KEY", access_key), ("SECRET_KEY", secret_key))
            if not value
        ]
        detail = f"{' and '.join(unset)} unset, and not in the profile (the pods get the keys from them)"
        return with_skipped([Check("S3 keys", "fail", detail, f"export {'=... '.join(unset)}=...")])
    import boto3
    import botocore.config
    import botocore.exceptions

    endpoint = s3_setting(profile, "endpoint-url")
    where = endpoint or "AWS S3"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=s3_setting(profile, "region") or "us-east-1",  # the plugin's default region
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        aws_session_token=s3_setting(profile, "token"),
        config=botocore.config.Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 1}),
    )
    checks = [Check("S3 keys", "pass", "access and secret key set")]
    try:
        client.list_objects_v2(Bucket=bucket, MaxKeys=1)
    except botocore.exceptions.ClientError as error:  # the endpoint answered, and refused
        code, message = error.response["Error"].get("Code", ""), error.response["Error"].get("Message", "")
        checks.append(Check("S3 endpoint", "pass", f"{where} answers"))
        if code == "NoSuchBucket":
            fix = "create it, or set default-storage-prefix to a bucket of yours"
            checks.append(Check("S3 bucket", "fail", f"{where} has no bucket {bucket!r}", fix))
        else:
            fix = "check the keys, and that they may list the bucket (s3:ListBucket)"
            checks.append(Check("S3 bucket", "fail", f"listing {bucket!r} was refused: {code}: {message}", fix))
    except (botocore.exceptions.BotoCoreError, ValueError) as error:  # no connection; a malformed endpoint URL
        fix = "set storage-s3-endpoint-url (SITE SETTINGS) to your S3 service, reachable from here and from the pods"
        checks.append(Check("S3 endpoint", "fail", f"{where} did not answer: {error}", fix))
    else:
        checks += [Check("S3 endpoint", "pass", f"{where} answers"), Check("S3 bucket", "pass", f"{bucket!r} lists")]
        probe = posixpath.join(folder, f".preflight-{uuid.uuid4().hex}")
        try:
            client.put_object(Bucket=bucket, Key=probe, Body=b"preflight")
            client.delete_object(Bucket=bucket, Key=probe)
            checks.append(Check("S3 write", "pass", f"wrote and deleted an object under {prefix}"))
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as error:
            fix = "give these keys s3:PutObject and s3:DeleteObject under the prefix"
            checks.append(Check("S3 write", "fail", f"writing s3://{bucket}/{probe} failed: {error}", fix))
    return with_skipped(checks)


def with_skipped(checks: list[Check]) -> list[Check]:
    """``checks`` followed by the S3 checks that did not run after the failed one, as skipped naming it."""
    done = {check.name for check in checks}
    reason = f"{checks[-1].name} failed"
    return checks + [Check(name, "skipped", reason) for name in S3_CHECKS if name not in done]


def kubernetes_api_checks(jobs: list[cost.PlannedJob], profile: dict[str, Any]) -> list[Check]:
    """Through the current kubectl context: the namespace exists and some node offers the GPUs a job asks for."""
    checks = []
    try:
        import kubernetes

        client = kubernetes.config.new_client_from_config()
        core = kubernetes.client.CoreV1Api(client)
        namespace = str(profile.get("grail-kubernetes-namespace", "default"))
        core.read_namespace(namespace, _request_timeout=10)
        checks.append(Check("namespace", "pass", namespace))
        needed = max((job.gpus for job in jobs), default=0)
        most = max(
            (int((node.status.allocatable or {}).get("nvidia.com/gpu", 0)) for node in core.list_node().items),
            default=0,
        )
        checks.append(
            Check("gpu resource", "pass", f"a node offers {most} nvidia.com/gpu (jobs ask up to {needed})")
            if most >= needed
            else Check(
                "gpu resource",
                "fail",
                f"jobs ask up to {needed} nvidia.com/gpu; the most a node offers is {most}",
                "use a cluster with the NVIDIA device plugin and enough GPUs per node",
            )
        )
    except Exception as error:  # no kubeconfig, no server, or an API the server does not serve
        checks.append(Check("namespace and gpu resource", "skipped", f"the API did not answer: {str(error)[:200]}", ""))
    return checks
