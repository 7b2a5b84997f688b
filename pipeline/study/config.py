"""The study configuration: schema check with key-naming messages, semantic checks, typed views for the Snakefile.

    >>> from pipeline.study.load import load_study   # the files merged, schema, defaults, semantic checks
    >>> study = load_study(["configs/default.yaml"])   # every error at once -> InputError; a Study
    >>> sorted(study.methods), study.seeds
    (['grail', 'grpo', 'oar_g'], (0, 1))

(The Snakefile builds it from Snakemake's merged config: ``Study.from_config(config)``.)

Every error names the config key it is about (``models.tiny.warmup.steps``), and all errors are reported at once.

``Study`` is the one typed view that the Snakefile, the preflight and the planner read; its sections (a model, a
method, the evaluation, ...) are ``pipeline.study.sections``'.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any

from pipeline.core.io import InputError
from pipeline.core.layout import BASELINE_METHOD, FINAL_CHECKPOINT, START_CHECKPOINT, checkpoint_label, label_step
from pipeline.runtime.health import HealthConfig
from pipeline.runtime.settings import RUNTIME_TRAINING_KEYS, RuntimeSettings
from pipeline.runtime.watchdog import WatchdogConfig
from pipeline.study import cost
from pipeline.study.benchmark_sizes import benchmark_items
from pipeline.study.checks import decisive_benchmarks, semantic_errors, token_analysis_keys
from pipeline.study.gpu_sizing import EngineLayout, GpuSizing, engine_utilization, fixed_layout, sized_layout
from pipeline.study.schema import error_block
from pipeline.study.sections import (
    TOKEN_ANALYSIS_PLAN_KEYS,
    CalibrationConfig,
    CreditTruthConfig,
    EvaluateRule,
    EvaluationConfig,
    MethodConfig,
    ModelConfig,
    ModelSettings,
    Resources,
    SignificanceConfig,
    StudySettings,
    TokenAnalysisConfig,
    TokenViewerConfig,
)
from pipeline.training.tracking import TrackingConfig, run_name


@dataclass(frozen=True, kw_only=True)
class Study(StudySettings):
    """The validated config, split by concern; the Snakefile plans every job from it. The top-level settings are
    ``StudySettings``' fields."""

    data: dict[str, Any]
    benchmarks: dict[str, dict[str, Any]]
    models: dict[str, ModelConfig]
    methods: dict[str, MethodConfig]  # the methods that train (``methods_only``, less ``placement_only``)
    declared_methods: dict[str, MethodConfig]  # every method of the config's ``methods``: the offline tools score them
    training: dict[str, Any]
    evaluation: EvaluationConfig
    token_analysis: TokenAnalysisConfig
    significance: SignificanceConfig
    tracking: TrackingConfig
    watchdog: WatchdogConfig
    token_viewer: TokenViewerConfig
    health: HealthConfig
    credit_truth: CreditTruthConfig
    calibration: CalibrationConfig
    resource_table: dict[str, dict[str, Any]] = field(repr=False)
    # the whole config, merged and with the schema's defaults (the report records it)
    config: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Study:
        """Build from a schema-checked config with defaults filled; InputError lists every semantic problem."""
        errors = semantic_errors(config)
        if errors:
            raise InputError(error_block("the config is inconsistent", errors))
        config = copy.deepcopy(dict(config))
        methods_only = config["methods_only"]
        evaluation = dict(config["evaluation"])
        checkpoints = tuple(checkpoint_label(c) for c in evaluation.pop("checkpoints"))
        baseline = evaluation.pop("baseline")
        job_per = evaluation.pop("job_per")
        gpu_sizing = GpuSizing(**evaluation.pop("gpu_sizing"))
        analysis = dict(config["token_analysis"])
        viewer = config["token_viewer"]
        truth = config["credit_truth"]
        return cls(
            **{option.name: config[option.name] for option in fields(StudySettings)}
            | {"seeds": tuple(config["seeds"]), "methods_only": None if methods_only is None else tuple(methods_only)},
            data=config["data"],
            benchmarks=config["benchmarks"],
            models={
                name: ModelConfig(
                    name=name,
                    **{option.name: raw.get(option.name) for option in fields(ModelSettings)},
                    warmup=raw.get("warmup"),
                    source=raw.get("source"),
                    training=raw.get("training", {}),
                    resources=raw.get("resources", {}),
                )
                for name, raw in config["models"].items()
            },
            methods={
                name: MethodConfig(name, spec)
                for name, spec in config["methods"].items()
                if (methods_only is None or name in methods_only) and name not in truth.get("placement_only", ())
            },
            declared_methods={name: MethodConfig(name, spec) for name, spec in config["methods"].items()},
            training=config["training"],
            evaluation=EvaluationConfig(
                spec=evaluation, checkpoints=checkpoints, baseline=baseline, job_per=job_per, gpu_sizing=gpu_sizing
            ),
            token_analysis=TokenAnalysisConfig(
                enabled=analysis["enabled"],
                benchmark=analysis.get("benchmark"),
                checkpoints=tuple(checkpoint_label(c) for c in analysis.get("checkpoints", ())) or checkpoints,
                methods=None if analysis.get("methods") is None else tuple(analysis["methods"]),
                spec={k: v for k, v in analysis.items() if k not in TOKEN_ANALYSIS_PLAN_KEYS},
            ),
            significance=SignificanceConfig(**config["significance"]),
            tracking=TrackingConfig(**config["tracking"]),
            watchdog=WatchdogConfig(**config["watchdog"]),
            health=HealthConfig(**config["health"]),
            token_viewer=TokenViewerConfig(
                **viewer
                | {
                    "benchmark": viewer.get("benchmark")
                    or analysis.get("benchmark")
                    or next(iter(config["benchmarks"]))
                }
            ),
            credit_truth=CreditTruthConfig(
                **truth
                | {
                    "benchmark": truth.get("benchmark", next(iter(decisive_benchmarks(config)), None))
                    if truth["enabled"]
                    else None,
                    "rollouts_of": truth.get("rollouts_of", truth["floor"]),
                    "placement_only": tuple(truth.get("placement_only", ())),
                }
            ),
            calibration=CalibrationConfig(**config["calibration"]),
            resource_table=config["resources"],
            config=config,
        )

    # ----- specs passed to the stages

    def training_spec(self, model: str) -> dict[str, Any]:
        """TRAINING_SPEC of a model: the top-level ``training`` with the model's overrides, less the run-time
        settings (``runtime``)."""
        spec = {**self.training, **self.models[model].training}
        return {key: value for key, value in spec.items() if key not in RUNTIME_TRAINING_KEYS}

    @property
    def runtime(self) -> RuntimeSettings:
        """How every job runs, never what it computes (pipeline.runtime.settings): the Snakefile exports it."""
        return RuntimeSettings(
            watchdog=self.watchdog,
            health=self.health,
            time_windows=self.time_windows,
            ddp_timeout=self.training.get("ddp_timeout"),
            checkpoint_volume=self.checkpoint_volume,
        )

    def effective_training(self, model: str, method: str) -> dict[str, Any]:
        """What GRPOConfig will see for (model, method): TRAINING_SPEC with METHOD_SPEC's overrides on top."""
        return {**self.training_spec(model), **self.methods[method].grpo_overrides}

    def export_steps(self) -> list[int]:
        """Training steps whose model every train job exports: those of ``evaluation.checkpoints`` and, when the
        token analysis is on, of ``token_analysis.checkpoints`` (a job's outputs cannot depend on its method)."""
        labels = set(self.evaluation.checkpoints)
        if self.token_analysis.enabled:
            labels |= set(self.token_analysis.checkpoints)
        return sorted(label_step(label) for label in labels if label != FINAL_CHECKPOINT)

    def run_disk_bytes(self, model: str, with_checkpoints: bool = True) -> int | None:
        """One training run of ``model`` at its peak on disk (cost.run_disk_bytes): its kept checkpoints (none
        without ``with_checkpoints``), its exports and its final model; None when the model's size is unknown."""
        parameters = cost.parameter_count(self.config["models"][model])
        if not parameters:
            return None
        training = self.training_spec(model)
        saves = cost.saves(int(training.get("max_steps", 0)), int(training.get("save_steps", 500)))
        return cost.run_disk_bytes(
            parameters,
            bf16=bool(training.get("bf16", True)),
            save_total_limit=training.get("save_total_limit"),
            checkpoints=saves if with_checkpoints else 0,
            exports=len(self.export_steps()),
        )

    def disk_mb(self, stage: str, model: str | None, input_mb: float) -> int:
        """A job's local disk in MB (Snakemake's ``disk_mb``, which the Kubernetes executor requests and limits as
        the pod's ephemeral-storage): Snakemake's default, twice the job's inputs and at least 1000 MB, plus what a
        job of a model writes or fetches beside its inputs: the weights of a model given by ``path`` (a hub model is
        downloaded into the job's hub cache), and for training its exports, final model and kept checkpoints (not
        those on ``checkpoint_volume``). A model of unknown size adds nothing."""
        needed = max(2 * input_mb, 1000) * cost.MB
        if model is not None:
            parameters = cost.parameter_count(self.config["models"][model])
            if self.models[model].path is not None and parameters:
                needed += 2 * parameters  # the hub's bf16 weights
            if stage == "train":
                needed += self.run_disk_bytes(model, with_checkpoints=self.checkpoint_volume is None) or 0
        return math.ceil(needed / cost.MB)

    def significance_checkpoint(self) -> str:
        """The checkpoint label the significance tests compare (``final`` or ``step-N``)."""
        return checkpoint_label(self.significance.checkpoint)

    def decontaminates(self) -> bool:
        return bool(self.data.get("decontaminate", {}).get("enabled"))

    # ----- what to run

    def runs(self) -> list[dict[str, Any]]:
        """One training run per (model, method, seed), as wildcard values."""
        return [
            {"model": model, "method": method, "seed": seed}
            for model in self.models
            for method in self.methods
            for seed in self.seeds
        ]

    def evaluations(self) -> list[dict[str, Any]]:
        """One evaluation per (run, checkpoint, benchmark); per (GRAIL run, checkpoint) on the token analysis's
        benchmark for checkpoints only the analysis needs; per (model, seed, benchmark) for the baseline."""
        jobs = [
            {**run, "checkpoint": checkpoint, "benchmark": benchmark}
            for run in self.runs()
            for checkpoint in self.evaluation.checkpoints
            for benchmark in self.benchmarks
        ]
        analysed_only = self.analysed_only_checkpoints()
        jobs += [
            {**run, "checkpoint": checkpoint, "benchmark": self.token_analysis.benchmark}
            for run in self.grail_runs()
            for checkpoint in analysed_only
        ]
        if self.evaluation.baseline:
            jobs += [
                {
                    "model": model,
                    "method": BASELINE_METHOD,
                    "seed": seed,
                    "checkpoint": START_CHECKPOINT,
                    "benchmark": benchmark,
                }
                for model in self.models
                for seed in self.seeds
                for benchmark in self.benchmarks
            ]
        return jobs

    def analysed_only_checkpoints(self) -> list[str]:
        """The checkpoints the token analysis needs and the evaluation does not: evaluated on its benchmark alone."""
        return [c for c in self.token_analysis.checkpoints if c not in self.evaluation.checkpoints]

    def evaluate_rules(self) -> list[EvaluateRule]:
        """The Snakefile's evaluate rules. With ``job_per: benchmark``, one rule (a ``benchmark`` wildcard) for every
        evaluation. With ``checkpoint``, one job per (run, checkpoint): ``evaluate`` for the evaluated checkpoints
        and the baseline, on every benchmark, and ``evaluate_analysed`` for the checkpoints only the token analysis
        reads, on its benchmark (Snakemake fixes a rule's outputs, so two sets of benchmarks take two rules)."""
        if self.evaluation.job_per == "benchmark":
            return [EvaluateRule("evaluate", None, None)]
        rules = [EvaluateRule("evaluate", tuple(self.benchmarks), (START_CHECKPOINT, *self.evaluation.checkpoints))]
        if analysed_only := self.analysed_only_checkpoints():
            rules.append(EvaluateRule("evaluate_analysed", (self.token_analysis.benchmark,), tuple(analysed_only)))
        return rules

    def evaluation_jobs(self) -> list[tuple[str, dict[str, Any], tuple[str, ...]]]:
        """Every evaluate job: its rule, wildcards and benchmarks (``evaluations`` grouped as ``evaluate_rules``
        says)."""
        jobs: dict[tuple[str, ...], tuple[str, dict[str, Any], tuple[str, ...]]] = {}
        for evaluation in self.evaluations():
            rule = next(r for r in self.evaluate_rules() if r.serves(evaluation["checkpoint"]))
            wildcards = evaluation if rule.benchmarks is None else {**evaluation, "benchmark": None}
            wildcards = {key: value for key, value in wildcards.items() if value is not None}
            key = (rule.name, *map(str, wildcards.values()))
            name, _, benchmarks = jobs.get(key, (rule.name, wildcards, ()))
            jobs[key] = (name, wildcards, (*benchmarks, evaluation["benchmark"]))
        return list(jobs.values())

    def run_name(self, run: Mapping[str, Any]) -> str:
        """A run's name in the trackers: ``<model>/<method>/seed<s>``."""
        return run_name(run["model"], run["method"], run["seed"])

    def credit_specs(self) -> dict[str, dict[str, Any]]:
        """Every declared method's credit options, as the offline tools (token viewer, credit placement) rebuild the
        methods (``pipeline.evaluation.offline_credit``): ``credit``, the options every method shares and the
        method's own, the training settings' under the method's; the first model's training settings (the weights
        do not depend on the model's training overrides). Trained or not: ``methods_only`` and ``placement_only``
        leave a method out of training, not out of the scores."""
        from pipeline.credit.method import credit_method  # no torch: planning loads the methods without it
        from pipeline.credit.settings import SharedCreditOptions

        training = self.training_spec(next(iter(self.models)))
        shared = {option.name for option in fields(SharedCreditOptions)}
        specs = {}
        for name, method in self.declared_methods.items():
            own = shared | {option.name for option in fields(credit_method(method.credit).options)}
            specs[name] = {key: value for key, value in {**training, **method.spec}.items() if key in own}
        return specs

    def credits(self) -> list[str]:
        """The study's credit methods as its config names them (built-in names, import paths), each once, sorted."""
        return sorted({method.credit for method in self.methods.values()})

    def credit_modules(self, *, scored: bool = False) -> list[str]:
        """The modules of the study's credit methods (``MethodConfig.credit_module``), each once, sorted: of the
        trained ones, or with ``scored`` of every declared one (what the offline tools build)."""
        methods = self.declared_methods if scored else self.methods
        return sorted({method.credit_module for method in methods.values()})

    def viewed_rollouts(self) -> list[dict[str, Any]]:
        """The evaluations the token viewer shows: every (model, method) of the first seed, at every evaluated
        checkpoint, on the viewer's benchmark (empty when it is disabled)."""
        if not self.token_viewer.enabled:
            return []
        return [
            {**run, "checkpoint": checkpoint, "benchmark": self.token_viewer.benchmark}
            for run in self.runs()
            if run["seed"] == self.seeds[0]
            for checkpoint in self.evaluation.checkpoints
        ]

    def placement_models(self) -> list[str]:
        """The models whose credit placement is scored (pipeline.credit_placement): every model when the study
        has a decisive-step benchmark and the rollouts' method, else none."""
        truth = self.credit_truth
        if truth.benchmark is None or truth.rollouts_of not in self.methods:
            return []
        return list(self.models)

    def placement_inputs(self, model: str) -> dict[str, list[dict[str, Any]]]:
        """The evaluations the placement of ``model`` reads, at the significance checkpoint on its benchmark:
        ``rollouts`` (the rollouts' method, one per seed: scored, with its model) and ``runs`` (every method's,
        for the accuracies of the gap share)."""
        checkpoint, benchmark = self.significance_checkpoint(), self.credit_truth.benchmark
        runs = [
            {**run, "checkpoint": checkpoint, "benchmark": benchmark} for run in self.runs() if run["model"] == model
        ]
        return {"rollouts": [job for job in runs if job["method"] == self.credit_truth.rollouts_of], "runs": runs}

    def method_grail_settings(self, method: str) -> dict[str, Any]:
        """The GRAIL settings of the token analysis (its keys that are GRAIL's options) as ``method`` trains with
        them: its own keys, else GRAIL's declared defaults (``GrailOptions``)."""
        from pipeline.credit.methods.grail import GrailOptions  # no torch: planning loads the methods without it

        spec = self.methods[method].spec
        analysed = [option for option in fields(GrailOptions) if option.name in token_analysis_keys()]
        return {option.name: spec.get(option.name, option.default) for option in analysed}

    def token_analysis_spec(self, method: str) -> dict[str, Any]:
        """The token analysis of ``method``'s runs: the section's settings, and every GRAIL setting it leaves unset
        as the method trains with it (``method_grail_settings``)."""
        return self.method_grail_settings(method) | self.token_analysis.spec

    def token_analysis_overrides(self, method: str) -> dict[str, tuple[Any, Any]]:
        """The GRAIL settings the token_analysis section sets to other values than ``method`` trains with:
        ``{name: (the analysis's, the method's)}``."""
        trained = self.method_grail_settings(method)
        spec = self.token_analysis.spec
        return {name: (spec[name], value) for name, value in trained.items() if name in spec and spec[name] != value}

    def grail_runs(self) -> list[dict[str, Any]]:
        """The runs the token analysis covers (``token_analysis.methods``'; by default credit ``grail``'s), empty
        when it is disabled."""
        if not self.token_analysis.enabled:
            return []
        analysed = self.token_analysis.methods
        if analysed is None:
            return [run for run in self.runs() if self.methods[run["method"]].credit == "grail"]
        return [run for run in self.runs() if run["method"] in analysed]

    # ----- evaluation jobs: what each generates, on how many GPUs

    @cached_property
    def benchmark_sizes(self) -> dict[str, int | None]:
        """Items per benchmark (``benchmark_items``; None: unknown before the benchmark is prepared)."""
        eval_data_dir = Path(self.eval_data_dir)
        return {name: benchmark_items(name, spec, eval_data_dir) for name, spec in self.benchmarks.items()}

    def evaluation_benchmarks(self, job: Mapping[str, Any]) -> list[str]:
        """The benchmarks an evaluate job serves: those of ``evaluations()`` matching every wildcard the job has
        (``job``: a mapping or Snakemake's wildcards). A job per benchmark serves its own; a job per (run,
        checkpoint) every benchmark evaluated at that checkpoint."""
        wanted = {key: str(value) for key, value in job.items()}
        benchmarks = [
            evaluation["benchmark"]
            for evaluation in self.evaluations()
            if all(str(evaluation.get(key)) == value for key, value in wanted.items())
        ]
        if not benchmarks:
            raise InputError(f"no evaluation of the study matches the evaluate job {wanted}")
        return list(dict.fromkeys(benchmarks))

    def evaluation_sequences(self, job: Mapping[str, Any], generations: Mapping[str, int] | None = None) -> int | None:
        """Sequences an evaluate job generates: the generations (items x n_samples) of its benchmarks, the study's
        or ``generations`` (the planner's alternatives); None when a benchmark's size is unknown."""
        if generations is None:
            samples = self.evaluation.spec["n_samples"]
            generations = {name: items and samples * items for name, items in self.benchmark_sizes.items()}
        counts = [generations[name] for name in self.evaluation_benchmarks(job)]
        return None if None in counts else sum(counts)

    def evaluation_layout(self, job: Mapping[str, Any], generations: Mapping[str, int] | None = None) -> EngineLayout:
        """The vLLM engines of an evaluate job and why (pipeline.study.gpu_sizing): ``evaluation.vllm``'s under the
        fixed layout (and off the vllm backend); under the sized one, from its model's parameters and the sequences
        it generates (with the study's generations per benchmark, or ``generations``)."""
        vllm = self.evaluation.spec["vllm"]
        if self.evaluation.spec["backend"] != "vllm" or self.evaluation.gpu_sizing.layout == "fixed":
            return fixed_layout(vllm)
        parameters = cost.parameter_count(self.config["models"][str(job["model"])])
        sequences = self.evaluation_sequences(job, generations)
        return sized_layout(parameters, sequences, self.evaluation.gpu_sizing, engine_utilization(vllm))

    def evaluation_spec(self, job: Mapping[str, Any]) -> dict[str, Any]:
        """EVAL_SPEC of one evaluate job: ``evaluation.spec`` with the job's engine layout (the same spec for every
        job unless the layout is sized on the vllm backend), so the engines it starts use the GPUs it asked for."""
        layout, spec = self.evaluation_layout(job), self.evaluation.spec
        sizes = {"tensor_parallel_size": layout.tensor_parallel_size, "data_parallel_size": layout.data_parallel_size}
        return {**spec, "vllm": {**spec["vllm"], **sizes}}

    def evaluation_gpus(self, model: str | None, job: Mapping[str, Any] | None) -> int:
        """GPUs of an evaluate job on the vllm backend: its layout's; without a job, the most any evaluate job
        (``evaluation_jobs``) of ``model`` (of any model: None) asks for."""
        if job is not None:
            return self.evaluation_layout(job).gpus
        jobs = [wildcards for _, wildcards, _ in self.evaluation_jobs() if model in (None, wildcards["model"])]
        return max(self.evaluation_layout(wildcards).gpus for wildcards in jobs)

    # ----- resources

    def resources(self, rule: str, model: str | None = None, job: Mapping[str, Any] | None = None) -> Resources:
        """``resources.default`` < ``resources.<rule>`` < ``models.<model>.resources.<rule>``.

        An evaluate job on the vllm backend asks for its engine layout's GPUs (``evaluation_gpus``: of ``job``,
        its wildcards) unless its GPUs are set.
        """
        merged = {**self.resource_table["default"], **self.resource_table.get(rule, {})}
        model_entry = self.models[model].resources.get(rule, {}) if model else {}
        merged.update(model_entry)
        explicit_gpus = "gpus" in self.resource_table.get(rule, {}) or "gpus" in model_entry
        if rule == "evaluate" and self.evaluation.spec["backend"] == "vllm" and not explicit_gpus:
            merged["gpus"] = self.evaluation_gpus(model, job)
        return Resources(**merged)
