"""When requests arrived, from a log alone (the workload's first figure; reconstruct_workload.py has the
rest). Between two batch lines the queue changes by arrivals + retracted − admitted, and every admitted
request shows in a Prefill line's #new-seq, so arrivals = Δ#queue-req + Σ #new-seq − Σ #retracted_reqs.
Their running total, kept from going back, gives the arrival times; within a whole-second stamp, evenly
or at random as the per-second counts say (arrival_dispersion)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np

from kvadmit.doctor.inferred import Inferred
from kvadmit.doctor.observed import Decode, Prefill, Retract
from kvadmit.doctor.reconstruct_workload import Start

# Per-second arrival counts whose variance is at least this share of their mean come from a random
# process (a Poisson one's is 1; evenly spaced arrivals' at most ¼ ÷ rate): arrival_dispersion.
RANDOM_DISPERSION = 0.5
MIN_SECONDS = 10  # whole seconds of arrivals needed to tell


@dataclass(slots=True)
class Arrivals:
    times: list[float] = field(default_factory=list)  # absolute seconds
    rate: Inferred[float] = field(default_factory=lambda: Inferred(0.0, "", "guess"))


def refined_times(events: list[Decode | Prefill | Retract], resolution: float) -> list[float]:
    """Each event's time within its timestamp: lines stamped with the same whole second happened within
    that second, in the log's order, so the k-th of m gets T + (k + ½) ÷ m (no change at a finer
    resolution)."""
    if resolution <= 0:
        return [e.t for e in events]
    out: list[float] = []
    i = 0
    while i < len(events):
        j = i
        while j < len(events) and events[j].t == events[i].t:
            j += 1
        m = j - i
        out += [events[i].t + resolution * (k + 0.5) / m for k in range(m)]
        i = j
    return out


def infer_arrivals(
    events: list[Decode | Prefill | Retract],
    start: Start,
    span_s: float,
    resolution: float = 0.0,
    seed: int = 0,
) -> Arrivals:
    net = 0  # admitted − retracted since the start
    emitted = 0
    when = refined_times(events, resolution)
    t_prev = when[0] if when else start.t
    times: list[float] = []
    seen: list[tuple[float, int]] = []  # (the observing line's stamp, arrivals it shows)
    for e, t in zip(events, when, strict=True):
        if isinstance(e, Retract):
            net -= e.count
            continue
        if isinstance(e, Prefill):
            net += e.new_seq
        if e.queue is None:
            continue
        new = net + (e.queue - start.queue) - emitted
        if new > 0:  # spread evenly over the interval since the last observation
            gap = t - t_prev
            times += [t_prev + gap * (k + 1) / (new + 1) if gap > 0 else t for k in range(new)]
            emitted += new
            seen.append((e.t, new))
        t_prev = t
    rate, over = arrival_rate(times, span_s, resolution)
    how = f"{over}: Δ#queue-req + Σ #new-seq − Σ #retracted_reqs between batch lines"
    dispersion = arrival_dispersion(seen, resolution)
    if dispersion is not None and dispersion >= RANDOM_DISPERSION:
        times = random_within_seconds(times, resolution, seed)
        how += (
            f"; at random within their second (the per-second counts' variance is {dispersion:.2f} × their "
            "mean, as a Poisson process's: 1)"
        )
    return Arrivals(times, Inferred(rate, how, "estimate" if len(times) >= 3 else "guess"))


def per_second_counts(seen: list[tuple[float, int]], resolution: float) -> list[int]:
    """Arrivals shown by the lines of each whole stamp (of `resolution` seconds), for every stamp strictly
    between the first and the last that show any (the partial ones at either end left out; a stamp with
    no line counts 0). `seen`: (a line's stamp, the arrivals it shows), in order."""
    shown = [(int(t // resolution), n) for t, n in seen if n > 0] if resolution > 0 else []
    if not shown:
        return []
    first, last = shown[0][0], shown[-1][0]
    counts = [0] * max(last - first - 1, 0)
    for k, n in shown:
        if first < k < last:
            counts[k - first - 1] += n
    return counts


def arrival_dispersion(seen: list[tuple[float, int]], resolution: float) -> float | None:
    """The per-second arrival counts' variance ÷ mean (the index of dispersion), or None when fewer than
    MIN_SECONDS whole seconds (or no arrival) tell.

    Why: the whole-second stamps hide when in its second a request came, and where requests come close
    together the tail of TTFT is made (two in one decode step are prefilled as a batch of two, one that
    comes while another is prefilled waits for it). Evenly spaced arrivals never come close at 16 a
    second (62 ms apart against a 5 ms step); a Poisson process's do (8% within 5 ms). The counts per
    second tell them apart: a Poisson process's vary with variance equal to their mean (dispersion 1,
    give or take √(2 ÷ seconds)); evenly spaced arrivals at rate r come ⌊r⌋ or ⌈r⌉ a second, variance
    f (1 − f) for f = r − ⌊r⌋, at most ¼ ÷ r of the mean (under 0.5 from r = ½ a second on). Counted by
    the stamp of the line that shows them: the even spread between lines would split a stamp's arrivals
    with the one before and smooth a burst away."""
    counts = per_second_counts(seen, resolution)
    if len(counts) < MIN_SECONDS:
        return None
    mean = statistics.fmean(counts)
    return statistics.pvariance(counts) / mean if mean > 0 else None


def random_within_seconds(times: list[float], resolution: float, seed: int) -> list[float]:
    """Each stamp's arrivals placed at independent uniform random points of it, in order: given how many
    came in an interval, that is where a Poisson process puts them. The count in every stamp is kept."""
    rng = np.random.RandomState(seed)
    out: list[float] = []
    i = 0
    while i < len(times):
        stamp = times[i] // resolution
        j = i
        while j < len(times) and times[j] // resolution == stamp:
            j += 1
        out += sorted((stamp + u) * resolution for u in rng.random_sample(j - i).tolist())
        i = j
    return out


def arrival_rate(times: list[float], span_s: float, resolution: float) -> tuple[float, str]:
    """Requests a second while they arrive, and over what. With whole-second stamps, the arrivals within
    the whole seconds strictly between the first and the last arrival's (where they arrived all second
    long), so that the partial seconds at either end do not count; otherwise n arrivals span n − 1 gaps.
    Over the window when there are few, or when they come within a few timestamps."""
    n = len(times)
    if resolution >= 1.0 and n >= 3:
        first, last = int(times[0] // resolution), int(times[-1] // resolution)
        if last - first >= 3:
            inside = sum(1 for t in times if first < t // resolution < last)
            seconds = (last - first - 1) * resolution
            return (
                inside / seconds,
                f"{inside:,} arrivals in the {seconds:.0f} s between the first and the last",
            )
    arriving = times[-1] - times[0] if n >= 3 else 0.0
    if arriving >= 3 * max(resolution, 0.1):
        return (n - 1) / arriving, f"{n:,} arrivals over {arriving:.0f} s"
    return (n / span_s if span_s > 0 else 0.0), f"{n:,} arrivals over the {span_s:.0f} s window"
