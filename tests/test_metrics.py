"""bench_serving's metrics (bench/metrics.py): the peak-per-second figures, computed a group of requests
at a time, against the plain per-request definition."""

from __future__ import annotations

import math
import random

import numpy as np

from kvadmit.bench.metrics import RequestOutcome, calculate_metrics, peak_per_second


def _outcome(start: float, ttft: float, itl: list[float], latency: float, ok: bool = True) -> RequestOutcome:
    return RequestOutcome(prompt_len=1, success=ok, start_time=start, ttft=ttft, latency=latency, itl=itl)


def plain_peak(outcomes: list[RequestOutcome]) -> tuple[float, int]:
    """The definition, one token at a time: its time is start + TTFT plus the gaps so far, added in
    order; its bucket is the whole seconds since the first send. A request is open in every bucket
    from the one it was sent in to the one it ended in."""
    ok = [o for o in outcomes if o.success]
    t0 = min(o.start_time for o in ok)
    buckets = math.ceil(max(o.start_time + o.latency for o in ok) - t0) + 1
    tokens, open_requests = [0] * buckets, [0] * buckets
    for o in ok:
        t = o.start_time + o.ttft
        times = [t]
        for gap in o.itl:
            t = t + gap
            times.append(t)
        for x in times:
            if 0 <= int(x - t0) < buckets:
                tokens[int(x - t0)] += 1
        for b in range(int(o.start_time - t0), min(int(o.start_time + o.latency - t0) + 1, buckets)):
            open_requests[b] += 1
    return float(max(tokens)), max(open_requests)


def test_tokens_land_in_the_bucket_their_summed_gaps_reach() -> None:
    # Ten gaps of 0.1 add up to 0.9999999999999999, not 1.0: all eleven tokens are in the first second.
    # A second request (sent at 0.5, first token at 1.5) is open in buckets 0 and 1; a failed one counts
    # nowhere.
    outcomes = [
        _outcome(0.0, 0.0, [0.1] * 10, 1.0),
        _outcome(0.5, 1.0, [], 1.0),
        _outcome(0.0, 0.0, [0.01] * 500, 9.0, ok=False),
    ]
    assert sum([0.1] * 10) < 1.0
    assert peak_per_second(outcomes) == (11.0, 2)
    assert plain_peak(outcomes) == (11.0, 2)


def test_grouped_sums_equal_the_per_request_definition() -> None:
    rng = random.Random(5)
    for _ in range(200):
        outcomes = []
        for _ in range(rng.randint(1, 30)):
            n = rng.choice([0, 1, 2, rng.randint(0, 40)])
            gaps = [rng.choice([0.1, 0.02, 1 / 3, rng.uniform(0, 0.5)]) for _ in range(n)]
            start = rng.uniform(0, 20)
            ttft = rng.uniform(0, 2)
            itl = (
                gaps if rng.random() < 0.5 else np.array(gaps)
            )  # the bench client's lists, the simulator's arrays
            outcomes.append(
                _outcome(start, ttft, itl, ttft + sum(gaps) + rng.uniform(0, 0.1), rng.random() < 0.9)
            )
        if not any(o.success for o in outcomes):
            continue
        assert peak_per_second(outcomes) == plain_peak(outcomes)


def test_itl_figures_are_over_every_gap_and_leave_the_outcomes_alone() -> None:
    rng = random.Random(8)
    outcomes = [
        _outcome(float(i), 0.5, np.array([rng.uniform(0, 0.1) for _ in range(rng.randint(0, 50))]), 9.0)
        for i in range(40)
    ]
    before = [o.itl.copy() for o in outcomes]  # type: ignore[union-attr]
    every = np.concatenate(before)
    itl = calculate_metrics(outcomes, 50.0).itl_ms
    assert itl["mean"] == float(np.mean(every)) * 1000 and itl["max"] == float(np.max(every)) * 1000
    p50, p90, p95, p99 = np.percentile(every, [50, 90, 95, 99])
    assert [itl["median"], itl["p90"], itl["p95"], itl["p99"]] == [
        float(p) * 1000 for p in (p50, p90, p95, p99)
    ]
    assert all(np.array_equal(o.itl, b) for o, b in zip(outcomes, before, strict=True))
