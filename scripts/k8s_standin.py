"""A stand-in Kubernetes API server for testing snakemake-executor-plugin-kubernetes without a cluster.

No real API server (kube-apiserver, k3s, kind, KWOK) can run on the CI machine, so this server answers the
few REST calls the executor plugin makes, and nothing else:

- ``POST``/``DELETE /api/v1/namespaces/NS/secrets[/NAME]``: the run's environment secret, kept in memory;
- ``POST /apis/batch/v1/namespaces/NS/jobs``: validates the Job with ``kubernetes-validate`` (strict: unknown
  fields are errors) against the offline schema of ``--kubernetes-version``, answers 422 like the real server
  when it is invalid, records it as ``RECORD_DIR/NAME.json`` and runs its only container's ``command`` +
  ``args`` locally in a fresh directory (the ``/workdir`` emptyDir), with the container's ``env`` (secret
  references resolved);
- ``GET .../jobs/NAME[/status]``, ``DELETE .../jobs/NAME``; ``GET /api/v1/namespaces/NS/pods?labelSelector=
  job-name=NAME`` (one pod per job), ``GET .../pods/POD/log``, ``DELETE .../pods/POD``;
- ``POST .../pods/POD/eviction`` (what ``kubectl drain`` sends): the pod's processes are killed, as at the end of
  the grace period when the container's shell does not pass SIGTERM on, and the pod fails with reason ``Evicted``
  and exit code 137; like a Job of the executor plugin (``backoffLimit: 0``) its Job fails with it.

A ``persistentVolumeClaim`` volume is the host directory at its ``mountPath`` (the caller makes it): it outlives
the pods, as a claim does. What it does not do: scheduling, images (the command runs on the host's Python, not
inside the image), resource limits, GPUs, tolerations, other volumes, authentication, watches.

    python scripts/k8s_standin.py --record-dir DIR --work-root DIR --kubeconfig FILE [--port 0]

writes a kubeconfig that points at the server (for ``KUBECONFIG``) and serves until interrupted.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import kubernetes_validate
import yaml

SECRETS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/secrets(?:/(?P<name>[^/]+))?$")
JOBS = re.compile(r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs(?:/(?P<name>[^/]+)(?P<status>/status)?)?$")
PODS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods(?:/(?P<name>[^/]+)(?P<log>/log)?)?$")
EVICTION = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/eviction$")
POD_SUFFIX = "-pod"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class LocalJob:
    """A submitted Job and the local process that stands in for its single pod."""

    manifest: dict[str, Any]
    process: subprocess.Popen[bytes]
    log_path: Path
    started: str = field(default_factory=now)
    evicted: bool = False

    @property
    def name(self) -> str:
        return self.manifest["metadata"]["name"]

    def exit_code(self) -> int | None:
        """The container's exit code: a process ended by signal N reports 128 + N, as container runtimes do."""
        code = self.process.poll()
        return code if code is None or code >= 0 else 128 - code

    def evict(self) -> None:
        """End the pod's whole process tree at once (its session) and mark it evicted."""
        self.evicted = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def job_status(self) -> dict[str, Any]:
        """batch/v1 JobStatus: ``active`` while running, then ``succeeded`` or ``failed`` with a condition."""
        code = self.exit_code()
        if code is None:
            return {"active": 1, "startTime": self.started}
        outcome = "Complete" if code == 0 else "Failed"
        condition = {"type": outcome, "status": "True", "lastTransitionTime": now()}
        counts = {"succeeded": 1} if code == 0 else {"failed": 1}
        return {**counts, "startTime": self.started, "completionTime": now(), "conditions": [condition]}

    def pod(self) -> dict[str, Any]:
        """core/v1 Pod with the ``snakemake`` container's state (running, or terminated with its exit code)."""
        code = self.exit_code()
        container = self.manifest["spec"]["template"]["spec"]["containers"][0]
        state = (
            {"running": {"startedAt": self.started}}
            if code is None
            else {"terminated": {"exitCode": code, "startedAt": self.started, "finishedAt": now()}}
        )
        phase = "Running" if code is None else ("Succeeded" if code == 0 else "Failed")
        eviction = {"reason": "Evicted", "message": "Evicted through the eviction API"} if self.evicted else {}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name + POD_SUFFIX,
                "namespace": self.manifest["metadata"]["namespace"],
                "labels": {"job-name": self.name},
            },
            "status": {
                "phase": phase,
                **eviction,
                "containerStatuses": [
                    {
                        "name": container["name"],
                        "image": container.get("image", ""),
                        "imageID": "",
                        "ready": code is None,
                        "restartCount": 0,
                        "state": state,
                    }
                ],
            },
        }


