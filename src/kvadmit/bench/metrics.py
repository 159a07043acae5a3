"""bench_serving's metrics, with its definitions (docs/sglang-rules.md §7): computed from per-request
outcomes.

One request's outcome carries what the client saw: when it was sent, the time to its first non-empty
chunk, the gaps between later tokens, its end-to-end latency and the server's completion token count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)
class RequestOutcome:
    prompt_len: int
    success: bool = False
    output_len: int = 0  # the server's completion_tokens
    retokenized_output_len: int = 0
    start_time: float = 0.0  # when the client sent it (seconds, any epoch)
    arrival_time: float = 0.0  # when the client made it, before it waited for a --max-concurrency slot
    ttft: float = 0.0  # seconds to the first non-empty chunk
    latency: float = 0.0  # seconds to the last byte
    itl: Sequence[float] = field(default_factory=list)  # gaps between later tokens (per backend's split)
    error: str = ""
    cached_tokens: int = 0
    max_new_tokens: int = 0  # the token budget the request asked for (as sent, after --extra-request-body)
    ignore_eos: bool = False  # as sent
    priority: int | None = None  # the priority it sent (--priority-mix), None: none


@dataclass(frozen=True, slots=True)
class BenchmarkMetrics:
    completed: int
    total_input: int
    total_input_text: int
    total_output: int
    total_output_retokenized: int
    request_throughput: float
    input_throughput: float
    output_throughput: float
    total_throughput: float
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    concurrency: float
    e2e_ms: dict[str, float]  # mean, median, p90, p95, p99, std
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    itl_ms: dict[str, float]  # … and max


def _stats(values: Sequence[float], with_max: bool = False) -> dict[str, float]:
    """Mean, median, percentiles and standard deviation in ms; an empty list counts as [0], as
    bench_serving's `or 0` does."""
    arr = np.asarray(values, dtype=float) if len(values) else np.zeros(1)
    # np.median is the 50th percentile (linear interpolation), so one partition serves all four.
    p50, p90, p95, p99 = np.percentile(arr, [50, 90, 95, 99])
    return _ms(float(np.mean(arr)), (p50, p90, p95, p99), float(np.std(arr)), float(np.max(arr)), with_max)


def _ms(mean: float, pcts: Sequence[float], std: float, top: float, with_max: bool) -> dict[str, float]:
    p50, p90, p95, p99 = pcts
    out = {
        "mean": mean * 1000,
        "median": float(p50) * 1000,
        "p90": float(p90) * 1000,
        "p95": float(p95) * 1000,
        "p99": float(p99) * 1000,
        "std": std * 1000,  # population std (numpy's default), for the JSON line
    }
    if with_max:
        out["max"] = top * 1000
    return out


def _itl_stats(gaps: np.ndarray) -> dict[str, float]:
    """_stats of every ITL gap, with the max, without a temporary as large as the data (there may be
    hundreds of millions): the mean and max over the gaps in order, the percentiles from one partition,
    in place (this reorders `gaps`), and the standard deviation over the gaps as the partition left them,
    as this summary has always taken it."""
    if not len(gaps):
        return _stats(gaps, with_max=True)
    mean, top = float(np.mean(gaps)), float(np.max(gaps))
    pcts = np.percentile(gaps, [50, 90, 95, 99], overwrite_input=True)
    return _ms(mean, pcts, pairwise_std(gaps), top, with_max=True)


_LEAF = 1 << 15  # elements per leaf of pairwise_std (256 KiB of doubles: a cache-sized scratch)


def pairwise_std(a: np.ndarray) -> float:
    """np.std(a) (float64, contiguous), bit for bit, without its temporary (a - mean)² of a's size.
    numpy sums a float64 array pairwise (loops_utils.h): a range of more than 128 elements is split at
    half its length rounded down to a multiple of 8 and the halves' sums added; np.add.reduce of a
    contiguous array is 0.0 + that sum of the whole. So the sum of squares is taken by the same splits
    down to leaves of at most _LEAF elements, each squared into one small buffer and reduced by numpy
    (whose sum of a leaf is that leaf's pairwise sum: the same additions in the same order)."""
    n = len(a)
    mean = float(np.add.reduce(a)) / n  # _var's mean: the sum divided by the count
    buf = np.empty(min(n, _LEAF))
    return float(np.sqrt(_sq_dev_sum(a, mean, buf) / n))


def _sq_dev_sum(a: np.ndarray, mean: float, buf: np.ndarray) -> float:
    n = len(a)
    if n <= _LEAF:
        d = np.subtract(a, mean, out=buf[:n])
        np.multiply(d, d, out=d)
        return float(np.add.reduce(d))
    half = n // 2
    half -= half % 8
    return _sq_dev_sum(a[:half], mean, buf) + _sq_dev_sum(a[half:], mean, buf)


def peak_per_second(outcomes: Sequence[RequestOutcome]) -> tuple[float, int]:
    """(peak output tokens in a one-second bucket, peak requests open in a one-second bucket).

    Buckets are whole seconds from the first send. A token lands in the bucket of its arrival time
    (first token at start + TTFT, each later one after its ITL gap, summed in order as bench_serving
    does); a request counts in every bucket from the one it was sent in to the one it ended in.
    """
    ok = [o for o in outcomes if o.success]
    return _peak_per_second(ok, _all_gaps(ok))


