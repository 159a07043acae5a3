"""The terminal report (verdict first, then its evidence and advice, then the other findings) and JSON."""

from __future__ import annotations

import json
import textwrap
from typing import TYPE_CHECKING

from kvadmit.doctor.model import Diagnosis, Finding
from kvadmit.doctor.rates import duration

if TYPE_CHECKING:
    from kvadmit.doctor.prove import Proof

WIDTH = 110


def _wrap(text: str, indent: str) -> list[str]:
    rest = " " * len(indent) + "  "
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=rest) or [indent]


def _finding(f: Finding, lead: bool) -> list[str]:
    out: list[str] = []
    if lead:
        out.append(f"Verdict: {f.verdict}")
        out += _wrap(f.title, "  ")
    else:
        tag = f"[{f.verdict}]" if f.verdict else f"[{f.kind}]"
        out += _wrap(f"{tag} {f.title}", "* ")
    for line in f.explanation:
        out += _wrap(line, "  ")
    if f.evidence:
        out.append("  Evidence:")
        for q in f.evidence:
            where = f"{q.source}:" if q.source else "line "
            text = q.text if len(q.text) <= 220 else q.text[:220] + " …"
            out.append(f"    {where}{q.line}: {text}")
    if f.advice:
        out.append("  What to do:")
        for a in f.advice:
            out += _wrap(a, "    - ")
    return out


def render_text(d: Diagnosis, proof: Proof | None = None) -> str:
    """The verdict and its evidence first; then the other findings; then what was read."""
    out: list[str] = _finding(d.lead, lead=True)
    rest = d.findings[1:]
    if rest:
        out.append("")
        out.append("Also:")
        for f in rest:
            out += _finding(f, lead=False)
    out.append("")
    for inp in d.inputs:
        span = f", {duration(inp.span_s)} of log" if inp.span_s else ""
        if inp.kind == "log":
            out.append(
                f"Read {inp.source}: {inp.lines:,} lines, {inp.recognised:,} recognised, "
                f"{inp.unknown:,} not recognised{span}"
            )
        else:
            out.append(f"Read {inp.source}: {inp.kind}, {inp.lines:,} samples")
        for note in inp.notes:
            out.append(f"  note: {note}")
    unknown = [q for inp in d.inputs for q in inp.unknown_examples]
    if unknown:
        total = sum(inp.unknown for inp in d.inputs)
        out.append(f"Lines not recognised: {total:,} (counted, not used). First:")
        for q in unknown[:3]:
            text = q.text if len(q.text) <= 160 else q.text[:160] + " …"
            out.append(f"  line {q.line}: {text}")
    if proof is not None:
        out += ["", proof_text(proof)]
    return "\n".join(out)


def proof_text(proof: Proof) -> str:
    """The reconstruction, replay check and what-if table (whatif_report.py)."""
    from kvadmit.doctor.whatif_report import render_proof_text

    return render_proof_text(proof)


def render_json(d: Diagnosis, proof: Proof | None = None) -> str:
    out = d.to_json()
    if proof is not None:
        out["what_if"] = proof.to_json()
    return json.dumps(out, indent=1, default=str)