class Cluster:
    """In-memory state of the stand-in: secrets, jobs and their processes."""

    def __init__(self, record_dir: Path, work_root: Path, kubernetes_version: str) -> None:
        self.record_dir = record_dir
        self.work_root = work_root
        self.kubernetes_version = kubernetes_version
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.jobs: dict[tuple[str, str], LocalJob] = {}
        self.lock = threading.Lock()
        record_dir.mkdir(parents=True, exist_ok=True)
        work_root.mkdir(parents=True, exist_ok=True)

    def validate(self, manifest: dict[str, Any]) -> str | None:
        """The strict schema error of ``manifest``, or None when it is a valid object."""
        try:
            kubernetes_validate.validate(manifest, self.kubernetes_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(part) for part in error.path)
            return f"{path}: {error.message}"
        return extended_resource_error(manifest)

    def container_environment(self, namespace: str, container: dict[str, Any]) -> dict[str, str]:
        """The host environment plus the container's ``env`` (``valueFrom.secretKeyRef`` resolved)."""
        env = dict(os.environ)
        for variable in container.get("env", []):
            reference = variable.get("valueFrom", {}).get("secretKeyRef")
            if reference is None:
                env[variable["name"]] = variable.get("value", "")
                continue
            secret = self.secrets[(namespace, reference["name"])]
            env[variable["name"]] = base64.b64decode(secret.get("data", {})[reference["key"]]).decode()
        return env

    def start(self, manifest: dict[str, Any]) -> LocalJob:
        """Record ``manifest`` and run its container command in a fresh working directory."""
        name = manifest["metadata"]["name"]
        namespace = manifest["metadata"]["namespace"]
        (self.record_dir / f"{name}.json").write_text(json.dumps(manifest, indent=2) + "\n")
        container = manifest["spec"]["template"]["spec"]["containers"][0]
        workdir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.work_root))
        log_path = workdir.with_suffix(".log")
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [*container.get("command", []), *container.get("args", [])],
                cwd=workdir,
                env=self.container_environment(namespace, container),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # the pod's processes: what an eviction ends
            )
        return LocalJob(manifest, process, log_path)


def extended_resource_error(manifest: dict[str, Any]) -> str | None:
    """The API server's rule that no schema expresses: extended resources (``vendor/name``, e.g.
    ``nvidia.com/gpu``) cannot be overcommitted, so each needs a limit, equal to its request if both are set."""
    for index, container in enumerate(manifest["spec"]["template"]["spec"]["containers"]):
        resources = container.get("resources", {})
        requests, limits = resources.get("requests", {}), resources.get("limits", {})
        for name in sorted(set(requests) | set(limits)):
            if "/" not in name or name.startswith("kubernetes.io/"):
                continue
            where = f"spec.template.spec.containers[{index}].resources"
            if name not in limits:
                return f"{where}.limits[{name}]: Required value: Limit must be set for non overcommitable resources"
            if name in requests and str(requests[name]) != str(limits[name]):
                return f"{where}.requests[{name}]: Invalid value: must be equal to {name} limit"
    return None


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


