"""Snakemake's Kubernetes executor (snakemake-executor-plugin-kubernetes) with a memory-backed ``/dev/shm`` in every
pod: ``--executor grail-kubernetes``.

The upstream plugin (0.5.1) mounts only the job's working directory and the PersistentVolumeClaims, so a pod gets
the container runtime's default ``/dev/shm`` (often 64 MB), which NCCL between a pod's GPUs, vLLM and data-loader
workers outgrow. Its Jobs are built inside ``Executor.run_job`` with no hook for extra volumes, so this plugin keeps
all of it and adds, at submission, an ``emptyDir`` with ``medium: Memory`` and ``sizeLimit`` ``shm_size`` to the pod
and its mount at ``/dev/shm`` to the job's container. Every upstream setting keeps its name under this plugin's
prefix (``--grail-kubernetes-namespace``, ``--grail-kubernetes-persistent-volumes``, ...).

It is its own distribution because Snakemake finds executor plugins by their top-level module's name
(``snakemake_executor_plugin_*``), which an editable install of the project could not provide.
"""

# no `from __future__ import annotations`: Snakemake builds the CLI options from the settings' field types
from dataclasses import dataclass, field
from typing import Any

import kubernetes.client
import kubernetes.utils
from snakemake_executor_plugin_kubernetes import Executor as KubernetesExecutor
from snakemake_executor_plugin_kubernetes import ExecutorSettings as KubernetesExecutorSettings
from snakemake_executor_plugin_kubernetes import common_settings
from snakemake_interface_common.exceptions import WorkflowError

__all__ = ["Executor", "ExecutorSettings", "common_settings"]

SHM_VOLUME = "grail-dshm"  # the pod's volume name: one that no claim of the profile's takes
SHM_PATH = "/dev/shm"


@dataclass
class ExecutorSettings(KubernetesExecutorSettings):
    shm_size: str = field(
        default="16Gi",
        metadata={
            "help": "Size limit of the memory-backed /dev/shm mounted in every pod (a Kubernetes quantity such as "
            "16Gi). Its pages count against the pod's memory limit (the rule's mem_mb), which also caps it; "
            "16Gi covers NCCL between the GPUs of one pod, vLLM and data-loader workers."
        },
    )


def shm_volume(size: str) -> kubernetes.client.V1Volume:
    """The pod's ``/dev/shm``: a tmpfs (``emptyDir`` with ``medium: Memory``) of at most ``size``."""
    source = kubernetes.client.V1EmptyDirVolumeSource(medium="Memory", size_limit=size)
    return kubernetes.client.V1Volume(name=SHM_VOLUME, empty_dir=source)


class JobsWithShm:
    """A BatchV1Api whose ``create_namespaced_job`` first mounts the shm volume in the Job's pod; every other call
    goes to the wrapped API."""

    def __init__(self, api: kubernetes.client.BatchV1Api, size: str) -> None:
        self.api = api
        self.size = size

    def create_namespaced_job(self, namespace: str, body: kubernetes.client.V1Job, **kwargs: Any) -> Any:
        pod = body.spec.template.spec
        pod.volumes = [*(pod.volumes or []), shm_volume(self.size)]
        for container in pod.containers:
            mount = kubernetes.client.V1VolumeMount(name=SHM_VOLUME, mount_path=SHM_PATH)
            container.volume_mounts = [*(container.volume_mounts or []), mount]
        return self.api.create_namespaced_job(namespace, body, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)


class Executor(KubernetesExecutor):
    """The upstream executor, whose Jobs are submitted through ``JobsWithShm``."""

    def __post_init__(self) -> None:
        size = self.workflow.executor_settings.shm_size
        try:
            valid = kubernetes.utils.parse_quantity(size) > 0
        except ValueError:
            valid = False
        if not valid:  # checked before the upstream registers its secret with the cluster
            raise WorkflowError(
                f"--grail-kubernetes-shm-size {size!r} is not a positive Kubernetes quantity (e.g. 16Gi or 512Mi)"
            )
        super().__post_init__()

    # The upstream builds each Job inside run_job and submits it with self.batchapi.create_namespaced_job; it sets
    # self.batchapi in __post_init__ and again when it re-authenticates, so the wrapper goes on at every assignment.
    @property
    def batchapi(self) -> JobsWithShm:
        return self._batchapi

    @batchapi.setter
    def batchapi(self, api: kubernetes.client.BatchV1Api) -> None:
        self._batchapi = JobsWithShm(api, self.workflow.executor_settings.shm_size)
