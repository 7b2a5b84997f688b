"""The GRAIL study as one DAG: benchmarks, data and model source -> warm-up -> training -> evaluation -> tables, tests, report.

    snakemake --cores 2                                   # the tiny CPU study (configs/default.yaml)
    snakemake --configfile configs/paper.yaml -n          # plan the paper's study
    snakemake --profile profiles/slurm                    # run it on Slurm

Every rule is one `python -m pipeline.<stage>` command that also works on its own (ARCHITECTURE.md). Structured
arguments travel as canonical JSON in params, shell-quoted; each rule's params hold exactly the config it uses
plus a digest of its stage's code, so an output is rebuilt only when its inputs, its settings or its code change.
"""

import os
import re
import shlex
import signal
import sys
import threading
import uuid
from pathlib import Path

from snakemake.utils import min_version
from snakemake_interface_executor_plugins.settings import DeploymentMethod, ExecMode

min_version("9.0")

sys.path.insert(0, workflow.basedir)

# Slurm's time-limit warning (`--signal=USR1@600`, configs/paper.yaml) reaches every process of a job step: under
# profiles/slurm that includes this Snakemake (the jobstep executor runs it with srun) and the rule's shell. Only the
# training stage acts on it (checkpoint, exit 75, the retry resumes); the layers above must survive it. The shell
# inherits the ignored disposition; the launcher and the training stage install their own handlers.
if threading.current_thread() is threading.main_thread():  # (a Snakefile parsed in a thread cannot set handlers)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)

from pipeline.core import exit_codes, gpu_determinism, kernels, layout
from pipeline.core.io import InputError, canonical_json
from pipeline.core.provenance import library_versions
from pipeline.core.rerun_key import with_rerun_key
from pipeline.core.source_digest import source_digest
from pipeline.models.hub_cache import job_hf_home
from pipeline.runtime import cluster
from pipeline.runtime.host_windows import shim_environment
from pipeline.study import calibration as calibrated
from pipeline.study.calibration import BENCHMARKS_DIR, CALIBRATION_FILE
from pipeline.study.integrity import missing_outputs, sealed_outputs, set_aside_damaged
from pipeline.study.load import load_study
from pipeline.study.writers import hold_study, refuse_busy_runs, release_study

# A --configfile on the command line (or a profile's) replaces the default study instead of extending it.
DEFAULT_CONFIG = os.path.join(workflow.basedir, "configs", "default.yaml")
if not workflow.overwrite_configfiles:

    configfile: DEFAULT_CONFIG


# A cluster job re-reads the config files: it must find what the controller planned (pipeline/runtime/cluster.py).
CONFIG_FILES = list(workflow.overwrite_configfiles) or [DEFAULT_CONFIG]
if workflow.exec_mode == ExecMode.DEFAULT:
    os.environ[cluster.PLANNED_CONFIG_VARIABLE] = cluster.config_file_digests(CONFIG_FILES)
    # this invocation's id: a retry of a job whose stage exited with a final status exits at once (pipeline.core.exit_codes)
    os.environ[exit_codes.INVOCATION_VARIABLE] = uuid.uuid4().hex
elif cluster.PLANNED_CONFIG_VARIABLE in os.environ:
    if changed := cluster.changed_config_files(os.environ[cluster.PLANNED_CONFIG_VARIABLE]):
        print(
            f"config file changed since the study was planned: {', '.join(changed)}; this job refuses to run"
            " with settings the controller did not record (restore the file, or restart the study)",
            file=sys.stderr,
        )
        sys.exit(2)


# The one study loader (pipeline.study.load): the config files and --config overrides, schema-checked (every bad
# key named at once), defaults filled, cross-key checks, and (once per plan: the controller's) the study's own input
# files, every problem named with file and line; refuses before any job.
STUDY = load_study(CONFIG_FILES, workflow.config_settings.config, check_inputs=workflow.exec_mode == ExecMode.DEFAULT)
config.update(STUDY.config)  # Snakemake's own view of the config, with the schema's defaults (as its validator left it)
# The run-time settings (watchdog, time windows, collective timeout: pipeline.runtime.settings) reach every job
# through its environment, never its command or params: a change reruns nothing. A cluster job's Snakemake re-reads
# the config and sets them again.
STUDY.runtime.export()
# The Hugging Face cache every job reads (the study's `hf_home`, else this process's HF_HOME), set for every job as
# an absolute HF_HOME: the cache the preflight checked, inside the image too (it sets none: pipeline.models.hub_cache).
job_hf_home(STUDY.hf_home)
# The CPU kernel path of every job (pipeline.core.kernels): the jobs inherit this process's environment, and a cluster
# job's Snakemake re-reads the config and sets it again. A param of the rules that compute, so a change reruns them.
kernels.configure(STUDY.kernel_pin)
KERNEL_PIN = "pinned" if STUDY.kernel_pin else "native"
# GPU determinism of training and evaluation (pipeline.core.gpu_determinism), by the same route. A param of those
# rules only when on: off (the default) adds nothing, so the studies made before the setting existed keep their
# params; turning it on reruns training (its fingerprint has it too) and evaluation.
gpu_determinism.configure(STUDY.gpu_determinism)
GPU_DETERMINISM = {"gpu_determinism": "on"} if STUDY.gpu_determinism else {}


