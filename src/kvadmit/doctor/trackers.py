"""Streaming accumulators: each reads samples or events once and keeps a fixed amount of state (counts,
small histograms, a few quoted lines), so the doctor's memory does not grow with the log.

A *sample* is one observation of one scheduler: a `Prefill batch` / `Decode batch` line, a vLLM status
line, or a metrics scrape. A request *waits* in a sample when the queue is substantial: at least one
request, and at least a tenth of the running count (a queue of 1–2 beside 32 running requests is
arrivals between two scheduling passes, not waiting).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

WAITING_SHARE_OF_RUNNING = 0.1
LOW_USAGE = 0.7  # "well under 0.9": below this the pool is idle while requests wait
USAGE_BINS = 101


@dataclass(slots=True)
class Quote:
    """A line of the input, quoted as evidence."""

    line: int
    text: str
    source: str = ""  # the file, when several inputs were read

    def to_json(self) -> dict[str, object]:
        text = self.text if len(self.text) <= 1000 else self.text[:1000] + " …"
        out: dict[str, object] = {"line": self.line, "text": text}
        if self.source:
            out["source"] = self.source
        return out


def quote(line: int, text: str) -> Quote:
    return Quote(line, text)


def unique(quotes: list[Quote | None]) -> list[Quote]:
    """The quotes given, once each, in line order (None for evidence that is not there)."""
    seen: set[tuple[str, int]] = set()
    out = []
    for q in quotes:
        if q is not None and (q.source, q.line) not in seen:
            seen.add((q.source, q.line))
            out.append(q)
    return sorted(out, key=lambda q: (q.source, q.line))


@dataclass(slots=True)
class Sample:
    line: int
    t: float | None
    kind: str  # "prefill" | "decode" | "vllm" | "metrics"
    stream: str
    running: int | None
    queued: int | None
    usage: float | None
    used: int | None = None  # #token
    throughput: float | None = None  # generation tokens/s
    new_seq: int | None = None
    new_token: int | None = None
    cached: int | None = None
    text: str = ""


@dataclass
class QueueStats:
    """Usage against the queue: how full the pool is while requests wait."""

    samples: int = 0
    with_queue_info: int = 0
    waiting: int = 0
    usage_hist: list[int] = field(default_factory=lambda: [0] * USAGE_BINS)  # waiting samples only
    running_counts: dict[int, int] = field(default_factory=dict)  # running count → waiting samples
    stuck: int = 0  # waiting with nothing running
    stuck_quote: Quote | None = None
    first_wait: Quote | None = None
    last_wait: Quote | None = None
    low_wait: tuple[float, Quote] | None = None  # the lowest usage while waiting
    high_wait: tuple[float, Quote] | None = None
    peak_wait: tuple[int, int, float, Quote] | None = None  # (#token, running, usage) at most #token
    max_usage: tuple[float, Quote] | None = None
    min_usage: float | None = None  # over every sample, waiting or not
    max_queue: tuple[int, Quote] | None = None
    first_queue: int | None = None
    last_queue: int | None = None
    last_quote: Quote | None = None
    waiting_after_retraction: int = 0
    low_after_retraction: int = 0
    low_after_quote: Quote | None = None
    pool_lo: float = 0.0  # the pool size implied by #token / token usage (rounded to 2 decimals)
    pool_hi: float = float("inf")
    pool_points: int = 0

    def add(self, s: Sample, q: Quote, after_retraction: bool) -> bool:
        """Whether requests wait in this sample. Called for every batch line of a big log: plain
        comparisons, no helper calls on the common path."""
        self.samples += 1
        usage = s.usage
        if usage is not None:
            top = self.max_usage
            if top is None or usage > top[0]:
                self.max_usage = (usage, q)
            low = self.min_usage
            if low is None or usage < low:
                self.min_usage = usage
            used = s.used
            if used is not None and usage >= 0.05 and s.kind != "vllm":
                lo, hi = used / (usage + 0.005), used / (usage - 0.005)
                if lo > self.pool_lo:
                    self.pool_lo = lo
                if hi < self.pool_hi:
                    self.pool_hi = hi
                self.pool_points += 1
        queued = s.queued
        if queued is None:
            return False
        self.with_queue_info += 1
        if self.first_queue is None:
            self.first_queue = queued
        self.last_queue = queued
        self.last_quote = q
        top_q = self.max_queue
        if top_q is None or queued > top_q[0]:
            self.max_queue = (queued, q)
        if queued <= 0 or queued < WAITING_SHARE_OF_RUNNING * (s.running or 0):
            return False  # nobody waits, or a queue of one or two beside a big batch: arrivals between passes
        self._waiting(s, q, usage, after_retraction)
        return True

    def _waiting(self, s: Sample, q: Quote, usage: float | None, after_retraction: bool) -> None:
        self.waiting += 1
        if self.first_wait is None:
            self.first_wait = q
        self.last_wait = q
        if s.running is not None:
            # A Prefill line's #running-req is the batch its #new-seq join: under a cap the batch after the
            # join sits at the cap (#running-req: 7, #new-seq: 1 under --max-running-requests 8).
            joined = s.running + (s.new_seq or 0) if s.kind == "prefill" else s.running
            self.running_counts[joined] = self.running_counts.get(joined, 0) + 1
            if s.running == 0:
                self.stuck += 1
                self.stuck_quote = self.stuck_quote or q
        if usage is None:
            return
        self.usage_hist[min(max(round(usage * 100), 0), USAGE_BINS - 1)] += 1
        if self.low_wait is None or usage < self.low_wait[0]:
            self.low_wait = (usage, q)
        if self.high_wait is None or usage > self.high_wait[0]:
            self.high_wait = (usage, q)
        if s.used is not None and s.running and (self.peak_wait is None or s.used > self.peak_wait[0]):
            self.peak_wait = (s.used, s.running, usage, q)
        if after_retraction:
            self.waiting_after_retraction += 1
            if usage < LOW_USAGE:
                self.low_after_retraction += 1
                self.low_after_quote = self.low_after_quote or q

    def usage_quantile(self, p: float) -> float | None:
        """The p-quantile of token usage over the waiting samples (to the printed 2 decimals)."""
        total = sum(self.usage_hist)
        if total == 0:
            return None
        need = p * total
        seen = 0
        for i, n in enumerate(self.usage_hist):
            seen += n
            if seen >= need:
                return i / 100
        return 1.0

    def flat_running(self) -> tuple[int, float] | None:
        """The running count most waiting samples share, and that share (a cap shows as a flat line)."""
        if not self.running_counts:
            return None
        value, n = max(self.running_counts.items(), key=lambda kv: (kv[1], kv[0]))
        return value, n / max(self.waiting, 1)


@dataclass
class PrefillStats:
    """What prefill lines say about requests: prompt sizes, and batches that hit the input budget."""

    batches: int = 0
    admitted: int = 0
    per_request_prompt: set[int] = field(default_factory=set)  # exact (new + cached) / new-seq
    prompt_sizes_capped: bool = False
    max_new_token: tuple[int, Quote] | None = None

    def add(self, s: Sample, q: Quote) -> None:
        self.batches += 1
        if s.new_seq:
            self.admitted += s.new_seq
        if s.new_seq and s.new_token is not None:
            total = s.new_token + (s.cached or 0)
            if total % s.new_seq == 0 and not self.prompt_sizes_capped:
                self.per_request_prompt.add(total // s.new_seq)
                if len(self.per_request_prompt) > 64:
                    self.prompt_sizes_capped = True
                    self.per_request_prompt.clear()
            if self.max_new_token is None or s.new_token > self.max_new_token[0]:
                self.max_new_token = (s.new_token, q)


@dataclass
class RetractStats:
    """Retraction events (one per distinct line after rank de-duplication)."""

    events: int = 0
    requests: int = 0
    forced: int = 0
    duplicate_lines: int = 0
    ranks: set[str] = field(default_factory=set)
    first: Quote | None = None
    last: Quote | None = None
    first_t: float | None = None
    last_t: float | None = None
    biggest_jump: tuple[float, float, float, Quote] | None = None  # (jump, old, new)
    max_new_ratio: float | None = None
    from_floor: int = 0  # events whose old ratio sat at a decayed floor (≤ 0.1)
    wordings: set[str] = field(default_factory=set)
    window: deque[float] = field(default_factory=deque)
    peak_per_minute: int = 0
    gained: int = 0

    def add(self, fields: dict[str, object], t: float | None, q: Quote) -> None:
        if fields.get("forced"):
            self.forced += 1
            return
        self.events += 1
        n = fields.get("num_retracted")
        self.requests += n if isinstance(n, int) else 1
        g = fields.get("new_tokens_gained")
        self.gained += g if isinstance(g, int) else 0
        self.wordings.add(str(fields.get("wording", "")))
        self.first = self.first or q
        self.last = q
        if t is not None:
            self.first_t = t if self.first_t is None else self.first_t
            self.last_t = t
            self.window.append(t)
            while self.window and self.window[0] <= t - 60:
                self.window.popleft()
            self.peak_per_minute = max(self.peak_per_minute, len(self.window))
        old, new = fields.get("old_ratio"), fields.get("new_ratio")
        if isinstance(old, float) and isinstance(new, float):
            jump = new - old
            if self.biggest_jump is None or jump > self.biggest_jump[0]:
                self.biggest_jump = (jump, old, new, q)
            self.max_new_ratio = new if self.max_new_ratio is None else max(self.max_new_ratio, new)
            if old <= 0.1:
                self.from_floor += 1


@dataclass
class StallTracker:
    """Admission after the first retraction: does the queue grow while running requests drain?"""

    started: bool = False
    running_before: int | None = None
    queued_before: int | None = None
    before_quote: Quote | None = None
    last_running: int | None = None
    last_queued: int | None = None
    last_quote: Quote | None = None
    admitted_after: int = 0
    prefills_after: int = 0
    samples_after: int = 0

    def sample(self, s: Sample, q: Quote) -> None:
        if not self.started:
            return
        if s.kind == "prefill":
            self.prefills_after += 1
            self.admitted_after += s.new_seq or 0
        if s.running is not None and s.queued is not None:
            self.samples_after += 1
            self.last_running, self.last_queued, self.last_quote = s.running, s.queued, q

    def retracted(self, history: Iterable[tuple[Sample, Quote]]) -> None:
        """The first retraction: the last sample before it (with a queue) is the 'before'."""
        if self.started:
            return
        for s, q in reversed(list(history)):
            if s.running is not None and s.queued is not None:
                self.running_before, self.queued_before, self.before_quote = s.running, s.queued, q
                break
        self.started = True


@dataclass
class Failures:
    """Crashes and aborts, by kind, with a few quoted lines each."""

    counts: dict[str, int] = field(default_factory=dict)
    quotes: dict[str, list[Quote]] = field(default_factory=dict)
    releases: set[str] = field(default_factory=set)  # wording of the last-request failure
    graceful: int = 0
    health_probes: int = 0
    error_types: dict[str, int] = field(default_factory=dict)
    http_5xx: int = 0
    kv_alloc_phases: set[str] = field(default_factory=set)  # "decode", "prefill", "" (not said)
    kv_alloc_asked: int | None = None  # the KV allocation failure's "Try to allocate N tokens."
    kv_alloc_free: int | None = None  # and its "Available tokens: N"

    def add(self, kind: str, q: Quote, keep: int = 3) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        kept = self.quotes.setdefault(kind, [])
        if len(kept) < keep:
            kept.append(q)

    def count(self, kind: str) -> int:
        return self.counts.get(kind, 0)


@dataclass
class VllmPreemptions:
    """vLLM V0's preemption warnings: one per 50 preemptions, with the cumulative count."""

    warnings: int = 0
    first: tuple[float | None, int | None, Quote] | None = None
    last: tuple[float | None, int | None, Quote] | None = None
    modes: set[str] = field(default_factory=set)
    start_t: float | None = None  # when the run began, from a progress bar's elapsed time
    max_swapped: tuple[int, Quote] | None = None

    def add(self, fields: dict[str, object], t: float | None, q: Quote) -> None:
        self.warnings += 1
        cum = fields.get("cumulative")
        entry = (t, cum if isinstance(cum, int) else None, q)
        self.first = self.first or entry
        self.last = entry
        mode = fields.get("mode")
        if isinstance(mode, str):
            self.modes.add(mode)

    def elapsed(self, t: float | None, elapsed_s: float) -> None:
        if t is not None and self.start_t is None:
            self.start_t = t - elapsed_s
