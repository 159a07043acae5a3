"""The pieces of the inline SVG charts that `kvadmit sweep --svg` (sim/svgplot.py) and `kvadmit doctor
--html` (doctor/html.py) draw: elements with their attributes in the order given, a series' line and
dots in pixels to one decimal, and round tick values. No plotting library; each chart lays itself out."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape


def element(tag: str, attributes: dict[str, object], content: str | None = None) -> str:
    """`<tag a="v" …/>`, or `<tag …>content</tag>` with content (already SVG: escape text first)."""
    attrs = " ".join(f'{name}="{value}"' for name, value in attributes.items())
    return f"<{tag} {attrs}/>" if content is None else f"<{tag} {attrs}>{content}</{tag}>"


def text(attributes: dict[str, object], words: str) -> str:
    """A text element holding `words`, escaped."""
    return element("text", attributes, escape(words))


def polyline(points: Sequence[tuple[float, float]], colour: str, width: str) -> str:
    """A series' line through points in pixels."""
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return element("polyline", {"points": path, "fill": "none", "stroke": colour, "stroke-width": width})


def dot(x: float, y: float, radius: str, colour: str) -> str:
    return element("circle", {"cx": f"{x:.1f}", "cy": f"{y:.1f}", "r": radius, "fill": colour})


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least `top`."""
    if not top > 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = top / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    n = math.ceil(top / step - 1e-9)
    return [i * step for i in range(n + 1)]


def tick_label(v: float) -> str:
    """A tick value short: 0, 2.5, 400, 12k."""
    if v == 0:
        return "0"
    if abs(v) >= 10_000:
        return f"{v / 1000:g}k"
    return f"{v:g}"
