"""The typed sections of a study config that ``Study`` (pipeline.study.config) is built from: the top-level
settings, a model, a method, the evaluation, the token analysis and viewer, the credit truth, the significance
tests, the calibration, and the resources of a rule.
Each is a frozen dataclass made once from a schema-checked config with its defaults filled.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

from pipeline.core.declared import REQUIRED, Range, refuse_out_of_range, setting
from pipeline.core.layout import FINAL_CHECKPOINT
from pipeline.runtime.launching import TrainingEngine
from pipeline.study.checks import is_credit_key
from pipeline.study.gpu_sizing import GpuSizing
from pipeline.training.run_state import StaleCheckpoints

LibraryChanges = Literal["warn", "rerun"]  # docs/reruns.md

# Orchestration keys of `token_analysis` (the rest is pipeline.token_analysis's spec).


@dataclass(frozen=True, kw_only=True)
class StudySettings:
    """The study's top-level settings (the sections and the tables of models, methods and benchmarks aside).

    Declared here once (``pipeline.core.declared``): ``python -m tools.schema`` writes them into the schema's top-level
    properties, and ``Study`` has them as its fields."""

    results_dir: str = setting(
        "results", "where every stage output goes (runs, eval, tables, figures, stats, logs, report.md)", non_empty=True
    )
    eval_data_dir: str = setting("eval_data", "where the normalized benchmark files <name>.jsonl go", non_empty=True)
    container_image: str = setting(
        "containers/grail.sif",
        "image every rule runs in with `--sdm apptainer` (ignored otherwise): a .sif file (relative to the "
        "repository; `containers/build.sh apptainer` writes the default) or an image URI "
        "(docker://REGISTRY/NAME:TAG-gpu)",
        non_empty=True,
    )
    hf_home: str | None = setting(
        None,
        "the Hugging Face cache (HF_HOME) every job reads, and the preflight checks: a directory the compute nodes "
        'share (bind it into the image with --apptainer-args "--bind DIR"); null: the controller\'s own HF_HOME '
        "(else ~/.cache/huggingface). Where it is changes no result",
        non_empty=True,
    )
    library_changes: LibraryChanges = setting(
        "warn",
        "what a change of the libraries that shape the numbers (torch, transformers, trl, vllm, math-verify, "
        "accelerate, deepspeed; recorded per training run and evaluation) does: warn (the report flags mixed "
        "versions, nothing reruns) or rerun (the versions Snakemake's Python sees become a param of training and "
        "evaluation; switching a study made under warn to rerun reruns them once). docs/reruns.md",
    )
    training_engine: TrainingEngine = setting(
        "auto",
        "how every training job with more than one process trains (pipeline.launch --engine): auto (DeepSpeed ZeRO-2 "
        "where CUDA devices are visible, as the paper; DDP on CPU processes), zero2 (DeepSpeed ZeRO-2 everywhere, "
        "over gloo on CPU processes) or ddp. Precision follows the training spec (bf16 on GPUs, fp32 on the CPU). "
        "docs/cluster.md",
    )
    stale_checkpoints: StaleCheckpoints = setting(
        "set_aside",
        "what a training run does with checkpoints made under other settings (another spec, seed, training data, "
        "start model, code, or library versions under library_changes rerun) before it starts from scratch: "
        "set_aside (moved to RUN_DIR/set_aside/TIME/ with why.json, named in the log; the preflight's disk check "
        "counts them) or delete. docs/reruns.md",
    )
    kernel_pin: bool = setting(
        True,
        "hold torch, MKL and oneDNN to the AVX2 kernel path on every job (ATEN_CPU_CAPABILITY=avx2, "
        "MKL_CBWR=COMPATIBLE,STRICT, ONEDNN_MAX_CPU_ISA=AVX2), so that the study's numbers are the same on any "
        "x86-64 CPU with AVX2, Intel or AMD (AVX-512 and AVX2 kernels differ in the last bits, which RL amplifies "
        "into points). false: each machine's fastest kernels; the numbers then hold only on the CPU type that made "
        "them. A change reruns warm-up, training, evaluation, token analysis and the viewer. Covers CPU kernels only "
        "(CUDA: docs/fidelity.md). pipeline.core.kernels",
    )
    gpu_determinism: bool = setting(
        False,
        "make each training run and evaluation repeat itself bitwise on the same GPU model and count: "
        "torch.use_deterministic_algorithms(True) with CUBLAS_WORKSPACE_CONFIG=:4096:8, cudnn.benchmark off, "
        "FLASH_ATTENTION_DETERMINISTIC=1, NCCL_ALGO=Ring and, where CUDA is visible, vLLM's batch-invariant mode "
        "(VLLM_BATCH_INVARIANT=1). Costs speed (docs/fidelity.md lists what each costs); an operator without a "
        "deterministic CUDA kernel stops the job, naming it. Across GPU models or counts nothing is bitwise equal "
        "either way. false (as upstream): none is set. On the CPU it changes no number. Recorded in each run's and "
        "evaluation's provenance; turning it on reruns training and evaluation. pipeline.core.gpu_determinism",
    )
    strict_revisions: bool = setting(
        False,
        "refuse, when the study is planned, every hub model and dataset revision (models.NAME.revision, "
        "data.deepmath.revision, benchmarks.NAME.revision, or the default a stage would use) that is not a 40-hex "
        "commit: a branch such as main may move, and the study would then rerun on other files. The fix, after "
        "`hf download`: python -m pipeline.pin_revisions --configfile FILE --write. docs/cluster.md",
    )
    time_windows: int = setting(
        8,
        "the most Slurm time-limit windows one training job may use: a job that Slurm's time-limit warning stopped "
        "(checkpoint saved, exit 75) requeues itself and resumes while windows are left, without spending a retry; "
        "the warning at the end of the last window fails the attempt (Snakemake's retry gets as many windows again, "
        "so at most time_windows x (retries + 1) in all). 1: no requeue. pipeline.runtime.time_windows, "
        "docs/cluster.md",
        Range(minimum=1),
    )
    checkpoint_volume: str | None = setting(
        None,
        "a directory that outlives a training job's own disk, where training keeps its resumable checkpoints (at the "
        "run directory's path under it): on Kubernetes the mount path of a PersistentVolumeClaim "
        "(grail-kubernetes-persistent-volumes in profiles/kubernetes), so that the retry of an evicted pod resumes "
        "instead of starting over. null: in the run directory (RUN_DIR/checkpoints), which persists on Slurm and "
        "local runs. A run-time setting: a change reruns nothing. docs/cluster.md",
    )
    methods_only: tuple[str, ...] | None = setting(
        None,
        "run only these of `methods` (null: all), so that a subset of any study runs without copying its config: "
        "`snakemake --config 'methods_only=[grpo,grail]'`; a name that `methods` does not define is refused with the "
        "defined ones. docs/usage.md",
        json={"type": ["array", "null"], "minItems": 1, "uniqueItems": True, "items": {"$ref": "#/$defs/name"}},
    )
    seeds: tuple[int, ...] = setting(
        REQUIRED,
        "every training run is one (model, method, seed); evaluation sampling uses the same seed",
        json={"type": "array", "minItems": 1, "uniqueItems": True, "items": {"type": "integer", "minimum": 0}},
    )


@dataclass(frozen=True)
class Resources:
    """A job's request.

    `resources.<rule>` and `models.<name>.resources.<rule>`, whose unset keys are the next level's; declared here once (``pipeline.core.declared``): the schema's ``resource`` entry, and the values of
    ``resources.default`` (``tools.schema.resources``). ``threads`` for Snakemake is ``cpus``."""

    filled_by_default: ClassVar[bool] = False

    cpus: int = setting(1, "Snakemake threads", Range(minimum=1), schema_default=False)
    mem_mb: int = setting(2000, "memory in MB", Range(minimum=1), schema_default=False)
    runtime: int = setting(
        60, "time limit in minutes (a retry gets attempt x runtime)", Range(minimum=1), schema_default=False
    )
    gpus: int = setting(
        0,
        "GPUs (training: one process per GPU; evaluation with vllm: must equal tensor x data parallel size, and is "
        "left unset under evaluation.gpu_sizing.layout sized; 0: no GPU request)",
        Range(minimum=0),
        schema_default=False,
    )
    nodes: int = setting(1, "nodes (training: one launcher per node)", Range(minimum=1), schema_default=False)
    gpu_model: str | None = setting(
        None,
        "the cluster's GPU type (Slurm GRES), e.g. a100",
        json={"type": "string", "pattern": "^[A-Za-z0-9_.-]+$"},
        schema_default=False,
    )
    slurm_extra: str | None = setting(
        None,
        "extra sbatch flags, e.g. --exclusive (a site's --set-resources RULE:slurm_extra replaces them)",
        json={"type": "string"},
        schema_default=False,
    )
    time_limit_warning_s: int = setting(
        0,
        "training: seconds before the Slurm time limit that the launcher warns the stage (SIGUSR1) to save a "
        "checkpoint and end its time window; a calibration's measured lead replaces it (0: no warning)",
        Range(minimum=0),
        schema_default=False,
    )

    def __post_init__(self) -> None:
        refuse_out_of_range(self, "resources")

    def snakemake_resources(self) -> dict[str, int | str]:
        """Snakemake's resource names: mem_mb, runtime (minutes), nodes, and gpu/gpu_model/slurm_extra when set.

        ``gpu`` is left out for CPU-only requests: executors read any ``gpu`` resource as a GPU request (the
        Kubernetes plugin then adds a GPU limit and toleration even for 0).
        """
        resources: dict[str, int | str] = {"mem_mb": self.mem_mb, "runtime": self.runtime, "nodes": self.nodes}
        if self.gpus:
            resources["gpu"] = self.gpus
        if self.gpu_model:
            resources["gpu_model"] = self.gpu_model
        if self.slurm_extra:
            resources["slurm_extra"] = self.slurm_extra
        return resources


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """A model's own keys (its source, warm-up, training and resources are sections of their own). None stands for a
    key the study leaves out: the schema gives them no default."""

    path: str | None = setting(
        None,
        "a local model directory (with a config.json), else a hub id (name or owner/name) with `revision`; checked "
        "when the study is planned",
        json={"type": "string"},
        non_empty=True,
        schema_default=False,
    )
    revision: str | None = setting(
        None,
        "the hub commit, tag or branch of a hub id `path`",
        json={"type": "string"},
        non_empty=True,
        schema_default=False,
    )
    parameters: int | None = setting(
        None,
        "the model's parameter count, for the disk estimate and the sized evaluation layout, where the hub id does "
        "not name it (an `8B` in Qwen/Qwen3-8B)",
        json={"$ref": "#/$defs/positive_int"},
        schema_default=False,
    )


@dataclass(frozen=True, kw_only=True)
class ModelConfig(ModelSettings):
    """A model: a hub id or local ``path`` at ``revision`` (used as it is); a ``source`` built here from an
    installed package (pipeline.models.model_source.ModelSource), optionally warmed up (``warmup``, SFT keys only);
    or the tiny model built from the architecture in ``warmup`` and warmed up. Its own keys are ``ModelSettings``'
    fields."""

    name: str
    warmup: dict[str, Any] | None
    source: dict[str, Any] | None
    training: dict[str, Any]
    resources: dict[str, dict[str, Any]]

    @property
    def warmup_seed(self) -> int:
        """The warmup stage's ``--seed`` (random init and SFT batch order)."""
        return self.warmup["seed"]

    @property
    def warmup_spec(self) -> dict[str, Any]:
        """WARMUP_SPEC: the warm-up settings without the seed, which travels as ``--seed``."""
        return {key: value for key, value in self.warmup.items() if key != "seed"}


