"""The training health check as a pure function of the logged rows (pipeline.runtime.health): known answers on the
issue's collapse, on TRL's rows without a reward, on the healthy point of each check, on the near rules, and a
property: a run of flat rows trips exactly when it reaches the window, never earlier, with the healthy point before
it. (Checked by breaking it: with one signal enough to call a window flat, the healthy rows here trip; with a
missing reward counted as flat, the unlogged-signal case trips; with the healthy point at the window's first row,
the known answers fail.)"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.io import InputError
from pipeline.runtime.health import HealthConfig, first_trips, latest_trips, summary

DEFAULT = HealthConfig()


def row(step: int, reward: float | None, entropy: float, grad_norm: float, growth: float = 1.0) -> dict:
    return {"step": step, "loss": 0.0, "grad_norm": grad_norm, "reward": reward, "entropy": entropy,
            "weight_norm": 50.0 * growth, "weight_growth": growth}  # fmt: skip


def live(step: int) -> dict:
    return row(step, 0.5, 0.3 + 0.01 * step, 0.2)


def the_issues_run() -> list[dict]:
    """Steps 1-3 alive, then reward, loss, gradient norm and entropy 0.0 from step 4 on; the summary row last."""
    return [
        live(1),
        live(2),
        live(3),
        *(row(step, 0.0, 0.0, 0.0) for step in range(4, 11)),
        {"step": 10, "train_loss": 0.1},
    ]


def test_the_issues_collapse_trips_the_flat_check_once_the_window_is_full():
    (trip,) = first_trips(the_issues_run(), DEFAULT)
    assert (trip.step, trip.check, trip.healthy_through) == (8, "flat", 2)  # rows 4-8; row 3 sampled step 2's weights
    assert trip.what.startswith("reward, entropy and gradient norm flat for 5 logged steps (steps 4-8: reward 0,")
    assert latest_trips(the_issues_run()[:7], DEFAULT) == []  # rows 4-7: one short
    assert [t.step for t in latest_trips(the_issues_run()[:8], DEFAULT)] == [8]


def test_the_healthy_point_of_a_flat_window_is_one_logging_interval_before_the_last_live_row():
    rows = [live(5), live(10), *(row(step, 0.0, 0.0, 0.0) for step in range(15, 40, 5))]
    (trip,) = first_trips(rows, DEFAULT)
    assert (trip.step, trip.healthy_through) == (
        35,
        5,
    )  # row 10 averages steps 6-10: only step 5's weights are known live


def test_a_run_flat_from_its_first_row_has_no_healthy_step():
    assert first_trips([row(step, 0.0, 0.0, 0.0) for step in range(1, 6)], DEFAULT)[0].healthy_through == 0


def test_one_live_signal_keeps_the_run_healthy():
    # a hopeless model: no reward, no gradient, but its samples vary (entropy moves)
    stuck = [row(step, 0.0, 2.0 + 1e-3 * (step % 2), 0.0) for step in range(1, 30)]
    assert first_trips(stuck, DEFAULT) == [] and summary(stuck, DEFAULT)["verdict"] == "healthy"
    assert summary(stuck, DEFAULT)["flat"]["least_largest_spread"] == pytest.approx(1e-3)


def test_a_step_without_a_reward_neither_breaks_nor_makes_a_flat_window():
    # num_iterations 2: TRL logs the reward of every other step only
    rows = [live(1), *(row(step, None if step % 2 else 0.0, 0.0, 0.0) for step in range(2, 12))]
    assert [trip.step for trip in first_trips(rows, DEFAULT)] == [6]
    never = [row(step, None, 0.0, 0.0) for step in range(1, 12)]  # a signal never logged cannot trip
    assert first_trips(never, DEFAULT) == []


def test_the_weights_check_trips_at_its_factor_with_the_previous_row_healthy():
    rows = [row(1, 0.5, 0.3, 0.2, 1.0), row(2, 0.5, 0.31, 0.2, 1.9), row(3, 0.4, 0.32, 0.2, 2.0)]
    (trip,) = first_trips(rows, DEFAULT)
    assert (trip.step, trip.check, trip.healthy_through) == (3, "weights", 2)
    assert trip.what == "weight norm 100, 2x its start 50 (health.weight_growth 2)"
    assert first_trips([rows[0], row(2, 0.5, 0.3, 0.2, 400.0)], DEFAULT)[0].healthy_through == 1
    assert first_trips([row(1, 0.5, 0.3, 0.2, 400.0)], DEFAULT)[0].healthy_through == 0


def test_near_is_within_2x_of_a_threshold_and_off_trips_nothing():
    near = [live(1), *(row(step, 0.0, 0.0, 0.0, 1.5) for step in range(2, 5)), live(5)]  # 3 flat rows of 5
    found = summary(near, DEFAULT)
    assert found["verdict"] == "near" and found["flat"]["longest_streak"] == 3
    assert found["near"] == [
        "flat for 3 logged steps (steps 2-4; window 5)",
        "weight growth 1.5x at step 2 (threshold 2)",
    ]
    assert summary([live(step) for step in range(1, 9)], DEFAULT)["verdict"] == "healthy"
    off = HealthConfig(enabled=False)
    assert first_trips(the_issues_run(), off) == [] and summary(the_issues_run(), off)["verdict"] == "off"
    tripped = summary(the_issues_run(), DEFAULT)
    assert tripped["verdict"] == "tripped" and tripped["trips"][0]["step"] == 8 and tripped["rows"] == 10


@pytest.mark.parametrize(
    "values", [{"flat_window": 1}, {"flat_tolerance": -1.0}, {"weight_growth": 1.0}], ids=lambda v: next(iter(v))
)
def test_thresholds_that_would_trip_every_run_are_refused(values):
    with pytest.raises(InputError, match=f"health.{next(iter(values))}"):
        HealthConfig(**values)


@given(
    alive=st.integers(min_value=1, max_value=8),
    flat=st.integers(min_value=0, max_value=12),
    window=st.integers(min_value=2, max_value=6),
    level=st.floats(min_value=0.0, max_value=3.0),
)
def test_a_flat_stretch_trips_exactly_when_it_fills_the_window(alive, flat, window, level):
    config = HealthConfig(flat_window=window)
    rows = [live(step) for step in range(1, alive + 1)]
    rows += [row(step, level / 3, level, level) for step in range(alive + 1, alive + flat + 1)]
    trips = first_trips(rows, config)
    if flat < window:
        assert trips == []
    else:
        (trip,) = trips
        assert trip.step == alive + window and trip.healthy_through == alive - 1 < alive + 1
