"""A sweep's results as a table, as CSV, and as an SVG of metric-versus-load charts."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence

from kvadmit.sim.svgplot import Panel, Series, render_svg
from kvadmit.sim.sweep import PointResult

# (column title, PointResult field, format)
METRICS: tuple[tuple[str, str, str], ...] = (
    ("TTFT p50 ms", "ttft_p50_ms", ",.0f"),
    ("TTFT p99 ms", "ttft_p99_ms", ",.0f"),
    ("TPOT mean ms", "tpot_mean_ms", ",.2f"),
    ("TPOT p99 ms", "tpot_p99_ms", ",.2f"),
    ("output tok/s", "output_throughput", ",.0f"),
    ("req/s", "request_throughput", ",.2f"),
    ("retractions/min", "retractions_per_min", ",.1f"),
    ("queue mean ms", "queue_mean_ms", ",.0f"),
    ("queue p99 ms", "queue_p99_ms", ",.0f"),
    ("KV usage", "kv_usage_mean", ".2f"),
    ("running", "running_mean", ",.1f"),
)
PLOTTED = ("ttft_p50_ms", "ttft_p99_ms", "tpot_mean_ms", "output_throughput", "retractions_per_min",
           "queue_mean_ms")  # fmt: skip
LABELS = {
    "schedule_conservativeness": "conservativeness",
    "max_running_requests": "max running",
    "max_total_tokens": "pool tokens",
    "chunked_prefill_size": "chunk",
    "admission_policy": "policy",
    "max_concurrency": "concurrency",
    "request_rate": "rate",
}


def _setting(value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def render_table(results: Sequence[PointResult], show_wall: bool = True) -> list[str]:
    keys = list(results[0].settings) if results else []
    head = [LABELS.get(k, k) for k in keys] + [t for t, _, _ in METRICS] + (["wall s"] if show_wall else [])
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(keys) + " ---: |" * (len(head) - len(keys))]
    for r in results:
        cells = [_setting(r.settings[k]) for k in keys]
        cells += [format(r.metric(f), spec) for _, f, spec in METRICS]
        if show_wall:
            cells.append(f"{r.wall_s:.2f}")
        if r.failed:
            cells[-1] += f" ({r.failed} failed)"
        out.append("| " + " | ".join(cells) + " |")
    return out


def render_csv(results: Sequence[PointResult]) -> str:
    buf = io.StringIO()
    keys = list(results[0].settings) if results else []
    fields = [f for _, f, _ in METRICS]
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([*keys, *fields, "completed", "failed", "retractions", "duration_s", "wall_s"])
    for r in results:
        writer.writerow(
            [*(r.settings[k] for k in keys), *(r.metric(f) for f in fields), r.completed, r.failed,
             r.retractions, r.duration_s, r.wall_s]
        )  # fmt: skip
    return buf.getvalue()


def render_plots(results: Sequence[PointResult], load_key: str, title: str = "") -> str:
    """One chart per plotted metric: the load on x, one line per combination of the other settings."""
    groups: dict[str, list[PointResult]] = {}
    for r in results:
        rest = [f"{LABELS.get(k, k)}={_setting(v)}" for k, v in r.settings.items() if k != load_key]
        groups.setdefault(", ".join(rest) or "all", []).append(r)
    titles = {f: t for t, f, _ in METRICS}
    panels = []
    for metric in PLOTTED:
        series = tuple(
            Series(name, tuple(sorted((float(r.settings[load_key]), r.metric(metric)) for r in rs)))  # type: ignore[arg-type]
            for name, rs in groups.items()
        )
        panels.append(Panel(titles[metric], LABELS.get(load_key, load_key), series))
    return render_svg(panels, title=title)
