"""The JSON line `--output-file` appends per run, with bench_serving's field names (its 0.5.x result
dictionary), and with --output-details the per-request lists bench_serving adds, plus what
`kvadmit simulate --replay` needs to send the same requests again: each request's send time, latency,
arrival time (when the client made it; later than that only by waiting for a --max-concurrency slot),
token budget (`max_new_tokens`) and `ignore_eos`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from kvadmit.bench.metrics import BenchmarkMetrics, RequestOutcome


def result_record(
    m: BenchmarkMetrics,
    *,
    backend: str,
    dataset_name: str,
    request_rate: float,
    max_concurrency: int | None,
    sharegpt_output_len: int | None,
    random_input_len: int,
    random_output_len: int,
    random_range_ratio: float,
    duration_s: float,
    server_info: Any,
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "backend": backend,
        "dataset_name": dataset_name,
        "request_rate": request_rate,
        "max_concurrency": max_concurrency,
        "sharegpt_output_len": sharegpt_output_len,
        "random_input_len": random_input_len,
        "random_output_len": random_output_len,
        "random_range_ratio": random_range_ratio,
        "server_info": server_info,
        "duration": duration_s,
        "completed": m.completed,
        "total_input_tokens": m.total_input,
        "total_input_text_tokens": m.total_input_text,
        "total_input_vision_tokens": 0,
        "total_output_tokens": m.total_output,
        "total_output_tokens_retokenized": m.total_output_retokenized,
        "request_throughput": m.request_throughput,
        "input_throughput": m.input_throughput,
        "output_throughput": m.output_throughput,
        "total_throughput": m.total_throughput,
    }
    for prefix, stats in (
        ("e2e_latency", m.e2e_ms),
        ("ttft", m.ttft_ms),
        ("tpot", m.tpot_ms),
        ("itl", m.itl_ms),
    ):
        for key in ("mean", "median", "std", "p90", "p95", "p99"):
            record[f"{key}_{prefix}_ms"] = stats[key]
    record["max_itl_ms"] = m.itl_ms["max"]
    record["concurrency"] = m.concurrency
    record["accept_length"] = None
    record["max_output_tokens_per_s"] = m.max_output_tokens_per_s
    record["max_concurrent_requests"] = m.max_concurrent_requests
    return record


def details(
    outcomes: Sequence[RequestOutcome], texts: Sequence[str], retokenized: Sequence[int], start: float
) -> dict[str, Any]:
    """Per request, in dataset order (a failed request has output length 0, as bench_serving lists it)."""
    return {
        "input_lens": [o.prompt_len for o in outcomes],
        "output_lens": [o.output_len if o.success else 0 for o in outcomes],
        "retokenized_output_lens": list(retokenized),
        "ttfts": [o.ttft for o in outcomes],
        "itls": [list(o.itl) for o in outcomes],
        "start_times": [o.start_time - start for o in outcomes],  # seconds after the benchmark began
        "latencies": [o.latency for o in outcomes],
        "arrival_times": [o.arrival_time - start for o in outcomes],
        "max_new_tokens": [o.max_new_tokens for o in outcomes],
        "ignore_eos": [o.ignore_eos for o in outcomes],
        "generated_texts": list(texts),
        "errors": [o.error for o in outcomes],
    }


def append_line(path: str, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