# Before Snakemake plans (the controller; a dry run too, so that its plan is the repair): every output that does not
# match its writer's seal (cut, changed) is named and set aside with its seal (pipeline.study.integrity): Snakemake
# finds it missing and runs the job that writes it, with every job downstream. A cluster job's Snakemake runs one
# job, whose outputs it is about to write.
SET_ASIDE = set_aside_damaged(STUDY) if workflow.exec_mode == ExecMode.DEFAULT else []


IMAGE = cluster.resolve_image(STUDY.container_image, workflow.basedir)


container: IMAGE


# Under --sdm apptainer: a missing image file stops the plan naming its build command, and the apptainer that runs
# each job is the shim (pipeline.runtime.host_windows): it adds --nv, so jobs see the node's GPUs, and inside a Slurm
# job it requeues from the host at the end of a time window (the image has no Slurm client).
if DeploymentMethod.APPTAINER in workflow.deployment_settings.deployment_method:
    if error := cluster.missing_image_error(IMAGE):
        raise InputError(error)
    os.environ.update(shim_environment(os.environ))


R = STUDY.results_dir
# The study's calibration (python -m pipeline.calibrate), when there is one: training's time-limit warning
# (the launcher's SIGUSR1) comes as long before the limit as its measured step and checkpoint save need.
CALIBRATION = calibrated.load_calibration(Path(R) / CALIBRATION_FILE)
E = STUDY.eval_data_dir
# The stage modules must be importable in every job, installed or not.
# (shell.prefix is formatted like a command: "{{" is a literal brace)
# (Snakemake itself exports OMP_NUM_THREADS and its BLAS cousins = the job's threads.)
shell.prefix(f"export PYTHONPATH={shlex.quote(workflow.basedir)}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; ")

# The results layout (names and templates) is pipeline/core/layout.py's, shared with the stages.
BENCHMARK_FILE = f"{E}/{{benchmark}}.jsonl"
AUDIT = f"{R}/{layout.AUDIT}"
TRAIN_DATA = f"{R}/{layout.TRAIN_DATA}"
DATA_CARD = f"{R}/{layout.DATA_CARD}"
SOURCE_MODEL = f"{R}/{layout.SOURCE_MODEL}"
START_MODEL = f"{R}/{layout.START_MODEL}"
RUN_DIR = f"{R}/{layout.RUN_DIR}"
RUN_METRICS = f"{RUN_DIR}/{layout.METRICS_FILE}"
RUN_PROVENANCE = f"{RUN_DIR}/{layout.PROVENANCE_FILE}"
SAMPLES = f"{R}/{layout.SAMPLES}"
SAMPLES_PROVENANCE = f"{R}/{layout.SAMPLES_PROVENANCE}"
CODE_CHANGES = f"{R}/{layout.CODE_CHANGES}"
# library_changes: rerun makes the versions a param of training and evaluation (pipeline.core.provenance)
LIBRARIES = canonical_json(library_versions()) if STUDY.library_changes == "rerun" else ""
# ... and part of a training run's fingerprint (what its checkpoints may be resumed by: pipeline.training.run_state). A change
# of either flag reruns the train jobs, which find checkpoints of their own fingerprint (it leaves both flags out) at
# max_steps and only republish them.
TRAIN_STATE_ARGS = ["--stale-checkpoints", STUDY.stale_checkpoints] + (
    ["--fingerprint-libraries"] if STUDY.library_changes == "rerun" else []
)
TABLES = [f"{R}/{layout.TABLES_DIR}/{name}" for name in layout.TABLE_FILES]
FIGURES = [
    f"{R}/{layout.FIGURES_DIR}/{name}"
    for name in (layout.SCORES_FIGURE, layout.TRAINING_CURVES_FIGURE, layout.TRAINING_DIAGNOSTICS_FIGURE)
]
SIGNIFICANCE = f"{R}/{layout.SIGNIFICANCE}"
SIGNIFICANCE_MD = f"{R}/{layout.SIGNIFICANCE_MD}"
TOKEN_ANALYSIS = f"{R}/{layout.TOKEN_ANALYSIS}"
REPORT = f"{R}/{layout.REPORT}"
TOKEN_VIEWER = f"{R}/token_weights.html"
CREDIT_PLACEMENT = f"{R}/{layout.CREDIT_PLACEMENT}"
TRACKING_DIR = f"{R}/tracking"


def _names(names):
    return "|".join(re.escape(name) for name in names)


wildcard_constraints:
    model=_names(STUDY.models),
    method=_names([*STUDY.methods, layout.BASELINE_METHOD]),
    seed=r"\d+",
    checkpoint=rf"{layout.FINAL_CHECKPOINT}|{layout.START_CHECKPOINT}|{layout.EXPORT_PREFIX}\d+",
    benchmark=_names(STUDY.benchmarks),