@dataclass(frozen=True)
class MethodConfig:
    """A training method: METHOD_SPEC (``credit`` plus its options and any GRPOConfig override)."""

    name: str
    spec: dict[str, Any]

    @property
    def credit(self) -> str:
        return self.spec["credit"]

    @property
    def credit_module(self) -> str:
        """The module of its credit method, a root of the train rule's code digest: a built-in method's file
        (pipeline/credit/methods/<name>.py, loaded by name at run time, so no import of ``pipeline.train`` leads to
        it) or an out-of-tree method's import path (its own package's imports covered too)."""
        from pipeline.credit.method import credit_module

        return credit_module(self.credit)

    @property
    def grpo_overrides(self) -> dict[str, Any]:
        """The GRPOConfig fields this method overrides (everything but the credit options)."""
        return {key: value for key, value in self.spec.items() if not is_credit_key(key)}


# the JSON schema of a list of checkpoints: `final` and/or training steps
CHECKPOINT_LIST = {
    "type": "array",
    "minItems": 1,
    "uniqueItems": True,
    "items": {"anyOf": [{"const": "final"}, {"type": "integer", "minimum": 1}]},
}


@dataclass(frozen=True)
class EvaluationPlan:
    """The ``evaluation`` keys that plan jobs (the stage's are ``EvalSpec``), declared here
    (``pipeline.core.declared``)."""

    checkpoints: tuple[str | int, ...] = setting(
        ("final",),
        "what each run is evaluated at: `final` and/or training steps (exported by the train job)",
        json=CHECKPOINT_LIST,
    )
    baseline: bool = setting(True, "also evaluate each model's starting point (method `base`, checkpoint `start`)")
    job_per: Literal["checkpoint", "benchmark"] = setting(
        "checkpoint",
        "checkpoint: one evaluate job per (run, checkpoint) serves all its benchmarks with one engine start-up (each "
        "benchmark its own samples file; a changed benchmark regenerates only its own samples); benchmark: one job "
        "per (run, checkpoint, benchmark), shorter jobs for a site that limits job length, an engine start-up each",
    )


