"""bench_serving's metrics, with its definitions (reference §7): computed from per-request outcomes.

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
    ttft: float = 0.0  # seconds to the first non-empty chunk
    latency: float = 0.0  # seconds to the last byte
    itl: list[float] = field(default_factory=list)  # gaps between later tokens (per backend's split)
    error: str = ""
    cached_tokens: int = 0


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
    e2e_ms: dict[str, float]  # mean, median, p90, p95, p99
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    itl_ms: dict[str, float]  # … and max


def _stats(values: Sequence[float], with_max: bool = False) -> dict[str, float]:
    """Mean, median and percentiles in ms; an empty list counts as [0], as bench_serving's `or 0` does."""
    arr = np.asarray(values if len(values) else [0.0], dtype=float)
    out = {
        "mean": float(np.mean(arr)) * 1000,
        "median": float(np.median(arr)) * 1000,
        "p90": float(np.percentile(arr, 90)) * 1000,
        "p95": float(np.percentile(arr, 95)) * 1000,
        "p99": float(np.percentile(arr, 99)) * 1000,
    }
    if with_max:
        out["max"] = float(np.max(arr)) * 1000
    return out


def peak_per_second(outcomes: Sequence[RequestOutcome]) -> tuple[float, int]:
    """(peak output tokens in a one-second bucket, peak requests open in a one-second bucket).

    Buckets are whole seconds from the first send. A token lands in the bucket of its arrival time
    (first token at start + TTFT, each later one after its ITL gap); a request counts in every bucket
    from the one it was sent in to the one it ended in.
    """
    ok = [o for o in outcomes if o.success]
    if not ok:
        return 0.0, 0
    t0 = min(o.start_time for o in ok)
    end = max(o.start_time + o.latency for o in ok)
    buckets = math.ceil(end - t0) + 1
    tokens = np.zeros(buckets)
    open_requests = np.zeros(buckets)
    for o in ok:
        t = o.start_time + o.ttft
        times = [t]
        for gap in o.itl:
            t += gap
            times.append(t)
        for when in times:
            b = int(when - t0)
            if 0 <= b < buckets:
                tokens[b] += 1
        first = int(o.start_time - t0)
        last = int(o.start_time + o.latency - t0)
        open_requests[first : min(last + 1, buckets)] += 1
    return float(np.max(tokens)), int(np.max(open_requests))


def calculate_metrics(outcomes: Sequence[RequestOutcome], duration_s: float) -> BenchmarkMetrics:
    ok = [o for o in outcomes if o.success]
    total_input = sum(o.prompt_len for o in ok)
    total_output = sum(o.output_len for o in ok)
    tpots = [(o.latency - o.ttft) / (o.output_len - 1) for o in ok if o.output_len > 1]
    itls = [gap for o in ok for gap in o.itl]
    e2e = [o.latency for o in ok]
    peak_tokens, peak_requests = peak_per_second(outcomes)
    return BenchmarkMetrics(
        completed=len(ok),
        total_input=total_input,
        total_input_text=total_input,
        total_output=total_output,
        total_output_retokenized=sum(o.retokenized_output_len for o in ok),
        request_throughput=len(ok) / duration_s,
        input_throughput=total_input / duration_s,
        output_throughput=total_output / duration_s,
        total_throughput=(total_input + total_output) / duration_s,
        max_output_tokens_per_s=peak_tokens,
        max_concurrent_requests=peak_requests,
        concurrency=sum(e2e) / duration_s,  # the client's average number of open requests
        e2e_ms=_stats(e2e),
        ttft_ms=_stats([o.ttft for o in ok]),
        tpot_ms=_stats(tpots),
        itl_ms=_stats(itls, with_max=True),
    )