def threads_of(stage, per_model=False):
    """A rule's threads: `cpus` of its resources (per model for the per-model rules)."""
    if per_model:
        return lambda wildcards: STUDY.resources(stage, wildcards.model).cpus
    return STUDY.resources(stage).cpus


def resources_of(stage, per_model=False):
    """A rule's Snakemake resources (mem_mb, runtime, gpu, nodes, gpu_model, slurm_extra) from the config, and its
    local disk (disk_mb: Study.disk_mb; the Kubernetes pod's ephemeral-storage).

    `runtime` grows with the attempt (a retried job asks for attempt x the time limit), except a resuming rule's
    (training: cluster.attempt_runtime), whose retry resumes and never asks past a site's wall; a name set for only
    some models (gpu_model) is empty, i.e. unset, for the others. A site's `--set-resources RULE:slurm_extra=...`
    replaces the study's flags (Snakemake's own order, profiles/slurm SITE SETTINGS); training's time-limit warning
    is no flag but the launcher's (`time_limit_warning_s`), so no site flag can drop it.
    """
    models = list(STUDY.models) if per_model else [None]
    names = {name for model in models for name in STUDY.resources(stage, model).snakemake_resources()}

    def request_of(wildcards):
        if per_model:
            return STUDY.resources(stage, wildcards.model, wildcards)  # evaluate: GPUs per job (its layout)
        return STUDY.resources(stage)

    def value(name):
        def resolve(wildcards, attempt):
            if name == "runtime":
                return cluster.attempt_runtime(stage, request_of(wildcards).runtime, attempt)
            return request_of(wildcards).snakemake_resources().get(name, 0 if name == "gpu" else "")

        return resolve

    def disk_mb(wildcards, input):
        return STUDY.disk_mb(stage, wildcards.model if per_model else None, input.size_mb)

    return {name: value(name) for name in sorted(names)} | {"disk_mb": disk_mb}


def time_limit_warning(wildcards):
    """Training's warning lead (a resource, so a new calibration reruns nothing): the calibrated lead where the run
    was measured, else the study's time_limit_warning_s (pipeline.study.calibration.training_warning_lead)."""
    run = {"model": wildcards.model, "method": wildcards.method}
    return calibrated.training_warning_lead(STUDY, CALIBRATION, run)


def built_start_model(model):
    """The starting point built in this DAG: the warmed-up model, else the prepared source; None for a `path`."""
    spec = STUDY.models[model]
    if spec.warmup is not None:
        return START_MODEL.format(model=model)
    if spec.source is not None:
        return SOURCE_MODEL.format(model=model)
    return None


def model_dir(model, method, seed, label):
    """The model an evaluation or analysis loads: the run's final or exported model, or the starting point."""
    if label == layout.START_CHECKPOINT:
        if method != layout.BASELINE_METHOD:
            raise ValueError(f"checkpoint '{label}' belongs to method '{layout.BASELINE_METHOD}', not '{method}'")
        return built_start_model(model) or START_MODEL.format(model=model)
    return layout.run_model_dir(RUN_DIR.format(model=model, method=method, seed=seed), label)


def model_argument(model):
    """`--model HUB_ID_OR_PATH [--model-revision REV]` for a starting point that is not built here."""
    spec = STUDY.models[model]
    argument = ["--model", spec.path]
    if spec.revision:
        argument += ["--model-revision", spec.revision]
    return shlex.join(argument)


# What the report reads, each a published output of the study
REPORTED = {
    "tables": TABLES,
    "figures": FIGURES,
    "significance": SIGNIFICANCE,
    "data_card": DATA_CARD,
    "audits": expand(AUDIT, benchmark=STUDY.benchmarks),
    "token_analysis": [f"{TOKEN_ANALYSIS}/summary.json".format(**run) for run in STUDY.grail_runs()],
    "token_viewer": [TOKEN_VIEWER] if STUDY.token_viewer.enabled else [],
    "credit_placement": [f"{CREDIT_PLACEMENT}/placement.json".format(model=m) for m in STUDY.placement_models()],
    "provenance": [RUN_PROVENANCE.format(**run) for run in STUDY.runs()]
    + [SAMPLES_PROVENANCE.format(**job) for job in STUDY.evaluations()],
    # the training health check, again under the study's thresholds (pipeline.runtime.health)
    "train_metrics": [RUN_METRICS.format(**run) for run in STUDY.runs()],
}


def published_outputs(wildcards):
    """Every output a finished study holds: the sealed ones (data, models, samples: pipeline.study.integrity), what
    the report reads, and the figures and pages beside them. Snakemake does not make again an output that is missing
    while what was made from it is up to date (a deleted model under its samples: "Nothing to be done"), so rule
    `all` asks for each of them: the job that writes a lost one runs, with every job after it. The controller names
    each one a finished study (its report written) lost."""
    figures = [f"{TOKEN_ANALYSIS}/GRAIL_positional.png".format(**run) for run in STUDY.grail_runs()]
    figures += [f"{CREDIT_PLACEMENT}/placement.png".format(model=m) for m in STUDY.placement_models()]
    reported = [path for paths in REPORTED.values() for path in ([paths] if isinstance(paths, str) else paths)]
    outputs = list(dict.fromkeys([*sealed_outputs(STUDY), *reported, SIGNIFICANCE_MD, *figures]))
    if workflow.exec_mode == ExecMode.DEFAULT and os.path.isfile(REPORT):
        for lost in missing_outputs(output for output in outputs if output not in SET_ASIDE):
            print(f"{lost}: missing from the finished study: made again, with everything made from it", file=sys.stderr)
    return outputs


