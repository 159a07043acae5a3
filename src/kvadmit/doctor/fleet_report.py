"""The fleet report: the fleet's verdict with its evidence and advice, the per-replica table, each
replica's own verdict (as the single-log report words it), then what was read. JSON carries the same."""

from __future__ import annotations

import json

from kvadmit.doctor.fleet import FleetDiagnosis, ReplicaVerdict
from kvadmit.doctor.rates import duration
from kvadmit.doctor.report import _finding

TABLE_HEAD = ("replica", "verdict", "requests", "peak queue", "retractions", "usage peak", "usage p50",
              "gen tok/s", "cached")  # fmt: skip


def _cell(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def table_row(r: ReplicaVerdict) -> list[str]:
    row = r.row()
    return [
        r.name,
        str(row["verdict"]),
        f"{r.requests:,}" if r.requests_seen else "-",
        f"{row['peak_queue']:,}",
        f"{r.retractions:,}" + (f" ({r.retracted:,} req)" if r.retracted else ""),
        _cell(row["usage_peak"], ".2f"),
        _cell(row["usage_median"], ".2f"),
        _cell(row["gen_throughput_mean"], ",.1f"),
        _cell(row["cached_share"], ".0%"),
    ]


def replica_table(d: FleetDiagnosis) -> list[str]:
    """requests: prefill admissions less re-admissions after retraction ("-": no Prefill lines); usage
    p50: the median of the batch lines' token usage; gen tok/s: the mean of the Decode lines' gen
    throughput; cached: the share of the prefilled prompt tokens the prefix cache supplied."""
    rows = [list(TABLE_HEAD)] + [table_row(r) for r in d.replicas]
    widths = [max(len(row[i]) for row in rows) for i in range(len(TABLE_HEAD))]
    out = []
    for k, row in enumerate(rows):
        cells = [
            c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        out.append("  " + "  ".join(cells).rstrip())
        if k == 0:
            out.append("  " + "  ".join("-" * w for w in widths))
    return out


def render_fleet_text(d: FleetDiagnosis) -> str:
    out = _finding(d.fleet, lead=True)
    out[0] = f"Fleet verdict: {d.verdict}"
    out += ["", f"Replicas ({len(d.replicas)}):", *replica_table(d)]
    for r in d.replicas:
        out += ["", f"== {r.name} ({r.state})"]
        out += _finding(r.diagnosis.lead, lead=True)
        for extra in r.diagnosis.findings[1:]:
            out += _finding(extra, lead=False)
    out.append("")
    for inp in d.inputs:
        span = f", {duration(inp.span_s)} of log" if inp.span_s else ""
        out.append(
            f"Read {inp.source}: {inp.lines:,} lines, {inp.recognised:,} recognised, {inp.unknown:,} not "
            f"recognised{span}"
        )
        for note in inp.notes:
            out.append(f"  note: {note}")
    return "\n".join(out)


def render_fleet_json(d: FleetDiagnosis) -> str:
    return json.dumps(d.to_json(), indent=1, default=str)