class Handler(BaseHTTPRequestHandler):
    """Routes the executor plugin's REST calls to the :class:`Cluster`."""

    cluster: Cluster

    def log_message(self, format: str, *args: Any) -> None:
        print(f"k8s-standin: {self.command} {self.path} -> {args[1] if len(args) > 1 else ''}", flush=True)

    def reply(self, code: int, body: dict[str, Any] | str) -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def not_found(self, what: str) -> None:
        self.reply(HTTPStatus.NOT_FOUND, status_body(404, "NotFound", f"{what} not found"))

    def read_body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length", 0))
        return json.loads(self.rfile.read(length) or b"{}")

    def do_POST(self) -> None:
        path = urlparse(self.path).path
        cluster = self.cluster
        if match := SECRETS.match(path):
            secret = {"apiVersion": "v1", "kind": "Secret", **self.read_body()}
            secret.setdefault("metadata", {})["namespace"] = match["ns"]
            with cluster.lock:
                cluster.secrets[(match["ns"], secret["metadata"]["name"])] = secret
            self.reply(HTTPStatus.CREATED, secret)
        elif (match := JOBS.match(path)) and match["name"] is None:
            # the real server fills apiVersion/kind from the URL; the plugin's client body omits them
            manifest = {"apiVersion": "batch/v1", "kind": "Job", **self.read_body()}
            manifest.setdefault("metadata", {})["namespace"] = match["ns"]
            error = cluster.validate(manifest)
            if error is not None:
                message = f"Job is invalid: {error}"
                print(f"k8s-standin: {message}", flush=True)
                self.reply(HTTPStatus.UNPROCESSABLE_ENTITY, status_body(422, "Invalid", message))
                return
            with cluster.lock:
                cluster.jobs[(match["ns"], manifest["metadata"]["name"])] = cluster.start(manifest)
            self.reply(HTTPStatus.CREATED, manifest)
        elif match := EVICTION.match(path):
            job = cluster.jobs.get((match["ns"], match["name"].removesuffix(POD_SUFFIX)))
            if job is None:
                self.not_found(f"pod {match['name']}")
                return
            job.evict()
            print(f"k8s-standin: evicted pod {match['name']}", flush=True)
            self.reply(HTTPStatus.CREATED, {"apiVersion": "v1", "kind": "Status", "status": "Success", "metadata": {}})
        else:
            self.not_found(path)

    def do_GET(self) -> None:
        url = urlparse(self.path)
        cluster = self.cluster
        if (match := JOBS.match(url.path)) and match["name"] is not None:
            job = cluster.jobs.get((match["ns"], match["name"]))
            if job is None:
                self.not_found(f"job {match['name']}")
                return
            self.reply(HTTPStatus.OK, {**job.manifest, "status": job.job_status()})
        elif (match := PODS.match(url.path)) and match["name"] is None:
            selector = parse_qs(url.query).get("labelSelector", [""])[0]
            wanted = selector.removeprefix("job-name=")
            pods = [job.pod() for (ns, name), job in cluster.jobs.items() if ns == match["ns"] and name == wanted]
            self.reply(HTTPStatus.OK, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": pods})
        elif (match := PODS.match(url.path)) and match["log"]:
            job = cluster.jobs.get((match["ns"], match["name"].removesuffix(POD_SUFFIX)))
            if job is None:
                self.not_found(f"pod {match['name']}")
                return
            self.reply(HTTPStatus.OK, job.log_path.read_text(errors="replace"))
        else:
            self.not_found(url.path)

    def do_DELETE(self) -> None:
        path = urlparse(self.path).path
        cluster = self.cluster
        deleted = {"apiVersion": "v1", "kind": "Status", "status": "Success", "metadata": {}}
        if (match := SECRETS.match(path)) and match["name"]:
            with cluster.lock:
                found = cluster.secrets.pop((match["ns"], match["name"]), None)
        elif (match := JOBS.match(path)) and match["name"]:
            with cluster.lock:
                found = cluster.jobs.pop((match["ns"], match["name"]), None)
            if found is not None and found.exit_code() is None:
                found.process.kill()
        elif (match := PODS.match(path)) and match["name"]:
            found = cluster.jobs.get((match["ns"], match["name"].removesuffix(POD_SUFFIX)))
        else:
            found = None
        if found is None:
            self.not_found(path)
            return
        self.reply(HTTPStatus.OK, deleted)


def kubeconfig(server: str) -> dict[str, Any]:
    """A kubeconfig with one cluster, user and context pointing at ``server``."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "standin", "cluster": {"server": server}}],
        "users": [{"name": "standin", "user": {"token": "standin"}}],
        "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin"}}],
        "current-context": "standin",
    }


def serve(record_dir: Path, work_root: Path, kubeconfig_path: Path, port: int, kubernetes_version: str) -> None:
    """Serve on 127.0.0.1:``port`` (0: any free port) after writing the kubeconfig."""
    Handler.cluster = Cluster(record_dir, work_root, kubernetes_version)
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    address = f"http://127.0.0.1:{server.server_address[1]}"
    # Whole or absent: a client that polls for the file must never read it half-written (seen: "kubeconfig file is empty").
    partial = kubeconfig_path.with_name(f".{kubeconfig_path.name}.partial")
    partial.write_text(yaml.safe_dump(kubeconfig(address)))
    os.replace(partial, kubeconfig_path)
    print(f"k8s-standin: serving {address} (schemas of Kubernetes {kubernetes_version})", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--record-dir", type=Path, required=True, help="where each submitted Job is recorded")
    parser.add_argument("--work-root", type=Path, required=True, help="parent of the jobs' working directories")
    parser.add_argument("--kubeconfig", type=Path, required=True, help="kubeconfig file to write")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--kubernetes-version", default=kubernetes_validate.latest_version())
    args = parser.parse_args()
    serve(args.record_dir, args.work_root, args.kubeconfig, args.port, args.kubernetes_version)


if __name__ == "__main__":
    main()