localrules:
    all,


rule all:
    input:
        REPORT,
        # every output a finished study holds, so that one it lost is made again (below)
        published=published_outputs,


rule prepare_benchmarks:
    input:
        # a recorded subset (e.g. upstream's ids in eval_data/subsets/) is an input: editing it reruns the job
        subset=lambda wildcards: [
            path
            for path in [STUDY.benchmarks[wildcards.benchmark].get("subset_ids_file")]
            if path and Path(path).is_file()
        ],
    output:
        benchmark=BENCHMARK_FILE,
        audit=AUDIT,
    log:
        f"{R}/logs/prepare_benchmarks/{{benchmark}}.log",
    benchmark:
        f"{R}/benchmarks/prepare_benchmarks/{{benchmark}}.tsv"
    threads: threads_of("prepare_benchmarks")
    resources:
        **resources_of("prepare_benchmarks"),
    params:
        spec=lambda wildcards: canonical_json(STUDY.benchmarks[wildcards.benchmark]),
        code=source_digest("pipeline.prepare_benchmarks"),
    shell:
        "python -m pipeline.prepare_benchmarks --name {wildcards.benchmark:q} --spec {params.spec:q}"
        " --out {output.benchmark:q} --audit {output.audit:q} > {log:q} 2>&1"


rule prepare_data:
    input:
        decontaminate_against=expand(BENCHMARK_FILE, benchmark=STUDY.benchmarks) if STUDY.decontaminates() else [],
    output:
        data=TRAIN_DATA,
        card=DATA_CARD,
    log:
        f"{R}/logs/prepare_data.log",
    benchmark:
        f"{R}/benchmarks/prepare_data.tsv"
    threads: threads_of("prepare_data")
    resources:
        **resources_of("prepare_data"),
    params:
        spec=canonical_json(STUDY.data),
        code=source_digest("pipeline.prepare_data"),
    shell:
        "python -m pipeline.prepare_data --spec {params.spec:q} --out {output.data:q} --card {output.card:q}"
        " --decontaminate-against {input.decontaminate_against:q} > {log:q} 2>&1"


rule prepare_model:
    output:
        model=directory(SOURCE_MODEL),
    log:
        f"{R}/logs/prepare_model/{{model}}.log",
    benchmark:
        f"{R}/benchmarks/prepare_model/{{model}}.tsv"
    threads: threads_of("prepare_model", per_model=True)
    resources:
        **resources_of("prepare_model", per_model=True),
    params:
        spec=lambda wildcards: canonical_json(STUDY.models[wildcards.model].source),
        code=source_digest("pipeline.prepare_model"),
    shell:
        "python -m pipeline.prepare_model --spec {params.spec:q} --out {output.model:q} > {log:q} 2>&1"


def warmup_inputs(wildcards):
    inputs = {"data": TRAIN_DATA}
    if STUDY.models[wildcards.model].source is not None:
        inputs["source"] = SOURCE_MODEL.format(model=wildcards.model)
    return inputs


def warmup_model_argument(wildcards, input):
    """`--model SOURCE_DIR` when the warm-up starts from a prepared source (the tiny model is built otherwise)."""
    return shlex.join(["--model", input.source]) if "source" in input.keys() else ""


rule warmup:
    input:
        unpack(warmup_inputs),
    output:
        model=directory(START_MODEL),
    log:
        f"{R}/logs/warmup/{{model}}.log",
    benchmark:
        f"{R}/benchmarks/warmup/{{model}}.tsv"
    threads: threads_of("warmup", per_model=True)
    resources:
        **resources_of("warmup", per_model=True),
    params:
        spec=lambda wildcards: canonical_json(STUDY.models[wildcards.model].warmup_spec),
        seed=lambda wildcards: STUDY.models[wildcards.model].warmup_seed,
        model=warmup_model_argument,
        kernels=KERNEL_PIN,
        code=source_digest("pipeline.warmup"),
    shell:
        "python -m pipeline.warmup {params.model} --spec {params.spec:q} --data {input.data:q} --seed {params.seed}"
        " --out {output.model:q} > {log:q} 2>&1"


def train_inputs(wildcards):
    inputs = {"data": TRAIN_DATA}
    if built_start_model(wildcards.model):
        inputs["start"] = built_start_model(wildcards.model)
    return inputs


def train_model_argument(wildcards, input):
    if "start" in input.keys():
        return shlex.join(["--model", input.start])
    return model_argument(wildcards.model)


