"""What the reconstruction reads from a log: the batch lines, retractions, finished requests (HTTP access
lines) and the start-up line, each with its time in seconds. One pass, through the doctor's own line
parser (parse.py), kept apart from the verdict's collector so that the two can change independently."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kvadmit.doctor.parse import DECODE, HTTP, PREFILL, RETRACT, STARTUP, LineParser
from kvadmit.doctor.source import LogSource

# Paths whose 200 answer ends a generation request (a non-streamed request is answered when it finishes).
GENERATE_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
# The flags a reconstruction takes from SGLang's `server_args=ServerArgs(...)` start-up line, when shown.
SERVER_ARGS_HEAD = "server_args=ServerArgs("
_SERVER_ARG = re.compile(
    r"\b(decode_log_interval|schedule_conservativeness|disable_overlap_schedule|page_size|schedule_policy)"
    r"=('?)([\w.+-]+)\2[,)]"
)


@dataclass(frozen=True, slots=True)
class Decode:
    t: float
    running: int
    tokens: int | None  # #token
    usage: float | None
    queue: int | None
    gen_throughput: float | None


@dataclass(frozen=True, slots=True)
class Prefill:
    t: float
    new_seq: int
    new_token: int
    cached: int
    usage: float | None
    running: int | None
    queue: int | None


@dataclass(frozen=True, slots=True)
class Retract:
    t: float
    count: int
    gained: int | None
    old_ratio: float | None
    new_ratio: float | None


@dataclass(slots=True)
class Observed:
    decodes: list[Decode] = field(default_factory=list)
    prefills: list[Prefill] = field(default_factory=list)
    retracts: list[Retract] = field(default_factory=list)
    finishes: list[float] = field(default_factory=list)  # times of `POST /generate … 200` lines
    startup: dict[str, object] = field(default_factory=dict)
    server_args: dict[str, str] = field(default_factory=dict)  # from a server_args=ServerArgs(...) line
    batch_texts: list[str] = field(default_factory=list)  # for calibrate
    events: list[Decode | Prefill | Retract] = field(default_factory=list)  # in the log's order
    untimed_batch_lines: int = 0

    @property
    def times(self) -> list[float]:
        return [d.t for d in self.decodes] + [p.t for p in self.prefills]

    @property
    def span(self) -> tuple[float, float] | None:
        ts = self.times
        return (min(ts), max(ts)) if ts else None


def _int(v: object) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _float(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def read_observed(path: str) -> Observed:
    """The lines the reconstruction uses, from a log file (a second pass over it)."""
    obs = Observed()
    parser = LineParser()
    src = LogSource(path)
    try:
        for _, text in src.lines():
            _add(obs, parser, text)
    finally:
        src.close()
    return obs


def observe_lines(lines: list[str]) -> Observed:
    """The same from lines in memory (a simulated log)."""
    obs = Observed()
    parser = LineParser()
    for text in lines:
        _add(obs, parser, text)
    return obs


def _add(obs: Observed, parser: LineParser, text: str) -> None:
    if SERVER_ARGS_HEAD in text:
        obs.server_args = {m.group(1): m.group(3) for m in _SERVER_ARG.finditer(text)}
        return
    rec = parser.parse(text)
    if rec is None:
        return
    if rec.kind == STARTUP:
        obs.startup = dict(rec.fields)
        return
    other_rank = rec.rank and "TP0" not in rec.rank.split()  # one rank's lines: TP ranks repeat them
    if rec.t is None or other_rank or rec.scheduler not in ("", "0", "DP0"):
        if rec.kind in (DECODE, PREFILL):
            obs.untimed_batch_lines += rec.t is None
        return
    f = rec.fields
    if rec.kind == DECODE:
        running = _int(f.get("running_req"))
        if running is None:
            return
        obs.batch_texts.append(text)
        d = Decode(
            rec.t, running, _int(f.get("num_used_tokens")), _float(f.get("token_usage")),
            _int(f.get("queue_req")), _float(f.get("gen_throughput")),
        )  # fmt: skip
        obs.decodes.append(d)
        obs.events.append(d)
    elif rec.kind == PREFILL:
        new_seq, new_token = _int(f.get("new_seq")), _int(f.get("new_token"))
        if new_seq is None or new_token is None:
            return
        obs.batch_texts.append(text)
        p = Prefill(
            rec.t, new_seq, new_token, _int(f.get("cached_token")) or 0, _float(f.get("token_usage")),
            _int(f.get("running_req")), _int(f.get("queue_req")),
        )  # fmt: skip
        obs.prefills.append(p)
        obs.events.append(p)
    elif rec.kind == RETRACT and not f.get("forced"):
        count = _int(f.get("num_retracted")) or 1
        ratio_old, ratio_new = _float(f.get("old_ratio")), _float(f.get("new_ratio"))
        r = Retract(rec.t, count, _int(f.get("new_tokens_gained")), ratio_old, ratio_new)
        obs.retracts.append(r)
        obs.events.append(r)
    elif rec.kind == HTTP and f.get("status") == 200 and f.get("method") == "POST":
        path = str(f.get("path", "")).split("?")[0]
        if path in GENERATE_PATHS:
            obs.finishes.append(rec.t)
