"""The reconstruction, the replay check and the what-if table, as text and as HTML (report.py and html.py
add these sections after their own)."""

from __future__ import annotations

import math
from html import escape
from typing import Any

from kvadmit.doctor.prove import DRAWS, Proof
from kvadmit.doctor.whatif import Outcome

WHAT_IF_COLUMNS = (
    ("what if", "what_if"),
    ("verdict", "verdict"),
    ("retractions/min", "retractions_per_min"),
    ("TTFT p50 ms", "ttft_p50_ms"),
    ("TTFT p99 ms", "ttft_p99_ms"),
    ("TPOT ms", "tpot_ms"),
    ("gen tok/s", "throughput_tok_s"),
    ("KV usage", "kv_usage"),
)


def _cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.2f}" if abs(v) < 10 else f"{v:,.0f}"
    return str(v)


def _vs(o: Outcome, today: Outcome, key: str) -> str:
    """A what-if's value with its change against today's."""
    v, base = o.row()[key], today.row()[key]
    if o is today or not isinstance(v, int | float) or not isinstance(base, int | float):
        return _cell(v)
    if base == 0:
        return f"{_cell(v)} (today 0)" if v else _cell(v)
    chance = ""
    if key == "retractions_per_min" and within_chance(o.stats.retracted, today.stats.retracted):
        chance = ", within chance"
    return f"{_cell(v)} ({100 * (v - base) / base:+.0f}%{chance})"


def within_chance(a: float, b: float) -> bool:
    """Two counts of retractions that differ by less than 2 √(a + b): as Poisson counts of one rate
    differ about 95% of the time, so the table cannot tell the what-if from today (log 04: 11 against 13
    retracted in its 21 s)."""
    return a != b and abs(a - b) < 2.0 * math.sqrt(a + b)


def table_rows(p: Proof) -> list[list[str]]:
    today = p.outcomes[0]
    return [[_vs(o, today, key) if key != "what_if" and key != "verdict" else _cell(o.row()[key])
             for _, key in WHAT_IF_COLUMNS] for o in p.outcomes]  # fmt: skip


def _markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = "  | " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |"
    out = [line, "  |" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += ["  | " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    return out


def reconstruction_lines(p: Proof) -> list[str]:
    rec = p.reconstruction
    if rec is None:
        return [f"Reconstruction: {p.problem}"]
    out = [f"Reconstruction from the log alone ({rec.span_s:.0f} s simulated):"]
    for name, inf in rec.figures().items():
        v = inf.value
        shown = f"{v:,.1f}" if isinstance(v, float) else (f"{v:,}" if type(v) is int else v)
        shown = "not shown" if v is None else shown
        out.append(f"  {name.replace('_', ' ')}: {shown} [{inf.confidence}] {inf.how}")
    out.append(f"  cost model [{rec.cost.confidence}]: {rec.cost.how}")
    out.append(
        f"  at the start: {rec.start.running} running, {rec.start.tokens:,} tokens held, "
        f"{rec.start.queue} waiting"
    )
    out += [f"  note: {n}" for n in rec.notes]
    return out


def render_proof_text(p: Proof) -> str:
    out = reconstruction_lines(p)
    if p.reconstruction is None:
        return "\n".join(out)
    out.append("")
    out.append("Replay check (the reconstruction simulated with the server's own flags, against the log):")
    header = ["", "log", "replay", "how close", "ok"]
    rows = [[r.metric, _cell(r.log), _cell(r.replay), r.closeness, "yes" if r.ok else "NO"] for r in p.check]
    out += _markdown(header, rows)
    if not p.reproduced:
        out.append(f"  {p.problem}.")
    out.append("")
    title = "What if (simulated; ranked by retractions per minute, then TTFT p50; % against today)"
    if not p.reproduced:
        title = "What if (NOT a prediction: the replay check failed; shown for reference only)"
    out.append(title + ":")
    out += _markdown([h for h, _ in WHAT_IF_COLUMNS], table_rows(p))
    runs = sum(o.draws for o in p.outcomes)
    averaged = f"; one that retracts: the mean of {DRAWS} draws" if runs > len(p.outcomes) else ""
    out.append(f"  ({len(p.outcomes)} scenarios, {runs} simulations in {p.seconds:.2f} s{averaged})")
    return "\n".join(out)


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="whatif"><tr>{head}</tr>{body}</table>'


def render_proof_html(p: Proof, overlay: str = "") -> str:
    parts = ["<h2>Reconstruction, replay check and what-ifs</h2>"]
    parts.append("<pre>" + escape("\n".join(reconstruction_lines(p))) + "</pre>")
    if p.reconstruction is None:
        return "\n".join(parts)
    rows = [[r.metric, _cell(r.log), _cell(r.replay), r.closeness, "yes" if r.ok else "NO"] for r in p.check]
    parts.append("<h3>Replay check</h3>" + _html_table(["", "log", "replay", "how close", "ok"], rows))
    if not p.reproduced:
        parts.append(f"<p><b>{escape(p.problem or '')}</b></p>")
    parts.append("<h3>What if</h3>" + _html_table([h for h, _ in WHAT_IF_COLUMNS], table_rows(p)))
    parts.append(overlay)
    return "\n".join(parts)