rule train:
    input:
        unpack(train_inputs),
    output:
        *[directory(layout.run_model_dir(RUN_DIR, layout.export_label(step))) for step in STUDY.export_steps()],
        final=directory(layout.run_model_dir(RUN_DIR, layout.FINAL_CHECKPOINT)),
        provenance=RUN_PROVENANCE,
        metrics=RUN_METRICS,
    log:
        f"{R}/logs/train/{{model}}/{{method}}/seed{{seed}}.log",
    benchmark:
        f"{R}/benchmarks/train/{{model}}/{{method}}/seed{{seed}}.tsv"
    threads: threads_of("train", per_model=True)
    resources:
        **resources_of("train", per_model=True),
        time_limit_warning_s=time_limit_warning,
    params:
        **GPU_DETERMINISM,
        model=train_model_argument,
        training_spec=lambda wildcards: canonical_json(STUDY.training_spec(wildcards.model)),
        method_spec=lambda wildcards: canonical_json(STUDY.methods[wildcards.method].spec),
        export_steps=" ".join(str(step) for step in STUDY.export_steps()),
        gpus=lambda wildcards: STUDY.resources("train", wildcards.model).gpus,
        nodes=lambda wildcards: STUDY.resources("train", wildcards.model).nodes,
        engine=STUDY.training_engine,
        # from the output, so that a storage provider's local path is used
        run_dir=lambda wildcards, output: os.path.dirname(output.metrics),
        tracking=canonical_json(STUDY.tracking.__dict__),
        run_name=lambda wildcards: STUDY.run_name(wildcards),
        tracking_dir=TRACKING_DIR,
        state_flags=shlex.join(TRAIN_STATE_ARGS),
        libraries=LIBRARIES,
        kernels=KERNEL_PIN,
        # the job runs both, and the method's module (loaded by name, so no import leads to it)
        code=lambda wildcards: source_digest(
            "pipeline.train", "pipeline.launch", STUDY.methods[wildcards.method].credit_module
        ),
    shell:
        "python -m pipeline.launch --gpus {params.gpus:q} --nodes {params.nodes:q} --engine {params.engine:q}"
        " --time-limit-warning {resources.time_limit_warning_s} --"
        " pipeline.train {params.model} --training-spec {params.training_spec:q}"
        " --method-spec {params.method_spec:q} --data {input.data:q} --seed {wildcards.seed}"
        " --out {params.run_dir:q} --export-steps {params.export_steps} --tracking {params.tracking:q}"
        " --run-name {params.run_name:q} --tracking-dir {params.tracking_dir:q} {params.state_flags}"
        " > {log:q} 2>&1"


# Before the first job (never in a dry run), the controller takes the study lock (RESULTS_DIR/.study.lock, held until
# it ends: Snakemake's own lock goes when any controller of this directory ends) and refuses to start while another
# writer trains a run of the study: Snakemake would delete that writer's log and published outputs if it trained the
# run again, and a run being trained has no complete outputs, so it would (pipeline.study.writers, docs/usage.md).
onstart:
    if workflow.exec_mode == ExecMode.DEFAULT:
        hold_study(R)
        refuse_busy_runs(RUN_DIR.format(**run) for run in STUDY.runs())


onsuccess:
    release_study()


onerror:
    release_study()


def evaluated_benchmarks(benchmarks):
    """The benchmarks a job of an evaluate rule samples (`STUDY.evaluate_rules`): the rule's, or its wildcard's."""
    return lambda wildcards: [wildcards.benchmark] if benchmarks is None else list(benchmarks)


def evaluate_inputs(benchmarks_of):
    def inputs(wildcards):
        inputs = {}
        for benchmark in benchmarks_of(wildcards):
            inputs[f"benchmark_{benchmark}"] = BENCHMARK_FILE.format(benchmark=benchmark)
            # the gold audit: evaluate's log warns about golds the clean grader refuses and upstream accepts
            inputs[f"audit_{benchmark}"] = AUDIT.format(benchmark=benchmark)
        if wildcards.checkpoint != layout.START_CHECKPOINT or built_start_model(wildcards.model):
            inputs["model"] = model_dir(wildcards.model, wildcards.method, wildcards.seed, wildcards.checkpoint)
        return inputs

    return inputs


def evaluate_arguments(benchmarks_of):
    """`--model ... --benchmark B --audit A --out SAMPLES` for every benchmark of the job, shell-quoted."""

    def arguments(wildcards, input):
        model = ["--model", input.model] if "model" in input.keys() else shlex.split(model_argument(wildcards.model))
        for benchmark in benchmarks_of(wildcards):
            samples = SAMPLES.format(**{**wildcards, "benchmark": benchmark})
            model += ["--benchmark", input[f"benchmark_{benchmark}"], "--audit", input[f"audit_{benchmark}"]]
            model += ["--out", samples]
        return shlex.join(model)

    return arguments


