"""A scenario whose simulated run retracts is simulated over several draws of what the log does not show
and its figures averaged (doctor/prove.py's _simulate, whatif.py's mean_outcome); one that does not
retract is simulated once. Figures here are hand-made."""

from __future__ import annotations

from typing import Any

import pytest

from kvadmit.doctor import prove
from kvadmit.doctor.whatif import Outcome, Scenario, Stats, mean_outcome

SCENARIO = Scenario("--schedule-conservativeness 1.3", "user", {"schedule_conservativeness": 1.3})


def _outcome(retracted: int) -> Outcome:
    stats = Stats(retracted * 2.0, 0.8, 10.0, 2000.0, [0.8, None], [10.0, None], [(0.0, 0.8, 10)], retracted)
    return Outcome(SCENARIO, "retraction-storm", stats, 100.0, 200.0, 6.0, 10)


def test_the_mean_outcome_averages_every_figure_and_keeps_the_first_draws_timeline() -> None:
    first = Outcome(
        SCENARIO, "retraction-storm",
        Stats(30.0, 0.8, 10.0, 2000.0, [0.8, None], [10.0, None], [(0.0, 0.8, 10)], 15),
        100.0, 200.0, 5.0, 10,
    )  # fmt: skip
    second = Outcome(
        SCENARIO, "retraction-occasional",
        Stats(20.0, 0.6, None, 1800.0, [0.6, 0.7], [None, None], [(1.0, 0.6, 3)], 10),
        None, 300.0, 7.0, 12,
    )  # fmt: skip
    got = mean_outcome([first, second])
    s = got.stats
    assert (s.retractions_per_min, s.retracted) == (25.0, 12.5)  # (30 + 20) ÷ 2, (15 + 10) ÷ 2
    assert s.usage_mean == pytest.approx(0.7) and s.throughput_mean == 1900.0
    assert s.queue_mean == 10.0  # the one draw that shows a queue
    assert s.usage_bins == [pytest.approx(0.7), 0.7] and s.queue_bins == [10.0, None]
    assert s.points == [(0.0, 0.8, 10)] and got.verdict == "retraction-storm"  # the first draw's
    assert (got.ttft_p50_ms, got.ttft_p99_ms, got.tpot_ms, got.finished) == (100.0, 250.0, 6.0, 11)
    assert got.draws == 2


def test_a_scenario_that_retracts_is_the_mean_of_four_draws_and_one_that_does_not_is_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    draws: list[int] = []
    counts = {0: 20, 1: 30, 2: 10, 3: 40}  # retracted in each draw

    def fake_run(
        rec: Any, label: str, overrides: dict[str, Any], budget: int | None = None, draw: int = 0
    ) -> int:
        draws.append(draw)
        return draw

    monkeypatch.setattr(prove, "run", fake_run)
    monkeypatch.setattr(prove, "outcome", lambda rec, s, sim, judge=True: _outcome(counts[sim]))
    got = prove._simulate(None, SCENARIO)  # type: ignore[arg-type]
    assert draws == [0, 1, 2, 3] and prove.DRAWS == 4
    assert got.stats.retracted == 25.0  # (20 + 30 + 10 + 40) ÷ 4
    draws.clear()
    monkeypatch.setattr(prove, "outcome", lambda rec, s, sim, judge=True: _outcome(0))
    got = prove._simulate(None, SCENARIO)  # type: ignore[arg-type]
    assert draws == [0] and got.stats.retracted == 0
