"""The credit metrics ``GrailGRPOTrainer`` logs, gathered across processes into TRL's metric lists.

TRL averages each list over its logging window; docs/output.md "Logged metrics" says what every name means.
"""

from __future__ import annotations

from typing import Any

import torch

from pipeline.credit.stats import advantage_magnitudes

MetricLists = dict[str, list[float]]  # TRL's ``self._metrics[mode]``


def log_nanmeans(accelerator: Any, lists: MetricLists, prefix: str, stats: dict[str, float]) -> None:
    """Append each value's across-process nan-mean under ``<prefix>/``, unless it is NaN everywhere."""
    for name, value in stats.items():
        gathered = accelerator.gather(torch.tensor([float(value)], device=accelerator.device))
        if not torch.isnan(gathered).all():
            lists[f"{prefix}/{name}"].append(gathered.nanmean().item())


def log_percentiles(accelerator: Any, lists: MetricLists, name: str, values: torch.Tensor) -> None:
    """``<name>_p10`` and ``_p90`` of non-negative per-row values (e.g. grail/grad_norm, spec 1.9) pooled over all
    processes; nothing when no process has a value."""
    local = values.float().to(accelerator.device)
    gathered = accelerator.gather(accelerator.pad_across_processes(local, dim=0, pad_index=-1.0))
    gathered = gathered[gathered >= 0]
    if gathered.numel():
        quantiles = torch.quantile(gathered, torch.tensor([0.1, 0.9], device=gathered.device))
        lists[f"{name}_p10"].append(quantiles[0].item())
        lists[f"{name}_p90"].append(quantiles[1].item())


def log_credit_stats(accelerator: Any, lists: MetricLists, prefix: str, stats: dict[str, Any]) -> None:
    """A credit method's statistics under ``<prefix>/``, in order: a float as its across-process nan-mean, a
    1-D tensor of per-row values as percentiles (``pipeline.credit.method``)."""
    for name, value in stats.items():
        if isinstance(value, torch.Tensor):
            log_percentiles(accelerator, lists, f"{prefix}/{name}", value)
        else:
            log_nanmeans(accelerator, lists, prefix, {name: value})


def log_advantage_metrics(
    accelerator: Any,
    lists: MetricLists,
    prefix: str,
    raw: torch.Tensor,
    weighted: torch.Tensor,
    completion_mask: torch.Tensor,
) -> None:
    """Spec 1.9 loss-side metrics under ``<prefix>/``: the across-process means of raw_abs_mean = mean_i |A_i| and
    weighted_abs_mean = Σ|Â·m| / max(Σm, 1), the maxima, scale_ratio = weighted / (raw + 1e-8)."""
    gathered = accelerator.gather(advantage_magnitudes(raw, weighted, completion_mask).unsqueeze(0))
    raw_mean, weighted_mean = gathered[:, 0].mean().item(), gathered[:, 1].mean().item()
    lists[f"{prefix}/advantages_raw_abs_mean"].append(raw_mean)
    lists[f"{prefix}/advantages_raw_abs_max"].append(gathered[:, 2].max().item())
    lists[f"{prefix}/advantages_weighted_abs_mean"].append(weighted_mean)
    lists[f"{prefix}/advantages_weighted_abs_max"].append(gathered[:, 3].max().item())
    lists[f"{prefix}/advantages_scale_ratio"].append(weighted_mean / (raw_mean + 1e-8))