# One job per (run, checkpoint) on all its benchmarks, or one per benchmark (evaluation.job_per, docs/cluster.md).
for EVALUATE in STUDY.evaluate_rules():
    JOB = "{checkpoint}/{benchmark}" if EVALUATE.benchmarks is None else "{checkpoint}"  # the log's, the benchmark's
    EVALUATED = evaluated_benchmarks(EVALUATE.benchmarks)
    OUTPUT_BENCHMARKS = ["{benchmark}"] if EVALUATE.benchmarks is None else EVALUATE.benchmarks

    rule:
        name:
            EVALUATE.name  # evaluate, evaluate_analysed
        input:
            unpack(evaluate_inputs(EVALUATED)),
        output:
            samples=expand(SAMPLES, benchmark=OUTPUT_BENCHMARKS, allow_missing=True),
            provenance=expand(SAMPLES_PROVENANCE, benchmark=OUTPUT_BENCHMARKS, allow_missing=True),
        log:
            f"{R}/logs/evaluate/{{model}}/{{method}}/seed{{seed}}/{JOB}.log",
        benchmark:
            f"{R}/benchmarks/evaluate/{{model}}/{{method}}/seed{{seed}}/{JOB}.tsv"
        wildcard_constraints:
            checkpoint=_names(EVALUATE.checkpoints) if EVALUATE.checkpoints else ".+",
        threads: threads_of("evaluate", per_model=True)
        resources:
            **resources_of("evaluate", per_model=True),
        params:
            # the params that rerun the job, declared once: Snakemake's, and the key of the samples a rerun gives
            # back without generating them (pipeline.core.rerun_key)
            **with_rerun_key(
                {
                    "spec": lambda wildcards: canonical_json(STUDY.evaluation_spec(wildcards)),
                    "libraries": LIBRARIES,
                    "kernels": KERNEL_PIN,
                    **GPU_DETERMINISM,
                    "code": source_digest("pipeline.evaluate"),
                }
            ),
            arguments=evaluate_arguments(EVALUATED),
        shell:
            "python -m pipeline.evaluate {params.arguments} --spec {params.spec:q} --seed {wildcards.seed}"
            " --rerun-key {params.rerun_key:q} > {log:q} 2>&1"


rule aggregate:
    input:
        samples=[SAMPLES.format(**job) for job in STUDY.evaluations()],
        # a samples file must cover its benchmark's items
        benchmarks=expand(BENCHMARK_FILE, benchmark=STUDY.benchmarks),
        metrics=[RUN_METRICS.format(**run) for run in STUDY.runs()],
    output:
        tables=[report(path, category="Tables") if path.endswith(".csv") else path for path in TABLES],
        figures=[report(path, category="Figures") for path in FIGURES],
    log:
        f"{R}/logs/aggregate.log",
    benchmark:
        f"{R}/benchmarks/aggregate.tsv"
    threads: threads_of("aggregate")
    resources:
        **resources_of("aggregate"),
    params:
        tables_dir=lambda wildcards, output: os.path.dirname(output.tables[0]),
        figures_dir=lambda wildcards, output: os.path.dirname(output.figures[0]),
        credits=shlex.join(STUDY.credits()),
        samples_per_item=STUDY.evaluation.spec["n_samples"],
        # the credit methods' modules declare the headline statistics the training curves lead with
        code=source_digest("pipeline.aggregate", *STUDY.credit_modules()),
    shell:
        "python -m pipeline.aggregate --samples {input.samples:q} --train-metrics {input.metrics:q}"
        " --benchmarks {input.benchmarks:q} --samples-per-item {params.samples_per_item:q}"
        " --out-dir {params.tables_dir:q} --figures-dir {params.figures_dir:q} --credit-methods {params.credits}"
        " > {log:q} 2>&1"


def significance_samples(wildcards):
    """The per-sample files of the compared checkpoint and of the baseline (the item-level tests' items)."""
    wanted = {STUDY.significance_checkpoint(), layout.START_CHECKPOINT}
    return [SAMPLES.format(**job) for job in STUDY.evaluations() if job["checkpoint"] in wanted]


rule significance:
    input:
        scores=TABLES[0],
        samples=significance_samples,
    output:
        json=SIGNIFICANCE,
        markdown=SIGNIFICANCE_MD,
    log:
        f"{R}/logs/significance.log",
    benchmark:
        f"{R}/benchmarks/significance.tsv"
    threads: threads_of("significance")
    resources:
        **resources_of("significance"),
    params:
        compared=STUDY.significance_checkpoint(),
        metrics=shlex.join(["--metrics", *STUDY.significance.metrics]) if STUDY.significance.metrics else "",
        resamples=STUDY.significance.resamples,
        confidence=STUDY.significance.confidence,
        seed=STUDY.significance.seed,
        code=source_digest("pipeline.significance"),
    shell:
        "python -m pipeline.significance --scores {input.scores:q} --samples {input.samples:q}"
        " --checkpoint {params.compared:q} {params.metrics} --resamples {params.resamples}"
        " --confidence {params.confidence} --seed {params.seed}"
        " --out {output.json:q} --markdown {output.markdown:q} > {log:q} 2>&1"


