"""The HTML report's overlay: the replay's and each what-if's token usage and queue over the window, drawn
over the real log's (the same panels as the doctor's timeline, html.py)."""

from __future__ import annotations

from html import escape

from kvadmit.doctor.html import COLOURS, LEFT, RIGHT, WIDTH, _panel
from kvadmit.doctor.prove import Proof

REAL_COLOUR = "#000000"


def overlay_charts(p: Proof) -> str:
    if p.reconstruction is None or p.real is None or not p.outcomes:
        return ""
    lo, hi = 0.0, max(p.reconstruction.span_s, 1.0)

    def sx(x: float) -> float:
        return LEFT + (x - lo) / (hi - lo) * (WIDTH - LEFT - RIGHT)

    runs = [("the log", REAL_COLOUR, p.real.points)]
    runs += [(o.scenario.label, COLOURS[i % len(COLOURS)], o.stats.points) for i, o in enumerate(p.outcomes)]
    usage = [(name, colour, [(t, u) for t, u, _ in pts if u is not None]) for name, colour, pts in runs]
    queue = [(n, colour, [(t, float(q)) for t, _, q in pts if q is not None]) for n, colour, pts in runs]
    legend = ['<div class="legend">']
    legend += [f'<span><i style="background:{c}"></i>{escape(n)}</span>' for n, c, _ in runs]
    legend.append("</div>")
    return "\n".join(
        [
            "<h3>Simulated timelines over the real one</h3>",
            "".join(legend),
            _panel("token usage", usage, [], sx, True, 1.0, guide=1.0, x_range=(lo, hi)),
            _panel("queued requests", queue, [], sx, True, None, x_range=(lo, hi)),
        ]
    )
