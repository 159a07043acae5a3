"""Issue 21: where in its whole-second stamp each inferred arrival is placed, and the log's own seed for
the draws of what the log does not show. Expected values worked out by hand from the rules
(arrivals.arrival_dispersion, random_within_seconds; reconstruct.log_seed;
resimulate.build_replay)."""

from __future__ import annotations

import zlib
from dataclasses import replace
from pathlib import Path

import pytest

from kvadmit.doctor.arrivals import (
    arrival_dispersion,
    infer_arrivals,
    per_second_counts,
    random_within_seconds,
)
from kvadmit.doctor.observed import observe_lines, read_observed
from kvadmit.doctor.reconstruct import Reconstruction, log_seed, reconstruct
from kvadmit.doctor.reconstruct_workload import (
    Start,
    window_events,
)
from kvadmit.doctor.resimulate import build_replay


def test_the_counts_are_per_stamp_of_the_line_that_shows_them_between_the_first_and_last() -> None:
    # Lines at 10.0 (3), 11.0 (2) and 11.0 (1), none at 12.0, 13.0 (4), 14.0 (0), 15.0 (5): the whole
    # stamps strictly between the first (10) and the last (15) that show any are 11–14: 3, 0, 4, 0.
    seen = [(10.0, 3), (11.0, 2), (11.0, 1), (13.0, 4), (14.0, 0), (15.0, 5)]
    assert per_second_counts(seen, 1.0) == [3, 0, 4, 0]
    assert per_second_counts([], 1.0) == []
    assert per_second_counts(seen, 0.0) == []  # sub-second stamps: nothing to count per second


def test_evenly_spaced_arrivals_disperse_little_and_bursts_much() -> None:
    # 2.5 a second, evenly: 2 and 3 by turns over 12 whole seconds, mean 2.5, variance 0.25: 0.1.
    even = [(0.0, 3)] + [(float(k), 2 if k % 2 else 3) for k in range(1, 13)] + [(13.0, 2)]
    assert arrival_dispersion(even, 1.0) == pytest.approx(0.25 / 2.5)
    # Bursts of 4 every other second: 0, 4, 0, 4, … mean 2, variance 4: 2.
    bursts = [(0.0, 4)] + [(float(k), 0 if k % 2 else 4) for k in range(1, 13)] + [(13.0, 4)]
    assert arrival_dispersion(bursts, 1.0) == pytest.approx(4.0 / 2.0)
    # Nine whole seconds do not tell (MIN_SECONDS is 10).
    assert arrival_dispersion([*even[:10], (10.0, 1)], 1.0) is None


def test_placed_at_random_each_stamp_keeps_its_count_and_its_order() -> None:
    times = [3.1, 3.5, 3.9, 4.5, 6.2, 6.25, 6.3]
    placed = random_within_seconds(times, 1.0, seed=7)
    assert [int(t) for t in placed] == [3, 3, 3, 4, 6, 6, 6]
    assert placed == sorted(placed)
    assert placed == random_within_seconds(times, 1.0, seed=7)  # the same seed, the same places
    assert placed != random_within_seconds(times, 1.0, seed=8)


def queue_line(t: int, queue: int) -> str:
    return (
        f"[2026-09-13 16:06:{t:02d}] Decode batch, #running-req: 4, #token: 900, token usage: 0.10, "
        f"cuda graph: False, gen throughput (token/s): 200.00, #queue-req: {queue}"
    )


def arrivals_of(queues: list[int]) -> tuple[list[float], str]:
    """The arrivals inferred from one Decode line a second with these queues and nothing admitted."""
    obs = observe_lines([queue_line(t, q) for t, q in enumerate(queues)])
    events = window_events(obs, obs.times[0], obs.times[-1])
    start = Start(events[0].t, 4, 900, queues[0])
    got = infer_arrivals(events, start, float(len(queues)), 1.0, seed=3)
    return got.times, got.rate.how


def test_poisson_like_counts_place_arrivals_at_random_and_even_ones_evenly() -> None:
    # Nothing is admitted, so each line's arrivals are its queue's growth. Bursts: 4 at the lines of the
    # odd seconds 1–15. Between the first and the last, seconds 2–14: six 4s and seven 0s, mean 24/13,
    # variance 96/13 − (24/13)² = 672/169, dispersion 672/169 ÷ 24/13 = 2.15 (≥ 0.5): random places.
    # Each stamp keeps the arrivals the spread between lines gave it: the 4 shown at second k (odd) are
    # spread over (k − ½, k + ½] at fifths, two in second k − 1 and two in k, so two in each of 0–15.
    bursty = [4 * ((k + 1) // 2) for k in range(16)]  # 0, 4, 4, 8, 8, …: 4 shown at every odd line
    times, how = arrivals_of(bursty)
    assert "at random within their second" in how and "2.15 × their mean" in how
    assert len(times) == 32 and times == sorted(times)
    base = int(times[0])
    assert [int(t) - base for t in times] == [k for k in range(16) for _ in range(2)]
    assert any(abs(t - (int(t) + 0.1)) > 1e-6 and abs(t - (int(t) + 0.3)) > 1e-6 for t in times)
    # Two a second, evenly: dispersion 0: the even spread between the lines (the interval from the
    # line before, at k − 1 + ½, to this one, at k + ½, holds them at its thirds).
    times, how = arrivals_of([2 * k for k in range(16)])
    assert "at random" not in how
    base = int(times[0])
    assert times[:2] == pytest.approx([base + 0.5 + 1 / 3, base + 0.5 + 2 / 3])


def test_the_log_seed_is_the_crc_of_its_batch_lines_and_differs_between_logs() -> None:
    lines = [queue_line(1, 0), queue_line(2, 3)]
    a = observe_lines(lines)
    texts = "".join(a.batch_texts).encode()
    assert log_seed(a) == zlib.crc32(texts) % 10**9  # CRC-32 chained line by line is that of them all
    assert log_seed(observe_lines(lines)) == log_seed(a)
    assert log_seed(observe_lines([queue_line(1, 0), queue_line(2, 4)])) != log_seed(a)


def test_the_draws_are_dealt_from_the_logs_own_seed() -> None:
    # build_replay's draw d takes its generators' seeds from seed + 10 d (SEEDS_PER_DRAW): the same log
    # deals the same arrangement, another seed another, and draw 1 of seed s is draw 0 of seed s + 10.
    log = Path(__file__).parent / "data" / "logs" / "04-sglang-q2-qwen3-4b-retraction-burst.log"
    rec = reconstruct(read_observed(str(log)))
    assert rec.seed == log_seed(read_observed(str(log)))

    def lengths(r: Reconstruction, draw: int = 0) -> list[int]:
        replay, _ = build_replay(r, draw=draw)
        return [q.output_len for q in replay.requests]

    assert lengths(rec) == lengths(replace(rec))
    assert lengths(replace(rec, seed=rec.seed + 1)) != lengths(rec)
    assert lengths(rec, draw=1) == lengths(replace(rec, seed=rec.seed + 10))
