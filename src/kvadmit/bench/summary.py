"""The summary block bench_serving 0.5.22 prints (docs/sglang-rules.md §7.1), used by `bench` and `simulate`.

Labels are left-justified to 40 characters, then a space, then the value left-justified to 10 (floats with
two decimals), so rows carry trailing spaces; section titles are centred in 50 '-' characters.
"""

from __future__ import annotations

from kvadmit.bench.metrics import BenchmarkMetrics

_SECTIONS = (
    ("End-to-End Latency", "E2E Latency", "e2e_ms"),
    ("Time to First Token", "TTFT", "ttft_ms"),
    ("Time per Output Token (excl. 1st token)", "TPOT", "tpot_ms"),
    ("Inter-Token Latency", "ITL", "itl_ms"),
)
_STAT_LABELS = (("mean", "Mean"), ("median", "Median"), ("p90", "P90"), ("p95", "P95"), ("p99", "P99"))


def _row(label: str, value: object) -> str:
    if isinstance(value, float) and not isinstance(value, bool):
        return f"{label:<40} {value:<10.2f}"
    return f"{label:<40} {value!s:<10}"


def render_summary(
    m: BenchmarkMetrics,
    *,
    backend: str,
    request_rate: float,
    max_concurrency: int | None,
    duration_s: float,
) -> str:
    """The block, starting with its blank line, without a trailing newline."""
    rate = str(float(request_rate))  # bench_serving formats the rate with `{:<10}`: 20.0, not 20.00; inf
    lines = [
        "",
        f"{' Serving Benchmark Result ':=^50}",
        _row("Backend:", backend),
        _row("Traffic request rate:", rate),
        _row("Max request concurrency:", max_concurrency if max_concurrency else "not set"),
        _row("Successful requests:", m.completed),
        _row("Benchmark duration (s):", float(duration_s)),
        _row("Total input tokens:", m.total_input),
        _row("Total input text tokens:", m.total_input_text),
        _row("Total generated tokens:", m.total_output),
        _row("Total generated tokens (retokenized):", m.total_output_retokenized),
        _row("Request throughput (req/s):", float(m.request_throughput)),
        _row("Input token throughput (tok/s):", float(m.input_throughput)),
        _row("Output token throughput (tok/s):", float(m.output_throughput)),
        _row("Peak output token throughput (tok/s):", float(m.max_output_tokens_per_s)),
        _row("Peak concurrent requests:", m.max_concurrent_requests),
        _row("Total token throughput (tok/s):", float(m.total_throughput)),
        _row("Concurrency:", float(m.concurrency)),
    ]
    for title, name, attr in _SECTIONS:
        lines.append(f"{title:-^50}")
        stats: dict[str, float] = getattr(m, attr)
        for key, word in _STAT_LABELS:
            lines.append(_row(f"{word} {name} (ms):", stats[key]))
        if "max" in stats:
            lines.append(_row(f"Max {name} (ms):", stats["max"]))
    lines.append("=" * 50)
    return "\n".join(lines)
