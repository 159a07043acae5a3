"""`--html FILE` for a fleet: one self-contained page (html.py's style, no script) with the fleet's verdict,
the per-replica table, then each replica's timeline charts and findings."""

from __future__ import annotations

from html import escape

from kvadmit.doctor.fleet import FleetDiagnosis
from kvadmit.doctor.fleet_report import TABLE_HEAD, table_row
from kvadmit.doctor.html import _CSS, VERDICT_COLOURS, _finding, charts

FLEET_COLOURS = {
    "fleet-healthy": "#2ca02c",
    "fleet-imbalance": "#ff7f0e",
    "fleet-overloaded": "#d62728",
    "fleet-held-back": "#9467bd",
}
_TABLE_CSS = "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:2px 8px}"


def render_fleet_html(d: FleetDiagnosis) -> str:
    colour = FLEET_COLOURS.get(d.verdict, "#7f7f7f")
    head = "".join(f"<th>{escape(h)}</th>" for h in TABLE_HEAD)
    rows = "".join(
        "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in table_row(r)) + "</tr>" for r in d.replicas
    )
    inputs = "<br>".join(
        escape(f"{i.source}: {i.lines:,} lines, {i.recognised:,} recognised, {i.unknown:,} not recognised"
               + ("; " + "; ".join(i.notes) if i.notes else ""))
        for i in d.inputs
    )  # fmt: skip
    body = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>kvadmit doctor: {escape(d.verdict)}</title>",
        f"<style>{_CSS}{_TABLE_CSS}</style></head><body>",
        "<h1>kvadmit doctor: a fleet</h1>",
        f'<div class="inputs">{inputs}</div>',
        f'<div class="verdict" style="background:{colour}"><b>Fleet verdict: {escape(d.verdict)}</b><br>'
        f"{escape(d.fleet.title)}</div>",
        _finding(d.fleet),
        f"<h2>Replicas ({len(d.replicas)})</h2>",
        f"<table><tr>{head}</tr>{rows}</table>",
    ]
    for r in d.replicas:
        lead = r.diagnosis.lead
        shade = VERDICT_COLOURS.get(r.diagnosis.verdict, "#7f7f7f")
        body += [
            f"<h2>{escape(r.name)} ({escape(r.state)})</h2>",
            f'<div class="verdict" style="background:{shade}"><b>Verdict: {escape(r.diagnosis.verdict)}</b>'
            f"<br>{escape(lead.title)}</div>",
            charts(r.diagnosis),
            *(_finding(f) for f in r.diagnosis.findings),
        ]
    body.append("</body></html>")
    return "\n".join(body)
