"""The training health check: a run that has collapsed, finite but dead, is named and stopped.

The NaN guard (pipeline.training.nan_guard) stops a run whose loss, gradient norm or weights stop being finite. A
run can also collapse and stay finite: at ``learning_rate: 100`` the quick study's loss and gradient norm are 0.0
from the first step and its reward from step 4, while its largest weight grows from 1.1 to 531 (its weights' L2
norm 3413x in two steps); without this check the job exits 0 and publishes the wreck. The check reads the rows the trainer logs (``metrics.jsonl``, one per logging step,
and ``TrainerState.log_history``, the same dicts), so it is a pure function: the training stage runs it at every
logging step, and the report runs it again on each published run's ``metrics.jsonl``.

The signals of a row:
- ``reward`` and ``entropy``: TRL's means over the logging window (TRL logs no reward, None, for a step that reused
  an earlier generation: ``num_iterations`` > 1); ``grad_norm``: the HF Trainer's, before clipping;
- ``weight_growth``: the global L2 norm of the trainable weights at the logging step (``weight_norm``, logged beside
  it) over that of the start model (pipeline.training.collapse_guard). The L2 norm rather than max |w|: it measures
  the whole model, so one outlier weight (the gains of a norm layer) neither sets the reference nor hides the
  rest; it is scale-free across model sizes; and a growth factor of it means the same for the tiny and the 8 B
  models. At a wrecking learning rate every weight moves by about the learning rate per Adam step, so it grows as
  fast as max |w| does (the warmed-up test model, one step at learning rate 33: 455x).

The checks (``HealthConfig``: the config's ``health`` section, a run-time setting, pipeline.runtime.settings):
- flat: over the last ``flat_window`` logged rows, each of reward, entropy and gradient norm stays within
  ``flat_tolerance`` (max - min over its values in the window; all zero is flat). All three at once: a live policy
  samples varying completions, so its entropy moves even when no group has a reward spread (gradient norm 0,
  reward 0 or 1 throughout, which healthy runs show for a few steps). A signal with no value in the window is not
  flat (an unlogged signal cannot trip the check).
- weights: ``weight_growth`` reaches the ``weight_growth`` threshold (the weights' norm is that many times its
  start value). It catches what the flat check cannot: in the quick study at ``learning_rate: 100`` the gradient
  norm is 0.0 from the first step, but Adam's momentum keeps moving the weights (3413x at step 2, 10806x at step
  20), and from step 8 the entropy climbs to 4.5 as the policy turns to noise, so no window stays flat; the weights
  check stops that run at its first logged step.

Where the healthy state ends (``Trip.healthy_through``, the last step whose weights count as healthy; the training
stage keeps no checkpoint after it as resumable): for the weights, the previous logged step (its norm was below the
threshold); for a flat window whose first row is at step s, after the row at step p (p = s - L, L the logging
interval), the weights from step p on made the flat rows (step p + 1 sampled from them), and the row at p averages
steps p - L + 1 .. p, of which only the first is known to have sampled live weights: p - L.

Near (the report lists such runs): within 2x of a threshold, on each check's own quantity: a flat streak of at
least half the window (and at least 2 rows), a window whose largest spread is at most twice the tolerance, or a
growth beyond 1 of at least half the threshold's (``weight_growth`` 2: at 1.5).

No third-party imports (the report and the run-time settings import it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.core.declared import Range, refuse_out_of_range, setting
from pipeline.core.io import InputError

# The signals of the flat check, with the words the messages use.
FLAT_SIGNALS = {"reward": "reward", "entropy": "entropy", "grad_norm": "gradient norm"}
WEIGHT_NORM_KEY = "weight_norm"  # global L2 norm of the trainable weights at the logging step
WEIGHT_GROWTH_KEY = "weight_growth"  # WEIGHT_NORM_KEY over the start model's
VERDICTS = ("tripped", "near", "healthy", "off")


@dataclass(frozen=True)
class HealthConfig:
    """The training health check: at every logging step, a run whose reward, entropy and gradient norm all stay flat
    (within flat_tolerance, zero included) for flat_window logged steps, or whose weights' L2 norm reaches
    weight_growth times the start model's, has collapsed: it stops with exit 80 (final: a retry exits at once),
    naming the step, the check and the last healthy checkpoint, and keeps no checkpoint of the collapsed state as
    resumable (they are set aside like stale checkpoints). The report lists runs that came within 2x of a
    threshold. Run-time settings: changing them reruns no training, only the report. docs/troubleshooting.md

    The ``health`` section of the study config, declared here (``pipeline.core.declared``); it reaches a training
    job with the run-time settings (pipeline.runtime.settings).

    The defaults trip none of the logged runs of the default, ablation and SmolLM2 studies (docs/troubleshooting.md):
    over any 5 logged steps the liveliest of the three signals moved at least 0.05 (entropy alone 0.0022; tolerance
    1e-6), no two consecutive rows were flat, and the weights grew at most 1.0034x in 250 steps. A window of 2 would
    be thin: healthy rows repeat reward and gradient norm exactly, and entropy moved as little as 2.3e-5."""

    enabled: bool = setting(True, "false switches the check off (the weight norm is still logged)")
    # one row is always "flat" (no spread); a growth threshold at or below 1 would stop every run at its start
    flat_window: int = setting(
        5,
        "logged steps (rows of metrics.jsonl, not optimizer steps) over which reward, entropy and gradient norm "
        "must all stay flat to trip",
        Range(minimum=2),
    )
    flat_tolerance: float = setting(
        1e-6, "the largest spread (max - min over the window) of a signal that counts as flat", Range(minimum=0)
    )
    weight_growth: float = setting(
        2.0,
        "trip when the global L2 norm of the trainable weights reaches this many times the start model's (healthy "
        "runs of the tiny study: 1.0034 after 250 steps)",
        Range(exclusive_minimum=1),
    )

    def __post_init__(self) -> None:
        refuse_out_of_range(self, "health")
        if not math.isfinite(self.flat_tolerance):
            raise InputError(f"health.flat_tolerance: invalid value {self.flat_tolerance!r} (must be finite)")


@dataclass(frozen=True)
class Trip:
    """One check that tripped at the logged ``step``: which (``check``: flat or weights), what it saw (``what``),
    and the last step whose weights count as healthy (module docstring)."""

    step: int
    check: str
    what: str
    healthy_through: int

    def record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def value(row: Mapping[str, Any], key: str) -> float | None:
    """``row[key]`` as a finite float; None when the row does not log it (absent, None, not a number, non-finite)."""
    found = row.get(key)
    if isinstance(found, bool) or not isinstance(found, int | float) or not math.isfinite(found):
        return None
    return float(found)


def training_rows(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows of logged training steps (not the end-of-run summary, nor anything else without the signals)."""
    return [row for row in rows if any(key in row for key in (*FLAT_SIGNALS, WEIGHT_GROWTH_KEY))]


