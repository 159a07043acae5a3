"""A self-contained SVG of small line charts (no plotting library): one panel per metric, one line per
series, x and y axes from zero with round tick values, and a shared legend."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvadmit.observe.svg_chart import dot, element, nice_ticks, polyline, text, tick_label

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
        text(
            {"x": f"{ox + PANEL_W / 2:.1f}", "y": oy + 18, "text-anchor": "middle", "font-weight": "bold"},
            p.title,
        ),
        element("rect", {"x": x0, "y": y0 - h, "width": w, "height": h, "fill": "none", "stroke": "#888"}),
    ]
    for t in yt:
        out.append(
            element(
                "line", {"x1": x0, "x2": x0 + w, "y1": f"{sy(t):.1f}", "y2": f"{sy(t):.1f}", "stroke": "#eee"}
            )
        )
        out.append(text({"x": x0 - 4, "y": f"{sy(t) + 4:.1f}", "text-anchor": "end"}, tick_label(t)))
    for t in xt:
        out.append(text({"x": f"{sx(t):.1f}", "y": y0 + 14, "text-anchor": "middle"}, tick_label(t)))
    out.append(text({"x": f"{x0 + w / 2:.1f}", "y": y0 + 32, "text-anchor": "middle"}, p.x_label))
    for i, s in enumerate(p.series):
        color = COLORS[i % len(COLORS)]
        pts = [(sx(x), sy(y)) for x, y in s.points if math.isfinite(x) and math.isfinite(y)]
        if len(pts) > 1:
            out.append(polyline(pts, color, "1.5"))
        out += [dot(x, y, "2.5", color) for x, y in pts]
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
        out.append(text({"x": width / 2, "y": 20, "text-anchor": "middle", "font-size": 14}, title))
    for k, panel in enumerate(panels):
        out += _panel(panel, (k % columns) * PANEL_W, top + (k // columns) * PANEL_H)
    for i, name in enumerate(names):
        x, y = 20 + (i % 3) * (width / 3), top + rows * PANEL_H + 16 + 20 * (i // 3)
        colour = COLORS[i % len(COLORS)]
        out.append(element("rect", {"x": f"{x:.1f}", "y": y - 9, "width": 12, "height": 4, "fill": colour}))
        out.append(text({"x": f"{x + 18:.1f}", "y": y - 4}, name))
    out.append("</svg>")
    return "\n".join(out) + "\n"
