"""`--html FILE`: one self-contained page (inline CSS and SVG, no script, no external resource) with the
verdict, timeline charts (token usage, running and queued requests, generation throughput, with
retraction and failure markers) and every finding with its evidence and advice. It opens offline."""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from typing import TYPE_CHECKING

from kvadmit.doctor.model import Diagnosis, Finding
from kvadmit.doctor.timeline import Marker, Point, Series
from kvadmit.observe.svg_chart import dot, element, polyline, text

if TYPE_CHECKING:
    from kvadmit.doctor.prove import Proof

WIDTH, HEIGHT = 960, 170
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 26, 26
COLOURS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
MARKER_COLOURS = {"retract": "#d62728", "oom": "#000000", "abort": "#ff7f0e", "health": "#9467bd"}
VERDICT_COLOURS = {
    "healthy-queue": "#2ca02c",
    "retraction-occasional": "#bcbd22",
    "idle-pool-with-queue": "#ff7f0e",
    "retraction-storm": "#d62728",
    "throughput-collapse": "#d62728",
    "oom-abort": "#000000",
    "other": "#7f7f7f",
}

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif; margin: 24px auto;
       max-width: 1000px; color: #222; padding: 0 12px; }
h1 { font-size: 20px; margin: 0 0 4px; }
.verdict { color: #fff; padding: 10px 14px; border-radius: 6px; margin: 12px 0; }
.verdict b { font-size: 17px; }
.inputs { color: #555; font-size: 13px; }
.finding { border: 1px solid #ddd; border-left: 6px solid #999; border-radius: 4px; padding: 8px 12px;
           margin: 12px 0; }
.finding h3 { margin: 2px 0 6px; font-size: 15px; }
pre { background: #f6f6f6; padding: 6px 8px; font-size: 12px; margin: 4px 0; white-space: pre-wrap;
      overflow-wrap: anywhere; }
.ln { color: #888; }
svg { display: block; margin: 6px 0; background: #fff; }
.legend span { display: inline-block; margin-right: 14px; font-size: 12px; }
.legend i { display: inline-block; width: 14px; height: 3px; vertical-align: middle; margin-right: 4px; }
"""


def _x_scale(
    points: list[Point], markers: list[Marker], timed: bool
) -> tuple[Callable[[float], float], float, float]:
    xs = [(p.t if timed else p.line) for p in points] + [(m.t if timed else m.line) for m in markers]
    values = [float(x) for x in xs if x is not None]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if hi <= lo:
        hi = lo + 1.0
    span = hi - lo

    def sx(x: float) -> float:
        return LEFT + (x - lo) / span * (WIDTH - LEFT - RIGHT)

    return sx, lo, hi


def _panel(
    title: str,
    series: list[tuple[str, str, list[tuple[float, float]]]],
    markers: list[Marker],
    sx: Callable[[float], float],
    timed: bool,
    y_max: float | None,
    guide: float | None = None,
    x_range: tuple[float, float] = (0.0, 1.0),
) -> str:
    values = [y for _, _, pts in series for _, y in pts]
    top = y_max if y_max is not None else (max(values) if values else 1.0)
    top = top if top > 0 else 1.0
    plot_h = HEIGHT - TOP - BOTTOM

    def sy(y: float) -> float:
        return TOP + plot_h - min(max(y / top, 0.0), 1.05) * plot_h

    out = [
        f'<svg width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}">',
        text({"x": LEFT, "y": 16, "font-size": 13, "font-weight": 600}, title),
        element("rect", {"x": LEFT, "y": TOP, "width": WIDTH - LEFT - RIGHT, "height": plot_h,
                         "fill": "#fafafa", "stroke": "#ccc"}),
    ]  # fmt: skip
    for frac in (0.0, 0.5, 1.0):
        y = TOP + plot_h - frac * plot_h
        label = f"{top * frac:.2f}" if top <= 2 else f"{top * frac:,.0f}"
        out.append(text({"x": LEFT - 6, "y": f"{y + 4:.1f}", "font-size": 11, "text-anchor": "end"}, label))
    lo, hi = x_range
    unit = "s" if timed else "line"
    for frac, anchor in ((0.0, "start"), (0.5, "middle"), (1.0, "end")):
        x = lo + frac * (hi - lo)
        attrs = {"x": f"{sx(x):.1f}", "y": HEIGHT - 8, "font-size": 11, "text-anchor": anchor}
        out.append(text(attrs, f"{x:,.0f} {unit}"))
    if guide is not None:
        y = f"{sy(guide):.1f}"
        out.append(element("line", {"x1": LEFT, "x2": WIDTH - RIGHT, "y1": y, "y2": y, "stroke": "#888",
                                    "stroke-dasharray": "4 3"}))  # fmt: skip
    for m in markers:
        x = m.t if timed else m.line
        if x is None:
            continue
        colour = MARKER_COLOURS.get(m.kind, "#d62728")
        tip = f"line {m.line}: {m.kind} ×{m.count} {m.label}".strip()
        attrs = {"x1": f"{sx(x):.1f}", "x2": f"{sx(x):.1f}", "y1": TOP, "y2": TOP + plot_h, "stroke": colour,
                 "stroke-opacity": "0.55"}  # fmt: skip
        out.append(element("line", attrs, f"<title>{escape(tip)}</title>"))
    for _name, colour, pts in series:
        if len(pts) == 1:
            out.append(dot(sx(pts[0][0]), sy(pts[0][1]), "4", colour))
        elif pts:
            out.append(polyline([(sx(x), sy(y)) for x, y in pts], colour, "1.6"))
    out.append("</svg>")
    return "".join(out)


def _pts(s: Series, timed: bool, get: Callable[[Point], float | int | None]) -> list[tuple[float, float]]:
    out = []
    for p in s.all_points():
        x = p.t if timed else p.line
        y = get(p)
        if x is not None and y is not None:
            out.append((float(x), float(y)))
    return out


def charts(d: Diagnosis) -> str:
    tl = d.timeline
    series = list(tl.series.values())
    if not series and not tl.markers:
        return "<p>No timeline: the input has no batch statistics over time.</p>"
    timed = tl.timed
    all_points = [p for s in series for p in s.all_points()]
    sx, lo, hi = _x_scale(all_points, tl.markers, timed)
    colours = {s.name: COLOURS[i % len(COLOURS)] for i, s in enumerate(series)}
    usage = [(s.name, colours[s.name], _pts(s, timed, lambda p: p.usage)) for s in series]
    running = [(f"{s.name} running", colours[s.name], _pts(s, timed, lambda p: p.running)) for s in series]
    queued = [
        (
            f"{s.name} queued",
            "#ff7f0e" if len(series) == 1 else colours[s.name],
            _pts(s, timed, lambda p: p.queued),
        )
        for s in series
    ]
    tput = [(s.name, colours[s.name], _pts(s, timed, lambda p: p.throughput)) for s in series]
    legend = ['<div class="legend">']
    if len(series) > 1:
        legend += [
            f'<span><i style="background:{colours[s.name]}"></i>{escape(s.name)}</span>' for s in series
        ]
    else:
        legend += [
            '<span><i style="background:#1f77b4"></i>running / usage / throughput</span>',
            '<span><i style="background:#ff7f0e"></i>queued</span>',
        ]
    legend += [
        f'<span><i style="background:{c}"></i>{k} marker</span>'
        for k, c in MARKER_COLOURS.items()
        if any(m.kind == k for m in tl.markers)
    ]
    legend.append("</div>")
    x_range = (lo, hi)
    parts = [
        "".join(legend),
        _panel("Token usage (dashed: 0.9)", usage, tl.markers, sx, timed, 1.0, 0.9, x_range),
        _panel(
            "Running (line) and queued requests", running + queued, tl.markers, sx, timed, None, None, x_range
        ),
        _panel("Generation throughput (tokens/s)", tput, tl.markers, sx, timed, None, None, x_range),
    ]
    if tl.dropped_streams:
        parts.append(f"<p>{tl.dropped_streams} samples from further ranks are not drawn.</p>")
    return "\n".join(parts)


def _finding(f: Finding) -> str:
    colour = VERDICT_COLOURS.get(f.verdict or "", "#999")
    tag = f.verdict or f.kind
    out = [
        f'<div class="finding" style="border-left-color:{colour}"><h3>[{escape(tag)}] {escape(f.title)}</h3>'
    ]
    out += [f"<p>{escape(line)}</p>" for line in f.explanation]
    if f.evidence:
        rows = "\n".join(
            f'<span class="ln">{escape((q.source + ":") if q.source else "line ")}{q.line}:</span> '
            f"{escape(q.text[:600])}"
            for q in f.evidence
        )
        out.append(f"<b>Evidence</b><pre>{rows}</pre>")
    if f.advice:
        out.append("<b>What to do</b><ul>" + "".join(f"<li>{escape(a)}</li>" for a in f.advice) + "</ul>")
    out.append("</div>")
    return "".join(out)


def render_html(d: Diagnosis, proof: Proof | None = None) -> str:
    lead = d.lead
    colour = VERDICT_COLOURS.get(d.verdict, "#7f7f7f")
    inputs = "<br>".join(
        escape(
            f"{i.source}: {i.kind}, {i.lines:,} lines/samples, {i.recognised:,} recognised, "
            f"{i.unknown:,} not recognised" + ("; " + "; ".join(i.notes) if i.notes else "")
        )
        for i in d.inputs
    )
    body = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>kvadmit doctor: {escape(d.verdict)}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>kvadmit doctor</h1>",
        f'<div class="inputs">{inputs}</div>',
        f'<div class="verdict" style="background:{colour}"><b>Verdict: {escape(d.verdict)}</b><br>'
        f"{escape(lead.title)}</div>",
        "<h2>Timeline</h2>",
        charts(d),
        "<h2>Findings</h2>",
        *(_finding(f) for f in d.findings),
        proof_html(proof) if proof is not None else "",
        "</body></html>",
    ]
    return "\n".join(body)


def proof_html(proof: Proof) -> str:
    """The reconstruction, replay check, what-if table and the simulated timelines over the real one."""
    from kvadmit.doctor.whatif_html import overlay_charts
    from kvadmit.doctor.whatif_report import render_proof_html

    return render_proof_html(proof, overlay_charts(proof))
