"""Reading `Prefill batch` / `Decode batch` lines as real logs print them, not only as 0.5.22 does.

The exact formats live in loglines.py; real logs vary around them (logs/README.md): `Decode batch.` and
`Decode batch,`, with or without `#pending-token`, extra fields (speculative decoding's `accept len`,
PD decode's `#retracted-req`, `cache hit rate`), a trailing `, `, a timestamp with or without brackets,
a rank tag (`TP0`, `DP3 TP3 EP3`), or no prefix at all. This reader takes each `label: value` pair after
the marker and names it as loglines' templates do (`#running-req` → running_req); labels the templates do
not know keep a slug of their own text. A line holding only `…` or `...` marks lines left out of an
excerpt (the mission document quotes logs that way), so what comes after it does not continue what came
before.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from kvadmit.observe import loglines

_MARKER = re.compile(r"\b(Prefill|Decode) batch(?: \[\d+\])?[.,]\s*")
_TIMESTAMP = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})")
_RANK = re.compile(r"\b(?:DP|TP|PP|EP)\d+\b")
_GRAPH_LABEL = re.compile(r"^(?:cuda|cpu|npu|musa) graph$")
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?%?$")
_GAP = frozenset({"…", "...", "[...]", "[…]"})

Value = int | float | bool | str


def _template_labels(*formats: loglines.LineFormat) -> dict[str, str]:
    """label text → field name, from the `label: {field}` pairs of the exact templates."""
    labels: dict[str, str] = {}
    for fmt in formats:
        for m in re.finditer(r"(?:^|, )([^{}:,]+): \{(\w+)", fmt.template):
            labels[m.group(1).strip()] = m.group(2)
    return labels


_LABELS = _template_labels(loglines.PREFILL, loglines.DECODE)


def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")


def _value(raw: str) -> Value:
    raw = raw.strip()
    if raw in ("True", "False"):
        return raw == "True"
    if _NUMBER.match(raw):
        number = raw.rstrip("%")
        return float(number) if any(c in number for c in ".eE") else int(number)
    return raw


@dataclass(frozen=True, slots=True)
class BatchLine:
    kind: Literal["prefill", "decode"]
    time: datetime | None
    stream: str  # the rank tag ("TP0", "DP3 TP3 EP3"), "" without one
    fields: dict[str, Value] = field(default_factory=dict)
    line_no: int = 0
    # How many excerpt gaps (`…` lines) came before it: lines in different segments do not follow
    # each other.
    segment: int = 0

    def number(self, name: str) -> float | None:
        value = self.fields.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value)


def parse_batch_line(text: str, line_no: int = 0, segment: int = 0) -> BatchLine | None:
    m = _MARKER.search(text)
    if m is None:
        return None
    prefix = text[: m.start()]
    ts = _TIMESTAMP.search(prefix)
    when = datetime.strptime(f"{ts.group(1)} {ts.group(2)}", "%Y-%m-%d %H:%M:%S") if ts else None
    stream = " ".join(_RANK.findall(prefix))
    values: dict[str, Value] = {}
    for piece in text[m.end() :].split(", "):
        label, sep, raw = piece.partition(": ")
        if not sep:
            continue
        label = label.strip()
        if _GRAPH_LABEL.match(label):
            values["graph"] = _value(raw)
            continue
        values[_LABELS.get(label, _slug(label))] = _value(raw)
    kind: Literal["prefill", "decode"] = "prefill" if m.group(1) == "Prefill" else "decode"
    return BatchLine(kind, when, stream, values, line_no, segment)


def read_batch_lines(lines: Iterable[str]) -> list[BatchLine]:
    """Every batch line, in order, with its excerpt segment."""
    out: list[BatchLine] = []
    segment = 0
    for no, text in enumerate(lines, 1):
        if text.strip() in _GAP:
            segment += 1
            continue
        parsed = parse_batch_line(text, no, segment)
        if parsed is not None:
            out.append(parsed)
    return out
