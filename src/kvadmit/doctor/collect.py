"""The collector: every parsed line of a log goes through `add` once, into the trackers and the timeline.

Rank de-duplication: under tensor parallelism every rank prints the same event (`[… TP0] Decode out of
memory happened …`, then TP5, TP7 …). Lines with the same timestamp and the same message count once per
rank: the event count for a (timestamp, message) is the most any single rank printed it, so one rank
printing a line twice still counts twice, and eight ranks printing it once count once. Data-parallel
ranks (DP3, …) run schedulers of their own, so their lines are never merged with each other's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvadmit.doctor import parse
from kvadmit.doctor.collapse_tracker import CollapseTracker
from kvadmit.doctor.lasted import LastedTracker
from kvadmit.doctor.parse import Parsed
from kvadmit.doctor.timeline import Marker, Timeline
from kvadmit.doctor.trackers import (
    Failures,
    PrefillStats,
    QueueStats,
    Quote,
    RetractStats,
    Sample,
    StallTracker,
    VllmPreemptions,
    quote,
)
from kvadmit.doctor.waves import WaveEstimator

MAX_METRIC_LINES = 100_000
_UNKNOWN_EXAMPLES = 5
_FAILURE_KINDS = {
    parse.LAST_REQUEST: "last_request",
    parse.GPU_OOM: "gpu_oom",
    parse.KV_ALLOC: "kv_alloc",
    parse.ABORT: "abort",
    parse.HEALTH_FAIL: "health_fail",
    parse.ERROR: "error",
}


@dataclass
class Collected:
    """Everything the findings need from one log."""

    lines: int = 0
    recognised: int = 0
    unknown: int = 0
    unknown_examples: list[Quote] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)
    duplicate_rank_lines: int = 0
    ranks: set[str] = field(default_factory=set)
    schedulers: set[str] = field(default_factory=set)
    t_first: float | None = None
    t_last: float | None = None
    whole_seconds: bool = True
    startup: dict[str, object] = field(default_factory=dict)
    startup_quote: Quote | None = None
    queue: QueueStats = field(default_factory=QueueStats)
    prefill: PrefillStats = field(default_factory=PrefillStats)
    retract: RetractStats = field(default_factory=RetractStats)
    collapse: CollapseTracker = field(default_factory=CollapseTracker)
    stall: StallTracker = field(default_factory=StallTracker)
    failures: Failures = field(default_factory=Failures)
    vllm: VllmPreemptions = field(default_factory=VllmPreemptions)
    waves: WaveEstimator = field(default_factory=WaveEstimator)
    lasted: LastedTracker = field(default_factory=LastedTracker)
    timeline: Timeline = field(default_factory=Timeline)
    metric_lines: list[str] = field(default_factory=list)
    metric_line_numbers: list[int] = field(default_factory=list)
    engine: set[str] = field(default_factory=set)  # "sglang", "vllm"

    @property
    def span_s(self) -> float | None:
        """Seconds the log covers (whole-second stamps cover up to one second more than they differ)."""
        if self.t_first is None or self.t_last is None:
            return None
        return self.t_last - self.t_first + (1.0 if self.whole_seconds else 0.0)


class Collector:
    def __init__(self) -> None:
        self.c = Collected()
        self._dedupe_ts = ""
        self._seen: dict[str, dict[str, int]] = {}
        self._wave_stream: str | None = None
        self._day = 0.0
        self._last_raw_t: float | None = None
        self._last_x: float | None = None
        self._history: deque[tuple[Sample, Quote]] = deque(maxlen=32)  # the latest samples
        self._after_retraction = False

    def add_unknown(self, lineno: int, text: str) -> None:
        c = self.c
        c.lines += 1
        if not text.strip():
            return
        c.unknown += 1
        if len(c.unknown_examples) < _UNKNOWN_EXAMPLES:
            c.unknown_examples.append(quote(lineno, text))

    def add(self, lineno: int, rec: Parsed, text: str) -> None:
        """One recognised line; `text` is the line as read (quoted verbatim as evidence)."""
        c = self.c
        c.lines += 1
        c.recognised += 1
        kind = rec.kind
        kinds = c.kinds
        kinds[kind] = kinds.get(kind, 0) + 1
        raw = rec.t
        t = None if raw is None else (self._last_x if raw == self._last_raw_t else self._time(rec.ts, raw))
        rank = rec.rank
        if kind is parse.METRIC:
            if len(c.metric_lines) < MAX_METRIC_LINES:
                c.metric_lines.append(rec.body)
                c.metric_line_numbers.append(lineno)
            return
        if kind is parse.HTTP or kind is parse.TRACEBACK or kind is parse.PROGRESS:
            self._other(kind, rec, t, lineno, text)
            return
        if rank:
            if len(c.ranks) < 256:
                c.ranks.add(rank)
            if kind is parse.RETRACT and len(c.retract.ranks) < 64:
                c.retract.ranks.add(rank)
            if self._duplicate(rec):
                c.duplicate_rank_lines += 1
                if kind is parse.RETRACT:
                    c.retract.duplicate_lines += 1
                return
        q = Quote(lineno, text)
        if kind is parse.DECODE or kind is parse.PREFILL or kind is parse.VLLM_STATUS:
            self._sample(kind, rec, t, q)
        elif kind is parse.RETRACT:
            c.engine.add("sglang")
            c.retract.add(rec.fields, t, q)
            if not rec.fields.get("forced"):
                self._retraction_seen(q)
                old, new = rec.fields.get("old_ratio"), rec.fields.get("new_ratio")
                label = f"{old:.4f} -> {new:.4f}" if isinstance(old, float) and isinstance(new, float) else ""
                n = rec.fields.get("num_retracted")
                c.timeline.mark(Marker(t, lineno, "retract", n if isinstance(n, int) else 1, label))
        elif kind is parse.STARTUP:
            c.engine.add("sglang")
            if not c.startup:
                c.startup = dict(rec.fields)
                c.startup_quote = q
        elif kind is parse.VLLM_PREEMPT:
            c.engine.add("vllm")
            c.vllm.add(rec.fields, t, q)
            self._retraction_seen(q)
            c.timeline.mark(Marker(t, lineno, "retract", 1, "preempted"))
        elif kind in _FAILURE_KINDS:
            self._failure(kind, rec, t, q)
        elif kind is parse.KV_ALLOC_DETAIL:
            c.failures.add("kv_alloc_detail", q, keep=2)
            asked, free = rec.fields.get("asked"), rec.fields.get("free")
            if isinstance(asked, int):
                c.failures.kv_alloc_asked = asked
            if isinstance(free, int):
                c.failures.kv_alloc_free = free

    # -- helpers -------------------------------------------------------------------------------------

    def add_batch(
        self, lineno: int, text: str, kind: str, ts: str, raw: float | None, values: tuple[object, ...]
    ) -> None:
        """A batch line from `LineParser.fast_batch` (plain timestamp, no rank tags): straight to a sample."""
        c = self.c
        c.lines += 1
        c.recognised += 1
        kinds = c.kinds
        kinds[kind] = kinds.get(kind, 0) + 1
        t = None if raw is None else (self._last_x if raw == self._last_raw_t else self._time(ts, raw))
        if not c.engine:
            c.engine.add("sglang")
        running, queued, usage, used, tput, new_seq, new_token, cached = values
        s = Sample(lineno, t, kind, "", running, queued, usage, used, tput, new_seq, new_token, cached, text)  # type: ignore[arg-type]
        self.add_sample(s, Quote(lineno, text))

    def _time(self, ts: str, raw: float | None) -> float | None:
        """Seconds since the log's first timestamp (the caller reuses the last answer for the same stamp)."""
        c = self.c
        if raw is None:
            return None
        if len(ts) <= 8 and self._last_raw_t is not None and raw < self._last_raw_t - 43_200:
            self._day += 86_400.0  # a time-only stamp passed midnight
        self._last_raw_t = raw
        raw += self._day
        if c.whole_seconds and raw != int(raw):
            c.whole_seconds = False
        if c.t_first is None:
            c.t_first = raw
        c.t_last = raw if c.t_last is None else max(c.t_last, raw)
        self._last_x = raw - c.t_first
        return self._last_x

    def _duplicate(self, rec: Parsed) -> bool:
        """Whether another rank already printed this event (only asked for lines with rank tags)."""
        if rec.ts != self._dedupe_ts or len(self._seen) > 4096:
            self._seen.clear()
            self._dedupe_ts = rec.ts
        # Data-parallel ranks are separate schedulers: only ranks of one scheduler repeat its events.
        key = rec.scheduler + "\0" + rec.body
        counts = self._seen.get(key)
        if counts is None:
            self._seen[key] = {rec.rank: 1, "\0max": 1}
            return False
        mine = counts.get(rec.rank, 0) + 1
        counts[rec.rank] = mine
        if mine > counts["\0max"]:
            counts["\0max"] = mine
            return False
        return True

    def _sample(self, kind: str, rec: Parsed, t: float | None, q: Quote) -> None:
        c = self.c
        if kind is parse.VLLM_STATUS:
            f = rec.fields
            c.engine.add("vllm")
            pct = f.get("gpu_usage_pct")
            s = Sample(
                q.line,
                t,
                "vllm",
                rec.scheduler,
                _int(f.get("running_req")),
                _int(f.get("queue_req")),
                pct / 100 if isinstance(pct, float) else None,
                throughput=_float(f.get("gen_throughput")),
                text=q.text,
            )
            swapped = f.get("swapped_req")
            if isinstance(swapped, int) and (c.vllm.max_swapped is None or swapped > c.vllm.max_swapped[0]):
                c.vllm.max_swapped = (swapped, q)
            elapsed = f.get("elapsed_s")
            if isinstance(elapsed, float):
                c.vllm.elapsed(t, elapsed)
        else:
            c.engine.add("sglang")
            running, queued, usage, used, tput, new_seq, new_token, cached = rec.values  # type: ignore[misc]
            # Types as the format definitions give them (ints, floats or None).
            s = Sample(
                q.line,
                t,
                kind,
                rec.scheduler,
                running,
                queued,
                usage,
                used,
                tput,
                new_seq,
                new_token,
                cached,
                q.text,
            )  # type: ignore[arg-type]
        if rec.scheduler and len(c.schedulers) < 256:
            c.schedulers.add(rec.scheduler)
        self.add_sample(s, q)

    def add_sample(self, s: Sample, q: Quote) -> None:
        """One observation of a scheduler (also used for metrics scrapes). Called for most lines of a big
        log, so the trackers that only matter after a retraction are not called before one."""
        c = self.c
        if c.queue.add(s, q, self._after_retraction):
            c.lasted.sample(s, q, True)
        elif s.queued is not None:
            c.lasted.sample(s, q, False)
        kind = s.kind
        prefill = kind == "prefill"
        if prefill:
            c.prefill.add(s, q)
        self._history.append((s, q))
        if self._after_retraction:
            c.collapse.sample(s, q)
            c.stall.sample(s, q)
        elif s.throughput is not None:
            c.collapse.watch(s, q)
        elif prefill:
            c.collapse.prefills += 1
        waves = c.waves
        if not waves.broken:
            if self._wave_stream is None:
                self._wave_stream = s.stream
            if s.stream == self._wave_stream:
                if prefill:
                    waves.prefill(s.running, s.queued, s.new_seq, s.new_token, s.cached)
                elif kind == "decode":
                    waves.decode(s.running, s.used)
        running = s.running if not prefill or s.running is None else s.running + (s.new_seq or 0)
        admitted = (s.new_seq or 0) if prefill else None
        c.timeline.add(s.stream, s.t, s.line, s.usage, running, s.queued, s.throughput, s.used, admitted)

    def _retraction_seen(self, q: Quote) -> None:
        """A retraction (or a preemption): the trackers of what follows one start from recent history."""
        c = self.c
        c.collapse.retracted(q, self._history)
        c.stall.retracted(self._history)
        self._after_retraction = True

    def _failure(self, kind: str, rec: Parsed, t: float | None, q: Quote) -> None:
        c = self.c
        c.failures.add(_FAILURE_KINDS[kind], q)
        if kind == parse.LAST_REQUEST:
            c.engine.add("sglang")
            c.failures.releases.add(str(rec.fields.get("release", "")))
            if rec.fields.get("graceful"):
                c.failures.graceful += 1
            c.timeline.mark(Marker(t, q.line, "oom", 1, str(rec.fields.get("release", ""))))
        elif kind == parse.GPU_OOM:
            c.timeline.mark(Marker(t, q.line, "oom", 1, "GPU out of memory"))
        elif kind == parse.KV_ALLOC:
            c.engine.add("sglang")
            c.failures.kv_alloc_phases.add(str(rec.fields.get("phase", "")))
            c.timeline.mark(Marker(t, q.line, "oom", 1, "KV pool allocation failed"))
        elif kind == parse.ABORT:
            c.timeline.mark(Marker(t, q.line, "abort", 1, "abort"))
        elif kind == parse.HEALTH_FAIL:
            c.timeline.mark(Marker(t, q.line, "health", 1, "health check failed"))
        elif kind == parse.ERROR:
            name = str(rec.fields.get("type", ""))
            if len(c.failures.error_types) < 64 or name in c.failures.error_types:
                c.failures.error_types[name] = c.failures.error_types.get(name, 0) + 1

    def _other(self, kind: str, rec: Parsed, t: float | None, lineno: int, text: str) -> None:
        c = self.c
        if kind == parse.HTTP:
            path = str(rec.fields.get("path", ""))
            status = rec.fields.get("status")
            if path.startswith("/health"):
                c.failures.health_probes += 1
            elif isinstance(status, int) and status >= 500:
                c.failures.http_5xx += 1
                c.failures.add("http_5xx", quote(lineno, text))
        elif kind == parse.PROGRESS:
            elapsed = rec.fields.get("elapsed_s")
            if isinstance(elapsed, float):
                c.vllm.elapsed(t, elapsed)
        elif kind == parse.TRACEBACK:
            c.failures.add("traceback", quote(lineno, text))


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _float(v: object) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, float):
        return v
    if isinstance(v, int):
        return float(v)
    return None
