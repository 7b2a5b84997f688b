"""docs/credit-methods.md's recipe ("Try a method in minutes") end to end, with a method written from that page
alone, not the example file: `late_tokens` in a package of its own on PYTHONPATH, named by import path with its
option on the command line, through the real Snakemake with configs/quick.yaml; beside it, the docs' entropy example
(docs/examples/entropy_weights.py), whose runs must count one policy forward per loss computation as GRPO's. Sizes are cut further by
`--config` overrides, as the page's `--config` allows, to keep the test's CI time small.

The study runs under the newest Snakemake 9 release on PyPI (a virtual environment over this one's packages,
`pip install --upgrade "snakemake>=9,<10"`: nothing to install while the images' pin, which every other test runs,
is the newest), so that a Snakemake release that breaks the Snakefile, or the plan pipeline.why_rerun reads from
Snakemake's DAG, is seen before a user upgrades into it.

Slow: one Snakemake study of 12 jobs, about 2 min of CPU in all (measured: 118 s, Snakemake and its jobs), so
about 60-80 s on two idle CPU cores, and the virtual environment (seconds; a minute when pip downloads a release)."""

from __future__ import annotations

import html
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

# Written from docs/credit-methods.md: the interface, the statistics rule and the rows a formula must survive.
LATE_TOKENS = '''"""More credit to later tokens: w_{i,t} = (1 + alpha t) / (1 + alpha (n_i - 1) / 2) on the n_i real tokens
t = 0 .. n_i - 1 of row i (mean 1 over the row), 0 on padding; n_i clamped to 1 (a truncated row has none)."""

from dataclasses import dataclass, field

import torch

from pipeline.credit.method import CreditInputs, CreditMethod, CreditResult, Range, carries_loss, scaled
from pipeline.credit.stats import weight_stats


@dataclass
class LateTokensOptions:
    alpha: float = field(default=1.0, metadata={"help": "Weight growth per token.", "range": Range(minimum=0)})


def late_token_weights(completion_mask: torch.Tensor, alpha: float) -> torch.Tensor:
    mask = completion_mask.float()
    n = mask.sum(dim=-1, keepdim=True).clamp(min=1)
    t = torch.arange(mask.size(1), device=mask.device)[None, :]
    return (1 + alpha * t) / (1 + alpha * (n - 1) / 2) * mask


class LateTokens(CreditMethod):
    name = "late_tokens"
    options = LateTokensOptions
    needs_spans = False
    headline = ("weight_std",)

    def advantages(self, inputs: CreditInputs) -> CreditResult:
        mask = inputs.batch["completion_mask"]
        weights = late_token_weights(mask, self.opts.alpha)
        rows = carries_loss(inputs.batch)
        stats = weight_stats(weights[rows], mask[rows].bool())
        return CreditResult(scaled(inputs.batch["advantages"], weights), weights, stats)


METHOD = LateTokens
'''

# The page's command, then sizes cut for CI: fewer training rows, 2 RL steps of 2 prompts, 8 items, no baseline.
# The warm-up stays (90 steps, seconds): a shorter one leaves a model whose every reward is 0, no row carries loss.
# Beside it, the docs' entropy example (docs/credit-methods.md, "Log-probs and entropies", with docs/ on the path):
# it reads the policy's entropies, and its run's metrics must count one policy forward per loss, as GRPO's.
METHOD = (
    "methods={mine: {credit: mylab.late_tokens, credit_options: {alpha: 2.0}},"
    " entropy_weights: {credit: examples.entropy_weights, credit_options: {scale: 0.5}}}"
)
SMALLER = [
    "data={generated: {count: 200}}",
    "training={max_steps: 2, save_steps: 2, logging_steps: 1, per_device_train_batch_size: 16}",
    "benchmarks={arith_add: {generated: {count: 8}}}",
    "evaluation={n_samples: 2, baseline: false}",
    "significance={resamples: 100}",
]


NEWEST_SNAKEMAKE = "snakemake>=9,<10"


def newest_snakemake_python(root: Path) -> tuple[str, str]:
    """A Python whose Snakemake is the newest ``NEWEST_SNAKEMAKE`` release, and that version: a virtual environment
    that sees this one's packages, the project included, with Snakemake upgraded in it (and only Snakemake's own
    requirements that the release needs)."""
    environment = root / "newest-snakemake"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(environment)], check=True, timeout=120)
    python = str(environment / "bin" / "python")
    install = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--upgrade", NEWEST_SNAKEMAKE]
    subprocess.run(install, check=True, timeout=600)
    version = subprocess.run([python, "-m", "snakemake", "--version"], capture_output=True, text=True, check=True)
    return python, version.stdout.strip()


def test_a_method_written_from_the_docs_runs_through_the_quick_recipe(tmp_path: Path) -> None:
    package = tmp_path / "lab" / "mylab"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "late_tokens.py").write_text(LATE_TOKENS)
    workdir = tmp_path / "study"
    python, snakemake_version = newest_snakemake_python(tmp_path)
    assert snakemake_version.startswith("9."), snakemake_version
    command = [python, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir)]
    command += ["--cores", "2", "--configfile", str(REPO / "configs" / "quick.yaml"), "--config", METHOD, *SMALLER]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "lab"), str(REPO / "docs")])}
    result = subprocess.run(command, capture_output=True, text=True, timeout=1200, env=environment)
    # The aggregate stage refuses statistics of a method no credit names: a run that ends passed the method on.
    assert result.returncode == 0, f"Snakemake {snakemake_version}: {result.stderr[-5000:]}"

    results = workdir / "results" / "quick"
    rows = [json.loads(line) for line in (results / "runs/tiny/mine/seed0/metrics.jsonl").open()]
    stds = [row["late_tokens/weight_std"] for row in rows if "late_tokens/weight_std" in row]
    assert stds and all(math.isfinite(std) and std > 0 for std in stds)
    assert any("late_tokens/advantages_scale_ratio" in row for row in rows)
    assert "| tiny | mine | final |" in (results / "report.md").read_text()
    # the entropy example through Snakemake: no forward of its own (TRL's loss forward, memoised), as GRPO
    for method in ("grpo", "entropy_weights"):
        rows = [json.loads(line) for line in (results / f"runs/tiny/{method}/seed0/metrics.jsonl").open()]
        counted = [row["credit/loss_forwards"] for row in rows if "credit/loss_forwards" in row]
        assert counted and set(counted) == {1.0}, (method, counted)
    rows = [json.loads(line) for line in (results / "runs/tiny/entropy_weights/seed0/metrics.jsonl").open()]
    assert any(row.get("entropy_weights/entropy_mean", 0) > 0 for row in rows)
    # the token viewer rebuilt the method with alpha 2: each rollout's weights rise and average 1
    page = (results / "token_weights.html").read_text()
    viewed = [json.loads(html.unescape(found))["mine"] for found in re.findall(r'data-weights="([^"]*)"', page)]
    assert viewed
    for weights in viewed:
        assert sum(weights) / len(weights) == pytest.approx(1, abs=1e-3)
        assert weights == sorted(weights) and (len(weights) == 1 or weights[-1] > weights[0])
    # why_rerun plans through the same Snakemake: the finished study has nothing to do
    why = [python, "-m", "pipeline.why_rerun", "--directory", str(workdir)]
    why += ["--configfile", str(REPO / "configs" / "quick.yaml"), "--config", METHOD, *SMALLER]
    result = subprocess.run(why, capture_output=True, text=True, timeout=300, env=environment, cwd=REPO)
    assert result.returncode == 0 and "Nothing to be done" in result.stdout, f"{snakemake_version}: {result.stderr}"