def spreads(window: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Max - min of each flat signal over the rows of ``window`` that log it; None for a signal none of them logs."""
    found: dict[str, float | None] = {}
    for key in FLAT_SIGNALS:
        values = [v for row in window if (v := value(row, key)) is not None]
        found[key] = max(values) - min(values) if values else None
    return found


def is_flat(window: Sequence[Mapping[str, Any]], tolerance: float) -> bool:
    """Whether every flat signal stays within ``tolerance`` over ``window`` (a signal it never logs does not)."""
    return all(spread is not None and spread <= tolerance for spread in spreads(window).values())


def largest_spread(window: Sequence[Mapping[str, Any]]) -> float:
    """The spread of the liveliest signal of ``window`` (inf when a signal is not logged): the flat check trips when
    it is at most the tolerance."""
    return max(math.inf if spread is None else spread for spread in spreads(window).values())


def _ranges(window: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for key, words in FLAT_SIGNALS.items():
        values = [v for row in window if (v := value(row, key)) is not None]
        parts.append(f"{words} {min(values):.3g}" + (f" to {max(values):.3g}" if max(values) != min(values) else ""))
    return ", ".join(parts)


def flat_trip(rows: Sequence[Mapping[str, Any]], index: int, config: HealthConfig) -> Trip | None:
    """The flat check over the ``flat_window`` training rows that end at ``rows[index]``."""
    start = index - config.flat_window + 1
    if start < 0:
        return None
    window = rows[start : index + 1]
    if not is_flat(window, config.flat_tolerance):
        return None
    first = int(window[0]["step"])
    if start == 0:
        healthy_through = 0
    else:
        previous = int(rows[start - 1]["step"])
        healthy_through = max(previous - (first - previous), 0)
    what = (
        f"reward, entropy and gradient norm flat for {config.flat_window} logged steps "
        f"(steps {first}-{int(window[-1]['step'])}: {_ranges(window)}; "
        f"health.flat_window {config.flat_window}, health.flat_tolerance {config.flat_tolerance:g})"
    )
    return Trip(int(rows[index]["step"]), "flat", what, healthy_through)


def weights_trip(rows: Sequence[Mapping[str, Any]], index: int, config: HealthConfig) -> Trip | None:
    """The weights check on ``rows[index]``."""
    growth = value(rows[index], WEIGHT_GROWTH_KEY)
    if growth is None or growth < config.weight_growth:
        return None
    earlier = [int(row["step"]) for row in rows[:index] if value(row, WEIGHT_GROWTH_KEY) is not None]
    norm = value(rows[index], WEIGHT_NORM_KEY)
    size = f"weight norm {norm:.4g}, " if norm is not None else "weight norm "
    start = f" {norm / growth:.4g}" if norm is not None else ""
    what = f"{size}{growth:.4g}x its start{start} (health.weight_growth {config.weight_growth:g})"
    return Trip(int(rows[index]["step"]), "weights", what, earlier[-1] if earlier else 0)


def trips_at(rows: Sequence[Mapping[str, Any]], index: int, config: HealthConfig) -> list[Trip]:
    """The checks that trip at training row ``rows[index]`` (``rows``: ``training_rows``, in order)."""
    if not config.enabled:
        return []
    return [trip for check in (flat_trip, weights_trip) if (trip := check(rows, index, config)) is not None]


def latest_trips(rows: Sequence[Mapping[str, Any]], config: HealthConfig) -> list[Trip]:
    """The checks that trip at the last training row of ``rows`` (what the training stage asks at each log)."""
    training = training_rows(rows)
    return trips_at(training, len(training) - 1, config) if training else []


def first_trips(rows: Sequence[Mapping[str, Any]], config: HealthConfig) -> list[Trip]:
    """The checks that trip at the first training row of ``rows`` where any does; [] for a healthy run."""
    training = training_rows(rows)
    for index in range(len(training)):
        if trips := trips_at(training, index, config):
            return trips
    return []


def healthy_through(trips: Sequence[Trip]) -> int:
    """The last step whose weights every one of ``trips`` counts as healthy."""
    return min(trip.healthy_through for trip in trips)


def describe(trips: Sequence[Trip]) -> str:
    """The trips of one step, for a log line: ``step N: what; what``."""
    return f"step {trips[0].step}: " + "; ".join(trip.what for trip in trips)


def longest_flat_streak(rows: Sequence[Mapping[str, Any]], tolerance: float) -> tuple[int, int | None, int | None]:
    """(rows, first step, last step) of the longest run of consecutive training rows that ``is_flat``; (0, None,
    None) when no single row logs all three signals."""
    best: tuple[int, int | None, int | None] = (0, None, None)
    for start in range(len(rows)):
        end = start
        while end < len(rows) and is_flat(rows[start : end + 1], tolerance):
            end += 1
        if end - start > best[0]:
            best = (end - start, int(rows[start]["step"]), int(rows[end - 1]["step"]))
    return best


def summary(rows: Sequence[Mapping[str, Any]], config: HealthConfig) -> dict[str, Any]:
    """The check over a whole run: its verdict (``VERDICTS``; ``off`` when not enabled), the first trip, why it came
    near, and each check's margin: the longest flat streak, the smallest largest-spread of any ``flat_window`` rows
    (and where), the largest weight growth (and where; None for rows that do not log it)."""
    training = training_rows(rows)
    streak, streak_from, streak_to = longest_flat_streak(training, config.flat_tolerance)
    windows = [
        (
            largest_spread(training[start : start + config.flat_window]),
            int(training[start + config.flat_window - 1]["step"]),
        )
        for start in range(len(training) - config.flat_window + 1)
    ]
    least = min(windows, key=lambda found: found[0], default=None)
    growths = [(growth, int(row["step"])) for row in training if (growth := value(row, WEIGHT_GROWTH_KEY)) is not None]
    most = max(growths, key=lambda found: found[0], default=None)
    near = []
    if config.enabled and streak >= max(2, math.ceil(config.flat_window / 2)):
        near.append(f"flat for {streak} logged steps (steps {streak_from}-{streak_to}; window {config.flat_window})")
    if config.enabled and least is not None and least[0] <= 2 * config.flat_tolerance:
        near.append(f"largest spread {least[0]:.3g} over the window ending at step {least[1]} "
                    f"(tolerance {config.flat_tolerance:g})")  # fmt: skip
    if config.enabled and most is not None and most[0] - 1 >= (config.weight_growth - 1) / 2:
        near.append(f"weight growth {most[0]:.4g}x at step {most[1]} (threshold {config.weight_growth:g})")
    trips = first_trips(training, config)
    verdict = "off" if not config.enabled else "tripped" if trips else "near" if near else "healthy"
    return {
        "verdict": verdict,
        "thresholds": dataclasses.asdict(config),
        "rows": len(training),
        "trips": [trip.record() for trip in trips],
        "near": near,
        "flat": {
            "longest_streak": streak,
            "streak_steps": [streak_from, streak_to] if streak else None,
            "least_largest_spread": None if least is None or math.isinf(least[0]) else least[0],
            "least_largest_spread_step": None if least is None or math.isinf(least[0]) else least[1],
        },
        "weights": None if most is None else {"max_growth": most[0], "step": most[1]},
    }
