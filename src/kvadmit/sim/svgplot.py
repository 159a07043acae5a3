"""A self-contained SVG of small line charts (no plotting library): one panel per metric, one line per
series, x and y axes from zero with round tick values, and a shared legend."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
PANEL_W, PANEL_H = 360, 240
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 62, 16, 28, 40


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    points: tuple[tuple[float, float], ...]  # (x, y), sorted by x


@dataclass(frozen=True, slots=True)
class Panel:
    title: str
    x_label: str
    series: tuple[Series, ...]


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least `top`."""
    if not top > 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = top / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    n = math.ceil(top / step - 1e-9)
    return [i * step for i in range(n + 1)]


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 10_000:
        return f"{v / 1000:g}k"
    return f"{v:g}"


def _panel(p: Panel, ox: float, oy: float) -> list[str]:
    xs = [x for s in p.series for x, _ in s.points if math.isfinite(x)]
    ys = [y for s in p.series for _, y in s.points if math.isfinite(y)]
    xt = nice_ticks(max(xs, default=1.0))
    yt = nice_ticks(max(ys, default=1.0))
    w, h = PANEL_W - MARGIN_L - MARGIN_R, PANEL_H - MARGIN_T - MARGIN_B
    x0, y0 = ox + MARGIN_L, oy + MARGIN_T + h

    def sx(x: float) -> float:
        return x0 + w * x / xt[-1]

    def sy(y: float) -> float:
        return y0 - h * min(y, yt[-1]) / yt[-1]

    out = [
        f'<text x="{ox + PANEL_W / 2:.1f}" y="{oy + 18}" text-anchor="middle" font-weight="bold">'
        f"{escape(p.title)}</text>",
        f'<rect x="{x0}" y="{y0 - h}" width="{w}" height="{h}" fill="none" stroke="#888"/>',
    ]
    for t in yt:
        out.append(f'<line x1="{x0}" x2="{x0 + w}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{x0 - 4}" y="{sy(t) + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    for t in xt:
        out.append(f'<text x="{sx(t):.1f}" y="{y0 + 14}" text-anchor="middle">{_fmt(t)}</text>')
    out.append(f'<text x="{x0 + w / 2:.1f}" y="{y0 + 32}" text-anchor="middle">{escape(p.x_label)}</text>')
    for i, s in enumerate(p.series):
        color = COLORS[i % len(COLORS)]
        pts = [(sx(x), sy(y)) for x, y in s.points if math.isfinite(x) and math.isfinite(y)]
        if len(pts) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{color}"/>' for x, y in pts]
    return out


def render_svg(panels: list[Panel], columns: int = 3, title: str = "") -> str:
    rows = math.ceil(len(panels) / columns) if panels else 1
    names = list(dict.fromkeys(s.name for p in panels for s in p.series))
    legend_h = 20 * math.ceil(len(names) / 3) + 10
    top = 30 if title else 0
    width, height = columns * PANEL_W, top + rows * PANEL_H + legend_h
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    if title:
        out.append(f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>')
    for k, panel in enumerate(panels):
        out += _panel(panel, (k % columns) * PANEL_W, top + (k // columns) * PANEL_H)
    for i, name in enumerate(names):
        x, y = 20 + (i % 3) * (width / 3), top + rows * PANEL_H + 16 + 20 * (i // 3)
        out.append(f'<rect x="{x:.1f}" y="{y - 9}" width="12" height="4" fill="{COLORS[i % len(COLORS)]}"/>')
        out.append(f'<text x="{x + 18:.1f}" y="{y - 4}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