@dataclass(frozen=True, kw_only=True)
class EvaluationConfig(EvaluationPlan):
    """EVAL_SPEC for the evaluate stage, plus what to evaluate: the plan's settings (checkpoints as labels), and how
    many GPUs each job asks for on the vllm backend (``gpu_sizing``)."""

    spec: dict[str, Any]
    checkpoints: tuple[str, ...]
    gpu_sizing: GpuSizing = field(default_factory=GpuSizing)


@dataclass(frozen=True)
class EvaluateRule:
    """One evaluate rule of the Snakefile: its name, the benchmarks each job samples (None: one, its ``benchmark``
    wildcard) and the checkpoint labels it serves (None: all)."""

    name: str
    benchmarks: tuple[str, ...] | None
    checkpoints: tuple[str, ...] | None

    def serves(self, checkpoint: str) -> bool:
        return self.checkpoints is None or checkpoint in self.checkpoints


@dataclass(frozen=True)
class TokenAnalysisPlan:
    """The ``token_analysis`` keys that plan jobs (the others are the stage's, ``TokenAnalysisSpec``), declared here
    (``pipeline.core.declared``)."""

    enabled: bool = setting(False, "run the token analysis for the analysed methods' runs")
    benchmark: str | None = setting(None, "whose evaluation samples are analysed", shared="name", schema_default=False)
    checkpoints: tuple[str, ...] | None = setting(
        None,
        "default evaluation.checkpoints; a checkpoint not in evaluation.checkpoints is exported by every train job and "
        "evaluated on the analysed benchmark only",
        json=CHECKPOINT_LIST,
        schema_default=False,
    )
    methods: tuple[str, ...] | None = setting(
        None,
        "the methods whose runs are analysed, each of the GRAIL family (its options GRAIL's: grail, grail_shuffled, "
        "a variant of them); null: every method whose credit is grail",
        json={"type": ["array", "null"], "minItems": 1, "uniqueItems": True, "items": {"$ref": "#/$defs/name"}},
    )