def token_analysis_inputs(wildcards):
    benchmark = STUDY.token_analysis.benchmark
    inputs = {"benchmark": BENCHMARK_FILE.format(benchmark=benchmark)}
    for label in STUDY.token_analysis.checkpoints:
        job = {**wildcards, "checkpoint": label, "benchmark": benchmark}
        inputs[f"model_{label}"] = model_dir(wildcards.model, wildcards.method, wildcards.seed, label)
        inputs[f"samples_{label}"] = SAMPLES.format(**job)
    return inputs


def token_analysis_checkpoints(wildcards, input):
    """`--checkpoint LABEL MODEL_DIR SAMPLES` for every analysed checkpoint, each token shell-quoted."""
    arguments = []
    for label in STUDY.token_analysis.checkpoints:
        arguments += ["--checkpoint", label, input[f"model_{label}"], input[f"samples_{label}"]]
    return shlex.join(arguments)


rule token_analysis:
    input:
        unpack(token_analysis_inputs),
    output:
        summary=f"{TOKEN_ANALYSIS}/summary.json",
        figure=report(
            f"{TOKEN_ANALYSIS}/GRAIL_positional.png",
            category="Token analysis",
            subcategory="{model} {method} seed{seed}",
        ),
    log:
        f"{R}/logs/token_analysis/{{model}}/{{method}}/seed{{seed}}.log",
    benchmark:
        f"{R}/benchmarks/token_analysis/{{model}}/{{method}}/seed{{seed}}.tsv"
    threads: threads_of("token_analysis", per_model=True)
    resources:
        **resources_of("token_analysis", per_model=True),
    params:
        checkpoints=token_analysis_checkpoints,
        # the GRAIL settings the section leaves unset are the analysed method's (Study.token_analysis_spec)
        spec=lambda wildcards: canonical_json(STUDY.token_analysis_spec(wildcards.method)),
        out_dir=lambda wildcards, output: os.path.dirname(output.summary),
        kernels=KERNEL_PIN,
        code=source_digest("pipeline.token_analysis"),
    shell:
        "python -m pipeline.token_analysis {params.checkpoints} --benchmark {input.benchmark:q}"
        " --spec {params.spec:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"


def token_viewer_inputs(wildcards):
    benchmark = STUDY.token_viewer.benchmark
    inputs = {"benchmark": BENCHMARK_FILE.format(benchmark=benchmark)}
    for job in STUDY.viewed_rollouts():
        label = f"{STUDY.run_name(job)}/{job['checkpoint']}"
        inputs[f"model {label}"] = model_dir(job["model"], job["method"], job["seed"], job["checkpoint"])
        inputs[f"samples {label}"] = SAMPLES.format(**job)
    return inputs


def viewer_rollout_arguments(wildcards, input):
    """`--rollouts LABEL MODEL_DIR SAMPLES` per shown (run, checkpoint), each token shell-quoted."""
    arguments = []
    for job in STUDY.viewed_rollouts():
        label = f"{STUDY.run_name(job)}/{job['checkpoint']}"
        arguments += ["--rollouts", label, input[f"model {label}"], input[f"samples {label}"]]
    return shlex.join(arguments)


rule token_viewer:
    input:
        unpack(token_viewer_inputs),
    output:
        page=report(TOKEN_VIEWER, category="Token weights"),
    log:
        f"{R}/logs/token_viewer.log",
    benchmark:
        f"{R}/benchmarks/token_viewer.tsv"
    threads: threads_of("token_viewer")
    resources:
        **resources_of("token_viewer"),
    params:
        rollouts=viewer_rollout_arguments,
        analysis_spec=canonical_json(STUDY.token_analysis.spec),
        methods=canonical_json(STUDY.credit_specs()),
        per_outcome=STUDY.token_viewer.rollouts,
        seed=STUDY.token_viewer.seed,
        kernels=KERNEL_PIN,
        code=source_digest("pipeline.token_viewer", *STUDY.credit_modules(scored=True)),
    shell:
        "python -m pipeline.token_viewer {params.rollouts} --benchmark {input.benchmark:q}"
        " --analysis-spec {params.analysis_spec:q} --methods {params.methods:q}"
        " --per-outcome {params.per_outcome} --seed {params.seed} --out {output.page:q} > {log:q} 2>&1"


def credit_placement_inputs(wildcards):
    jobs = STUDY.placement_inputs(wildcards.model)
    inputs = {"benchmark": BENCHMARK_FILE.format(benchmark=STUDY.credit_truth.benchmark)}
    for job in jobs["rollouts"]:
        inputs[f"model seed{job['seed']}"] = model_dir(job["model"], job["method"], job["seed"], job["checkpoint"])
    for job in jobs["runs"]:
        inputs[f"samples {job['method']} seed{job['seed']}"] = SAMPLES.format(**job)
    return inputs


