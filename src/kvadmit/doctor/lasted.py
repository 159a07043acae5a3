"""The state that lasted: how long each state of the scheduler held over the log, in fixed memory.

A verdict should rest on what the server did most of the time, not on its single fullest or emptiest
moment. Every sample with a queue size is given the time until the next timestamp: SGLang stamps whole
seconds, so the samples sharing one stamp split the second between them, and the last stamp of a
whole-second log counts one second (as the log's span does). Gaps longer than GAP_CAP_S (an excerpt's
hole, or an idle server that prints nothing) count GAP_CAP_S. From that:

* the time requests waited, and a histogram of token usage weighted by time while they waited;
* *stretches*: intervals while requests wait and no prefill runs (the scheduler admits nobody). A stretch
  *stalls* when it lasts at least STALL_MIN_S and requests finish in it (the running count or the usage
  falls) with usage under STALL_MAX_USAGE: room frees up and still nobody is admitted, so the forecast
  holds back far more than the running requests use (a raised new-token ratio, docs/sglang-rules.md §2).
  The stall goes on through the trickle of admission after it while requests still wait, usage stays
  STALL_TRICKLE_GAP under where the stretch began and fewer are admitted than finished in the stretch;
* a *prefill-bound burst*: the prefill batches while requests wait, by #new-token (to tell batches cut at
  the chunked-prefill budget), and the queue and usage at the first and last waiting sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvadmit.doctor.trackers import USAGE_BINS, WAITING_SHARE_OF_RUNNING, Quote, Sample

GAP_CAP_S = 60.0
STALL_MIN_S = 3.0
STALL_MAX_USAGE = 0.85  # "well below full": the pool the forecast fills runs at 0.9 and more
STALL_USAGE_FALL = 0.05  # usage falling this much in a stretch: requests finished
STALL_TRICKLE_GAP = 0.05  # after a stall, usage this far under its top: the freed room is not refilled
_MAX_TOKEN_SIZES = 64  # distinct #new-token values counted (the budget is one of the commonest)


class Stretch:
    """Waiting with no prefill: from its first sample to the prefill (or last sample) that ends it. The
    samples are kept as they came (no copies on the path every batch line takes)."""

    __slots__ = ("end", "first", "last", "t0", "top", "top_s")

    def __init__(self, s: Sample, t: float) -> None:
        self.t0 = t
        self.end: float | None = None  # the prefill that ended it, when one did
        self.first: Sample = s
        self.last: Sample = s
        self.top = s.usage if s.usage is not None else -1.0  # the fullest moment in it
        self.top_s: Sample = s

    @property
    def top_q(self) -> Quote:
        return quoted(self.top_s)

    @property
    def last_q(self) -> Quote:
        return quoted(self.last)

    @property
    def seconds(self) -> float:
        end = self.end if self.end is not None else self.last.t
        return (end or self.t0) - self.t0

    @property
    def queued0(self) -> int:
        return self.first.queued or 0

    @property
    def queued1(self) -> int:
        return self.last.queued or 0

    @property
    def running0(self) -> int | None:
        return self.first.running

    @property
    def running1(self) -> int | None:
        return self.last.running

    @property
    def usage1(self) -> float | None:
        return self.last.usage

    def stalled(self) -> bool:
        end = self.last.usage
        if self.seconds < STALL_MIN_S or self.last is self.first or end is None or end >= STALL_MAX_USAGE:
            return False
        r0, r1 = self.first.running, self.last.running
        fell_running = r0 is not None and r1 is not None and r0 - r1 >= max(2, WAITING_SHARE_OF_RUNNING * r0)
        return fell_running or max(self.top, end) - end >= STALL_USAGE_FALL


@dataclass(slots=True)
class LastedTracker:
    timed_s: float = 0.0  # seconds covered by samples with a queue size
    waiting_s: float = 0.0
    usage_s: list[float] = field(default_factory=lambda: [0.0] * USAGE_BINS)  # waiting seconds by usage
    untimed: int = 0
    # the stamp being gathered: its time, samples, and the usage bins of its waiting samples (-1: none)
    _t: float | None = None
    _n: int = 0
    _bins: list[int] = field(default_factory=list)
    _done: bool = False
    # stretches of waiting with no prefill
    open: Stretch | None = None
    stalled_s: float = 0.0  # stretches that stalled and the trickle after them, overlaps counted once
    trickle_s: float = 0.0
    _stalled_until: float = float("-inf")
    _trickle_below: float | None = None  # after a stall: usage under this while requests wait
    _trickle_t: float = 0.0
    _owed: int = 0
    stalls: int = 0
    longest: Stretch | None = None
    prefills_after: int = 0  # after the longest stall: prefill batches, requests, first quoted
    admitted_after: int = 0
    first_after: Quote | None = None
    _counting_after: bool = False
    # the prefill-bound burst
    waiting_prefills: int = 0
    waiting_lines: int = 0
    new_tokens: dict[int, tuple[int, Quote]] = field(default_factory=dict)  # #new-token → (batches, first)
    # (#new-token, #new-seq) → (batches, first): whether one more prompt would have fitted the pass
    pass_shapes: dict[tuple[int, int], tuple[int, Quote]] = field(default_factory=dict)
    _first_wait: Sample | None = None
    _last_wait: Sample | None = None

    def sample(self, s: Sample, q: Quote, waiting: bool) -> None:
        """A sample with a queue size; `waiting` as QueueStats judged it. Called for every batch line of a
        big log: plain comparisons and samples kept as they came (quoted at the end); calls only for
        prefill lines and where something changes (a new stamp, a stretch opening or closing)."""
        t = s.t
        if t is None:
            self._untimed(s, q, waiting)
            return
        if t != self._t:
            self._stamp(t)
        self._n += 1
        kind = s.kind
        if self._trickle_below is not None:
            self._trickle(s, t, waiting)
        if waiting:
            usage = s.usage
            self._bins.append(-1 if usage is None else int(usage * 100 + 0.5))  # clamped when shared
            self.waiting_lines += 1
            self._last_wait = s
            if self._first_wait is None:
                self._first_wait = s
            if kind == "decode":  # SGLang's decode lines say when nobody is admitted: vLLM's, scrapes not
                st = self.open
                if st is None:
                    self.open = Stretch(s, t)
                else:
                    st.last = s
                    if usage is not None and usage > st.top:
                        st.top, st.top_s = usage, s
            elif kind == "prefill":
                self._prefill(s, q, t, True)
        elif kind == "prefill":
            self._prefill(s, q, t, False)
        elif kind == "decode" and self.open is not None:
            self._close()

    def _untimed(self, s: Sample, q: Quote, waiting: bool) -> None:
        """A sample without a timestamp: counted, and seen by the burst (no time, no stretches)."""
        self.untimed += 1
        if waiting:
            self.waiting_lines += 1
            self._last_wait = s
            if self._first_wait is None:
                self._first_wait = s
            if s.kind == "prefill" and s.new_token is not None:
                self._prefill_size(s.new_token, s.new_seq, q)

    def _stamp(self, t: float) -> None:
        """A new timestamp: the samples of the one before share the time up to it."""
        if self._t is None:
            self._t = t
        elif t > self._t:
            self._flush(t - self._t)
            self._t = t

    def _prefill(self, s: Sample, q: Quote, t: float, waiting: bool) -> None:
        if waiting and s.new_token is not None:
            self._prefill_size(s.new_token, s.new_seq, q)
        st = self.open
        if st is not None:
            st.end = t
            self._close()
        if self._counting_after:  # the admission that follows the longest stall
            self.prefills_after += 1
            self.admitted_after += s.new_seq or 0
            self.first_after = self.first_after or q

    def _prefill_size(self, new_token: int, new_seq: int | None, q: Quote) -> None:
        self.waiting_prefills += 1
        if new_seq:
            shapes = self.pass_shapes
            seen_shape = shapes.get((new_token, new_seq))
            if seen_shape is not None:
                shapes[(new_token, new_seq)] = (seen_shape[0] + 1, seen_shape[1])
            elif len(shapes) < _MAX_TOKEN_SIZES:
                shapes[(new_token, new_seq)] = (1, q)
        sizes = self.new_tokens
        seen = sizes.get(new_token)
        if seen is not None:
            sizes[new_token] = (seen[0] + 1, seen[1])
        elif len(sizes) < _MAX_TOKEN_SIZES:
            sizes[new_token] = (1, q)

    @property
    def first_wait(self) -> tuple[float | None, int, float | None, Quote] | None:
        """(time, queue, usage, quoted line) of the first sample in which requests waited."""
        return None if self._first_wait is None else _waited(self._first_wait)

    @property
    def last_wait(self) -> tuple[float | None, int, float | None, Quote] | None:
        return None if self._last_wait is None else _waited(self._last_wait)

    def _flush(self, gap: float) -> None:
        """Share the time until the next stamp among the samples of this one."""
        if not self._n:
            return
        each = min(gap, GAP_CAP_S) / self._n
        self.timed_s += each * self._n
        top = USAGE_BINS - 1
        for b in self._bins:
            self.waiting_s += each
            if b >= 0:
                self.usage_s[b if b < top else top] += each
        self._n = 0
        self._bins.clear()

    def finish(self, whole_seconds: bool) -> None:
        """The last stamp: one second in a whole-second log (as its span counts), none otherwise."""
        if self._done:
            return
        self._done = True
        self._flush(1.0 if whole_seconds else 0.0)
        if self.open is not None:
            self._close()

    def _trickle(self, s: Sample, t: float, waiting: bool) -> None:
        """After a stall, admission resumes at a trickle: the stall lasts while requests still wait, the pool
        stays under where it stood, and fewer have been admitted than finished during the stall."""
        if s.kind != "decode" and s.kind != "prefill":
            return  # vLLM's lines and scrapes do not show admission
        usage = s.usage
        if waiting and usage is not None and self._trickle_below is not None and usage < self._trickle_below:
            self.trickle_s += self._count_stalled(self._trickle_t, t)
            self._trickle_t = t
            if s.kind == "prefill":
                self._owed -= s.new_seq or 0
            if self._owed > 0:
                return
        self._trickle_below = None

    def _count_stalled(self, a: float, b: float) -> float:
        """Add [a, b] to the stalled time, less what is counted already; returns what it added."""
        added = max(0.0, b - max(a, self._stalled_until))
        self.stalled_s += added
        self._stalled_until = max(self._stalled_until, b)
        return added

    def _close(self) -> None:
        st = self.open
        self.open = None
        if st is None:
            return
        if not st.stalled():
            return
        self.stalls += 1
        t1 = st.t0 + st.seconds
        self._count_stalled(st.t0, t1)
        end = st.last.usage or 0.0
        below = min(max(st.top, end) - STALL_TRICKLE_GAP, STALL_MAX_USAGE)
        self._trickle_below, self._trickle_t = below, t1
        r0, r1 = st.first.running, st.last.running
        self._owed = max((r0 or 0) - (r1 or 0), 1)  # the requests that finished and were not replaced
        if self.longest is None or st.seconds > self.longest.seconds:
            self.longest = st
            self.prefills_after = self.admitted_after = 0
            self.first_after = None
            self._counting_after = True

    # -- answers -------------------------------------------------------------------------------------

    @property
    def timed(self) -> bool:
        return self.timed_s > 0 and self.untimed == 0

    def usage_quantile(self, p: float) -> float | None:
        """The p-quantile of token usage over the time requests waited (None without timed waiting)."""
        total = sum(self.usage_s)
        if total <= 0:
            return None
        need = p * total
        seen = 0.0
        for i, sec in enumerate(self.usage_s):
            seen += sec
            if seen >= need - 1e-9:
                return i / 100
        return 1.0

    def share_below(self, usage: float) -> float:
        """The share of the waiting time (with a usage) spent below `usage`."""
        total = sum(self.usage_s)
        if total <= 0:
            return 0.0
        below = sum(self.usage_s[: round(usage * 100)])
        return below / total


def quoted(s: Sample) -> Quote:
    """The line a sample came from, as evidence."""
    return Quote(s.line, s.text)


def _waited(s: Sample) -> tuple[float | None, int, float | None, Quote]:
    return s.t, s.queued or 0, s.usage, quoted(s)