TOKEN_ANALYSIS_PLAN_KEYS = tuple(option.name for option in fields(TokenAnalysisPlan))


@dataclass(frozen=True, kw_only=True)
class TokenAnalysisConfig(TokenAnalysisPlan):
    """Spec 8 for the analysed runs: the plan's settings resolved (the benchmark, the checkpoints) and the stage's
    spec."""

    checkpoints: tuple[str, ...] = ()
    spec: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TokenViewerConfig:
    """pipeline.token_viewer: an HTML page of rollouts coloured by token weight, a row per study method that weights
    tokens (each computed by the method itself with its own options), per (model, method, evaluated checkpoint) of
    the first seed; prompt format and saliency temperature from token_analysis.

    The ``token_viewer`` section, declared here (``pipeline.core.declared``); ``Study`` builds it with the benchmark
    resolved."""

    enabled: bool = setting(True, "false: no viewer page")
    benchmark: str | None = setting(
        None,
        "whose evaluation samples are shown; default token_analysis.benchmark, else the first benchmark",
        shared="name",
        schema_default=False,
    )
    rollouts: int = setting(2, "correct and wrong rollouts shown each", Range(minimum=1))
    seed: int = setting(
        0,
        "chooses the rollouts and seeds the methods' noise (OAR-G's, grail_shuffled's permutation)",
        Range(minimum=0),
    )

    def __post_init__(self) -> None:
        refuse_out_of_range(self, "token_viewer")


