"""Reading log lines as real logs print them, not only as 0.5.22 does: the line's prefix (timestamp and
rank tags) and the fields of `Prefill batch` / `Decode batch` lines. The doctor (doctor/parse.py) and
calibrate (costmodel/) both read through this.

The exact formats live in loglines.py; real logs vary around them (logs/README.md): `Decode batch.`,
`Decode batch,` or no punctuation, with or without `#pending-token`, extra fields (speculative decoding's
`accept len`, PD decode's `#retracted-req`, `cache hit rate`), a trailing `, `.

The prefix: `[2026-09-13 16:06:04] `, `[2025-06-12 11:41:56 TP0] `, `2025-02-19 11:45:37 TP0] ` (no
bracket), `2025-10-20 03:02:22 INFO 31223 [DP3 TP3 EP3 file.py:222] `, vLLM's `INFO 06-16 21:24:15
metrics.py:341] ` (no year), a time of day alone, or nothing at all. Rank tags are TP, DP, PP, EP, CP,
ATTN_DP and MOE_EP with their numbers; a DP (or ATTN_DP) tag names the scheduler.

A batch line's `label: value` pairs are named as loglines' templates (of every release) name them
(`#running-req` → running_req) and typed as they type them (a value of another type, `nan` say, is no
reading); a `<device> graph` label is `graph`; labels the templates do not know keep a slug of their
text and a value read as a number (`%` dropped), a bool or the text.

A line holding only `…` or `...` marks lines left out of an excerpt (the mission document quotes logs
that way), so what comes after it does not continue what came before.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from kvadmit.observe import loglines

BATCH_MARKER = re.compile(r"(Prefill|Decode) batch(?: \[\d+\])?[.,]?\s*")
TIMESTAMP = re.compile(r"(?:(\d{4})-)?(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:[.,](\d+))?")
_TIME_ONLY = re.compile(r"(?:^|[\[ ])(\d\d):(\d\d):(\d\d)(?:[.,]\d+)?(?=[\] ])")
RANK_TAG = re.compile(r"\b(?:TP|DP|PP|EP|CP|ATTN_DP|MOE_EP)\d+\b")
_GRAPH_LABEL = re.compile(r"^\w+ graph$")
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?%?$")
_GAP = frozenset({"…", "...", "[...]", "[…]"})
_BATCH_FIELDS = loglines.FieldReader(loglines.BATCH_FORMATS)
_EPOCH = datetime(1970, 1, 1)

Value = int | float | bool | str


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


def timestamp_seconds(m: re.Match[str]) -> float | None:
    """Seconds (UTC) of a TIMESTAMP match; a date without a year is taken in 2000 (vLLM prints none: only
    differences matter). None for an impossible date."""
    year = int(m.group(1)) if m.group(1) else 2000
    month, day = int(m.group(2)), int(m.group(3))
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    hour, minute, sec = int(m.group(4)), int(m.group(5)), int(m.group(6))
    frac = float("0." + m.group(7)) if m.group(7) else 0.0
    try:
        return calendar.timegm((year, month, day, hour, minute, sec, 0, 0, 0)) + frac
    except (ValueError, OverflowError):
        return None


class PrefixReader:
    """Reads the text before a line's message; remembers the last timestamp's conversion (a log has many
    lines per second)."""

    def __init__(self) -> None:
        self._ts_text = ""
        self._ts_value: float | None = None

    def seconds(self, ts: str, m: re.Match[str] | None = None) -> float | None:
        """The seconds of a timestamp's text (m: its TIMESTAMP match, when already made)."""
        if ts != self._ts_text:
            m = m or TIMESTAMP.match(ts)
            self._ts_text, self._ts_value = ts, (timestamp_seconds(m) if m else None)
        return self._ts_value

    def read(self, prefix: str) -> tuple[str, float | None, str, str]:
        """(timestamp as written, its seconds, the rank tags ("TP0", "DP3 TP3 EP3"), the scheduler's DP
        tag); "" or None for what the prefix lacks. A time of day alone counts seconds from midnight."""
        ts, t, rank, scheduler = "", None, "", ""
        m = TIMESTAMP.search(prefix)
        if m is not None:
            ts = m.group(0)
            t = self.seconds(ts, m)
        else:
            m2 = _TIME_ONLY.search(prefix)
            if m2 is not None:
                ts = m2.group(0).strip("[ ")
                t = float(int(m2.group(1)) * 3600 + int(m2.group(2)) * 60 + int(m2.group(3)))
        if "P" in prefix:  # every rank tag has one
            tags = RANK_TAG.findall(prefix)
            if tags:
                rank = " ".join(tags)
                scheduler = next((tag for tag in tags if tag.startswith(("DP", "ATTN_DP"))), "")
        return ts, t, rank, scheduler


def read_batch_fields(body: str) -> dict[str, Value]:
    """The `label: value` pairs of a batch line's text after its marker."""
    values: dict[str, Value] = {}
    for piece in body.split(", "):
        label, sep, raw = piece.partition(": ")
        if not sep:
            continue
        label = label.strip()
        if _GRAPH_LABEL.match(label):
            values["graph"] = _value(raw)
            continue
        typed, _ = _BATCH_FIELDS.read(piece)
        if typed:
            values.update(typed)
        elif label not in _BATCH_FIELDS.segments:  # a known label's value of another type: no reading
            values[_slug(label)] = _value(raw)
    return values


_PREFIX = PrefixReader()


def parse_batch_line(text: str, line_no: int = 0, segment: int = 0) -> BatchLine | None:
    m = BATCH_MARKER.search(text)
    if m is None:
        return None
    _, t, stream, _ = _PREFIX.read(text[: m.start()])
    # Whole seconds, as SGLang prints them (a fraction some loggers add is left out).
    when = _EPOCH + timedelta(seconds=int(t)) if t is not None else None
    kind: Literal["prefill", "decode"] = "prefill" if m.group(1) == "Prefill" else "decode"
    return BatchLine(kind, when, stream, read_batch_fields(text[m.end() :]), line_no, segment)


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
