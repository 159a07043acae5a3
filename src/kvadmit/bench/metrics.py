"""bench_serving's metrics, with its definitions (docs/sglang-rules.md §7): computed from per-request
outcomes.

One request's outcome carries what the client saw: when it was sent, the time to its first non-empty
chunk, the gaps between later tokens, its end-to-end latency and the server's completion token count.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
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


def _stats(values: Sequence[float], with_max: bool = False, scratch: bool = False) -> dict[str, float]:
    """Mean, median, percentiles and standard deviation in ms; an empty list counts as [0], as
    bench_serving's `or 0` does. `scratch`: `values` is an array the caller no longer needs, partitioned
    in place (no copy)."""
    arr = np.asarray(values, dtype=float) if len(values) else np.zeros(1)
    mean, top = float(np.mean(arr)), float(np.max(arr))  # (before the partition reorders a scratch array)
    # np.median is the 50th percentile (linear interpolation), so one partition serves all four.
    p50, p90, p95, p99 = np.percentile(arr, [50, 90, 95, 99], overwrite_input=scratch)
    out = {
        "mean": mean * 1000,
        "median": float(p50) * 1000,
        "p90": float(p90) * 1000,
        "p95": float(p95) * 1000,
        "p99": float(p99) * 1000,
        "std": float(np.std(arr)) * 1000,  # population std (numpy's default), for the JSON line
    }
    if with_max:
        out["max"] = top * 1000
    return out


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
    tokens = np.zeros(buckets, dtype=np.int64)
    firsts = starts + np.array([o.ttft for o in ok], dtype=float)
    for times in _token_times(firsts, gaps, np.array([len(o.itl) for o in ok], dtype=np.int64)):
        b = (times - t0).astype(np.int64).ravel()
        tokens += np.bincount(b[(b >= 0) & (b < buckets)], minlength=buckets)
    return float(np.max(tokens)), int(np.max(np.cumsum(open_requests[:buckets])))


def _token_times(firsts: np.ndarray, flat: np.ndarray, lens: np.ndarray) -> Iterator[np.ndarray]:
    """Every token's arrival time, one group of requests with as many gaps at a time: request i's
    times are the running sums of [firsts[i], *its lens[i] gaps] (`flat` holds every request's gaps,
    end to end). A group is one matrix, a row per request, summed along its rows; a row sum adds left to
    right as a per-request cumsum does, so the floats are the same, for a few numpy calls per group
    instead of per request."""
    starts = np.cumsum(lens) - lens  # where each request's gaps start in `flat`
    order = np.argsort(lens, kind="stable")
    sorted_lens = lens[order]
    edges = np.flatnonzero(np.diff(sorted_lens)) + 1  # where the gap count changes
    for group in np.split(order, edges):
        n = int(lens[group[0]])
        matrix = np.empty((len(group), n + 1))
        matrix[:, 0] = firsts[group]
        matrix[:, 1:] = flat[starts[group][:, None] + np.arange(n)]
        yield np.cumsum(matrix, axis=1)


def calculate_metrics(outcomes: Sequence[RequestOutcome], duration_s: float) -> BenchmarkMetrics:
    ok = [o for o in outcomes if o.success]
    per_s = 1.0 / duration_s if duration_s > 0 else 0.0  # a run where nothing ran reports 0 throughput
    total_input = sum(o.prompt_len for o in ok)
    total_output = sum(o.output_len for o in ok)
    tpots = [(o.latency - o.ttft) / (o.output_len - 1) for o in ok if o.output_len > 1]
    itls = _all_gaps(ok)
    e2e = [o.latency for o in ok]
    peak_tokens, peak_requests = _peak_per_second(ok, itls)
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
        itl_ms=_stats(itls, with_max=True, scratch=True),  # last: this reorders itls
    )