def placement_arguments(wildcards, input):
    """`--rollouts SEED MODEL_DIR SAMPLES` per seed of the rollouts' method, `--runs METHOD SEED SAMPLES` per run."""
    jobs = STUDY.placement_inputs(wildcards.model)
    arguments = []
    for job in jobs["rollouts"]:
        seed = job["seed"]
        samples = input[f"samples {job['method']} seed{seed}"]
        arguments += ["--rollouts", str(seed), input[f"model seed{seed}"], samples]
    for job in jobs["runs"]:
        arguments += ["--runs", job["method"], str(job["seed"]), input[f"samples {job['method']} seed{job['seed']}"]]
    return shlex.join(arguments)


rule credit_placement:
    input:
        unpack(credit_placement_inputs),
    output:
        summary=f"{CREDIT_PLACEMENT}/placement.json",
        figure=report(f"{CREDIT_PLACEMENT}/placement.png", category="Credit placement", subcategory="{model}"),
    log:
        f"{R}/logs/credit_placement/{{model}}.log",
    benchmark:
        f"{R}/benchmarks/credit_placement/{{model}}.tsv"
    threads: threads_of("credit_placement", per_model=True)
    resources:
        **resources_of("credit_placement", per_model=True),
    params:
        arguments=placement_arguments,
        analysis_spec=canonical_json(STUDY.token_analysis.spec),
        methods=canonical_json(STUDY.credit_specs()),
        floor=STUDY.credit_truth.floor,
        ceiling=STUDY.credit_truth.ceiling,
        max_rollouts=STUDY.credit_truth.max_rollouts,
        batch_size=STUDY.credit_truth.batch_size,
        resamples=STUDY.significance.resamples,
        confidence=STUDY.significance.confidence,
        seed=STUDY.significance.seed,
        out_dir=lambda wildcards, output: os.path.dirname(output.summary),
        kernels=KERNEL_PIN,
        code=source_digest("pipeline.credit_placement", *STUDY.credit_modules(scored=True)),
    shell:
        "python -m pipeline.credit_placement {params.arguments} --benchmark {input.benchmark:q}"
        " --analysis-spec {params.analysis_spec:q} --methods {params.methods:q}"
        " --floor {params.floor:q} --ceiling {params.ceiling:q} --max-rollouts {params.max_rollouts}"
        " --batch-size {params.batch_size} --resamples {params.resamples} --confidence {params.confidence}"
        " --seed {params.seed} --out-dir {params.out_dir:q} > {log:q} 2>&1"


def viewer_page_argument(wildcards, input):
    """`--token-viewer PAGE` when the viewer is on, shell-quoted."""
    return shlex.join(["--token-viewer", *input.token_viewer]) if input.token_viewer else ""


def placement_summaries_argument(wildcards, input):
    """`--credit-placement SUMMARY...` when a placement is scored, shell-quoted."""
    return shlex.join(["--credit-placement", *input.credit_placement]) if input.credit_placement else ""


def code_changes_argument(wildcards, input):
    """`--code-changes FILE` once `python -m pipeline.why_rerun --accept` has recorded one, shell-quoted."""
    return shlex.join(["--code-changes", *input.code_changes]) if input.code_changes else ""


def calibration_argument(wildcards, input):
    """`--calibration FILE` once `python -m pipeline.calibrate` has written one, shell-quoted."""
    return shlex.join(["--calibration", *input.calibration]) if input.calibration else ""


rule report:
    input:
        **REPORTED,
        code_changes=[CODE_CHANGES] if os.path.isfile(CODE_CHANGES) else [],
        # the predicted cost (python -m pipeline.calibrate), beside the actual one (the benchmark files, below)
        calibration=[f"{R}/{CALIBRATION_FILE}"] if os.path.isfile(f"{R}/{CALIBRATION_FILE}") else [],
    output:
        report=REPORT,
    log:
        f"{R}/logs/report.log",
    benchmark:
        f"{R}/benchmarks/report.tsv"
    threads: threads_of("report")
    resources:
        **resources_of("report"),
    params:
        config=canonical_json(STUDY.config),
        tables_dir=lambda wildcards, input: os.path.dirname(input.tables[0]),
        figures_dir=lambda wildcards, input: os.path.dirname(input.figures[0]),
        token_analysis_dirs=lambda wildcards, input: [os.path.dirname(path) for path in input.token_analysis],
        token_viewer=viewer_page_argument,
        credit_placement=placement_summaries_argument,
        code_changes=code_changes_argument,
        # every job's wall time; not an input: Snakemake writes a job's benchmark file after its outputs
        benchmarks_dir=f"{R}/{BENCHMARKS_DIR}",
        calibration=calibration_argument,
        code=source_digest("pipeline.report"),
    shell:
        "python -m pipeline.report --config {params.config:q} --tables-dir {params.tables_dir:q}"
        " --figures-dir {params.figures_dir:q} --significance {input.significance:q}"
        " --data-card {input.data_card:q} --audit {input.audits:q}"
        " --token-analysis {params.token_analysis_dirs:q} {params.token_viewer} {params.credit_placement}"
        " --provenance {input.provenance:q} --train-metrics {input.train_metrics:q} {params.code_changes}"
        " --benchmarks-dir {params.benchmarks_dir:q} {params.calibration} --out {output.report:q} > {log:q} 2>&1"
