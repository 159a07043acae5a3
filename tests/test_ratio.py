"""The new-token ratio (docs/sglang-rules.md §2): init, floor, decay, reset, post-retraction estimate."""

from __future__ import annotations

import pytest

from kvadmit.config import SchedulerKnobs
from kvadmit.scheduler.ratio import NewTokenRatio, ratio_after_retract


def test_defaults_start_at_0_7_floor_at_0_098_and_decay_over_600_steps() -> None:
    r = NewTokenRatio.from_config(1.0, SchedulerKnobs())
    assert r.init == pytest.approx(0.7)
    assert r.min == pytest.approx(0.098)
    assert r.decay == pytest.approx((0.7 - 0.098) / 600)
    assert r.current == r.init


def test_decay_is_linear_and_stops_at_the_floor() -> None:
    r = NewTokenRatio.from_config(1.0, SchedulerKnobs())
    r.decay_step()
    assert r.current == pytest.approx(0.7 - 0.602 / 600)
    for _ in range(299):
        r.decay_step()
    assert r.current == pytest.approx(0.7 - 0.602 / 2)
    for _ in range(1000):
        r.decay_step()
    assert r.current == pytest.approx(0.098)


def test_conservativeness_scales_the_start_and_clamps_at_one() -> None:
    r = NewTokenRatio.from_config(1.3, SchedulerKnobs())
    assert r.init == pytest.approx(0.91)
    assert r.min == pytest.approx(0.91 * 0.14)
    r = NewTokenRatio.from_config(2.0, SchedulerKnobs())
    assert r.init == 1.0
    assert r.min == pytest.approx(0.14)


def test_reset_returns_to_the_initial_ratio() -> None:
    r = NewTokenRatio.from_config(1.0, SchedulerKnobs())
    for _ in range(10):
        r.decay_step()
    r.reset()
    assert r.current == pytest.approx(0.7)


def test_estimate_after_retract_counts_outputs_plus_20_per_request() -> None:
    # SGLang's own unit test: (5 + 3 + 20·2) / (100 + 50 + 1) = 48/151.
    assert ratio_after_retract([5, 3], [100, 50], 20) == pytest.approx(48 / 151)
    # The example: four remaining requests, 140 outputs, max_new 400 each → 220/1601.
    assert ratio_after_retract([40, 35, 35, 30], [400] * 4, 20) == pytest.approx(0.137414, abs=5e-7)


def test_estimate_is_capped_at_one_and_zero_when_nothing_remains() -> None:
    assert ratio_after_retract([90], [100], 20) == 1.0
    assert ratio_after_retract([], [], 20) == 0.0