@dataclass(frozen=True)
class CreditTruthConfig:
    """On a decisive-step benchmark (a generated one with steps > 1), where every method that weights tokens puts
    its weight against the generator's truth (AUROC of the weights against the decisive tokens, by the sign of the
    advantage), all methods on the same rollouts, and the share of the floor-to-ceiling accuracy gap each method
    closes; at the significance checkpoint, with its resamples, confidence and seed; prompt format and saliency
    temperature from token_analysis. On only when the study has such a benchmark and the rollouts' method.
    docs/credit-methods.md

    The ``credit_truth`` section (pipeline.credit_placement), declared here (``pipeline.core.declared``); ``Study``
    builds it with ``benchmark`` resolved (None: no decisive-step benchmark, or off) and ``rollouts_of`` too."""

    enabled: bool = setting(True, "false switches the placement scores off")
    benchmark: str | None = setting(
        None, "a decisive-step benchmark; default the first one", shared="name", schema_default=False
    )
    rollouts_of: str | None = setting(
        None,
        "the method whose runs' rollouts (one seed group per training seed) every method is scored on; default floor",
        shared="name",
        schema_default=False,
    )
    floor: str = setting("grpo", "the method that is 0 in the gap share", shared="name")
    ceiling: str = setting("oracle", "the method that is 1 in the gap share", shared="name")
    max_rollouts: int = setting(
        256,
        "rollouts with a non-zero advantage scored per seed (whole groups in benchmark order, until this many)",
        Range(minimum=1),
    )
    batch_size: int = setting(
        16, "rollouts per forward and backward, within one item's group (never two items' in one)", Range(minimum=1)
    )
    placement_only: tuple[str, ...] = setting(
        (),
        "methods of `methods` that are scored here (and in the token viewer) on the rollouts without being trained: "
        "no runs, so no accuracy or gap share",
        json={"type": "array", "uniqueItems": True, "items": {"$ref": "#/$defs/name"}},
    )

    def __post_init__(self) -> None:
        refuse_out_of_range(self, "credit_truth")


@dataclass(frozen=True)
class SignificanceConfig:
    """The paired tests of the methods (pipeline.significance): at one checkpoint, on the metrics, with the
    bootstrap's resamples, level and seed.

    The ``significance`` section of the study config, declared here (``pipeline.core.declared``)."""

    checkpoint: str | int = setting(
        FINAL_CHECKPOINT,
        "the checkpoint whose scores the tests compare",
        json={"anyOf": [{"const": FINAL_CHECKPOINT}, {"type": "integer", "minimum": 1}]},
    )
    metrics: list[str] | None = setting(
        None,
        "null = acc@n and pass@n",
        json={
            "type": ["array", "null"],
            "items": {"type": "string", "pattern": "^(acc@[0-9]+|pass@[0-9]+|mean_tokens|no_answer)$"},
        },
    )
    resamples: int = setting(
        10000,
        "bootstrap resamples (over items; over runs and items), and the random labellings of a permutation test over "
        "runs with more than 50,000",
        Range(minimum=1),
    )
    confidence: float = setting(0.95, "the bootstrap interval's level", Range(exclusive_minimum=0, exclusive_maximum=1))
    seed: int = setting(0, "the bootstrap's seed", Range(minimum=0))

    def __post_init__(self) -> None:
        refuse_out_of_range(self, "significance")


@dataclass(frozen=True)
class CalibrationConfig:
    """The expected cost (python -m pipeline.calibrate measures the study on the target hardware; the preflight,
    the planner and the report predict each job from its file, results_dir/calibration.json). It changes no job,
    only what they are predicted to cost. docs/cluster.md

    The ``calibration`` section of the study config, declared here (``pipeline.core.declared``)."""

    train_steps: int = setting(
        8,
        "training steps the calibration runs per (model, method); the first is counted as warm-up, the others give "
        "the seconds a step and their spread",
        Range(minimum=2),
    )
    length_growth: float = setting(
        1.5,
        "how many times longer the completions may get during RL than the calibration measured (capped at the "
        "token limit); only the high prediction uses it",
        Range(minimum=1),
    )
    time_limit_margin: float = setting(
        1.5, "a proposed time limit is the rule's longest high prediction times this margin", Range(minimum=1)
    )

    def __post_init__(self) -> None:
        refuse_out_of_range(self, "calibration")