def _all_gaps(ok: list[RequestOutcome]) -> np.ndarray:
    """Every request's ITL gaps, end to end, in order."""
    return np.concatenate([np.asarray(o.itl, dtype=float) for o in ok]) if ok else np.empty(0)


def _peak_per_second(ok: list[RequestOutcome], gaps: np.ndarray) -> tuple[float, int]:
    """peak_per_second over the successful requests, given _all_gaps(ok)."""
    if not ok:
        return 0.0, 0
    starts = np.array([o.start_time for o in ok], dtype=float)
    ends = starts + np.array([o.latency for o in ok], dtype=float)
    t0 = float(starts.min())
    buckets = math.ceil(float(ends.max()) - t0) + 1
    # int() truncates toward zero, as astype does (and every value here is ≥ 0).
    first = (starts - t0).astype(np.int64)
    last = np.minimum((ends - t0).astype(np.int64) + 1, buckets)
    open_requests = np.zeros(buckets + 1, dtype=np.int64)  # a difference array
    counted = first < last
    np.add.at(open_requests, first[counted], 1)
    np.add.at(open_requests, last[counted], -1)
    ttfts = np.array([o.ttft for o in ok], dtype=float)
    lens = np.array([len(o.itl) for o in ok], dtype=np.int64)
    # No time before t0 (then no bucket below 0) when no TTFT and no gap is negative: the sums only grow.
    plain = float(ttfts.min()) >= 0.0 and (not len(gaps) or float(gaps.min()) >= 0.0)
    tokens = _tokens_per_bucket(starts + ttfts, gaps, lens, t0, buckets, plain)
    return float(np.max(tokens)), int(np.max(np.cumsum(open_requests[:buckets])))


def _tokens_per_bucket(
    firsts: np.ndarray, gaps: np.ndarray, lens: np.ndarray, t0: float, buckets: int, plain: bool
) -> np.ndarray:
    """How many tokens land in each bucket: request i's token times are the running sums of [firsts[i],
    *its lens[i] gaps] (`gaps` holds every request's, end to end), its buckets the whole seconds since t0
    (truncated, as int() does); buckets outside [0, buckets) count nowhere.

    The requests with as many gaps are summed together: their gaps are rows of a sliding window over
    `gaps`, gathered into one matrix (no index matrix), the first gap of each row plus its first token
    time (the first addition of the running sum; IEEE addition is commutative, so the same double), then
    a running sum along the rows, in place: the floats a per-request cumsum gives, for a few numpy
    calls per group. `plain`: no time is below t0 (no bucket below 0; else each group is masked)."""
    tokens = np.zeros(buckets, dtype=np.int64)

    def count(times: np.ndarray) -> None:
        np.subtract(times, t0, out=times)
        b = times.astype(np.int64).ravel()
        if not plain:
            b = b[(b >= 0) & (b < buckets)]
        tokens[:] += np.bincount(b, minlength=buckets)[:buckets]  # (a bucket past the last is dropped)

    count(firsts.copy())  # every request's first token
    starts = np.cumsum(lens) - lens  # where each request's gaps start in `gaps`
    order = np.argsort(lens, kind="stable")
    sorted_lens = lens[order]
    edges = np.flatnonzero(np.diff(sorted_lens)) + 1  # where the gap count changes
    for group in np.split(order, edges):
        n = int(lens[group[0]])
        if n == 0:
            continue
        rows = np.lib.stride_tricks.sliding_window_view(gaps, n)[starts[group]]
        rows[:, 0] += firsts[group]
        np.cumsum(rows, axis=1, out=rows)
        count(rows)
    return tokens


def calculate_metrics(
    outcomes: Sequence[RequestOutcome], duration_s: float, itls: np.ndarray | None = None
) -> BenchmarkMetrics:
    """The metrics of a run. `itls`: every successful outcome's ITL gaps end to end, in order, where the
    caller already has them as one array (the simulator's client); it is reordered here (the
    percentiles' partition). Without it they are concatenated here."""
    ok = [o for o in outcomes if o.success]
    per_s = 1.0 / duration_s if duration_s > 0 else 0.0  # a run where nothing ran reports 0 throughput
    total_input = sum(o.prompt_len for o in ok)
    total_output = sum(o.output_len for o in ok)
    tpots = [(o.latency - o.ttft) / (o.output_len - 1) for o in ok if o.output_len > 1]
    gaps = _all_gaps(ok) if itls is None else itls
    e2e = [o.latency for o in ok]
    peak_tokens, peak_requests = _peak_per_second(ok, gaps)
    return BenchmarkMetrics(
        completed=len(ok),
        total_input=total_input,
        total_input_text=total_input,
        total_output=total_output,
        total_output_retokenized=sum(o.retokenized_output_len for o in ok),
        request_throughput=len(ok) * per_s,
        input_throughput=total_input * per_s,
        output_throughput=total_output * per_s,
        total_throughput=(total_input + total_output) * per_s,
        max_output_tokens_per_s=peak_tokens,
        max_concurrent_requests=peak_requests,
        concurrency=sum(e2e) * per_s,  # the client's average number of open requests
        e2e_ms=_stats(e2e),
        ttft_ms=_stats([o.ttft for o in ok]),
        tpot_ms=_stats(tpots),
        itl_ms=_itl_stats(gaps),  # last: this reorders the gaps
    )
