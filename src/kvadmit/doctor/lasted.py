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
  holds back far more than the running requests use (a raised new-token ratio, docs/sglang-rules.md §2);
* a *prefill-bound burst*: the prefill batches while requests wait, by #new-token (to tell batches cut at
  the chunked-prefill budget), and the queue and usage at the first and last waiting sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvadmit.doctor.trackers import USAGE_BINS, WAITING_SHARE_OF_RUNNING, Quote, Sample

GAP_CAP_S = 60.0
STALL_MIN_S = 3.0
STALL_MAX_USAGE = 0.9
_MAX_TOKEN_SIZES = 64  # distinct #new-token values counted (the budget is one of the commonest)


@dataclass
class Stretch:
    """Waiting with no prefill: from its first sample to the prefill (or last sample) that ends it."""

    t0: float
    first: Quote
    queued0: int
    running0: int | None
    usage0: float | None
    t1: float = 0.0
    last: Quote | None = None
    queued1: int = 0
    running1: int | None = None
    usage1: float | None = None
    top_usage: tuple[float, Quote] | None = None
    samples: int = 0
    ended_by: Quote | None = None  # the prefill that ended it

    @property
    def seconds(self) -> float:
        return self.t1 - self.t0

    def stalled(self) -> bool:
        if self.seconds < STALL_MIN_S or self.samples < 2 or self.usage1 is None:
            return False
        if self.usage1 >= STALL_MAX_USAGE:
            return False
        fell_running = (
            self.running0 is not None
            and self.running1 is not None
            and self.running0 - self.running1 >= max(2, WAITING_SHARE_OF_RUNNING * self.running0)
        )
        top = self.top_usage[0] if self.top_usage else self.usage1
        return fell_running or top - self.usage1 >= 0.05


@dataclass
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
    stalled_s: float = 0.0
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
    first_wait: tuple[float | None, int, float | None, Quote] | None = None  # (t, queued, usage)
    last_wait: tuple[float | None, int, float | None, Quote] | None = None

    def sample(self, s: Sample, q: Quote) -> None:
        queued = s.queued
        if queued is None:
            return
        waiting = queued > 0 and queued >= WAITING_SHARE_OF_RUNNING * (s.running or 0)
        t = s.t
        usage = s.usage
        if t is None:
            self.untimed += 1
        else:
            if self._t is None:
                self._t = t
            elif t > self._t:
                self._flush(t - self._t)
                self._t = t
            self._n += 1
            if waiting and usage is not None:
                self._bins.append(min(max(round(usage * 100), 0), USAGE_BINS - 1))
            elif waiting:
                self._bins.append(-1)
        if waiting:
            self._burst(s, q, t, queued, usage)
        if t is not None and (s.kind == "decode" or s.kind == "prefill"):  # SGLang's lines show prefills
            self._stretch(s, q, t, waiting, queued, usage)

    def _flush(self, gap: float) -> None:
        """Share the time until the next stamp among the samples of this one."""
        if not self._n:
            return
        each = min(gap, GAP_CAP_S) / self._n
        self.timed_s += each * self._n
        for b in self._bins:
            self.waiting_s += each
            if b >= 0:
                self.usage_s[b] += each
        self._n = 0
        self._bins.clear()

    def finish(self, whole_seconds: bool) -> None:
        """The last stamp: one second in a whole-second log (as its span counts), none otherwise."""
        if self._done:
            return
        self._done = True
        self._flush(1.0 if whole_seconds else 0.0)
        if self.open is not None:
            self._close(None)

    # -- waiting with no prefill -------------------------------------------------------------------

    def _stretch(
        self, s: Sample, q: Quote, t: float, waiting: bool, queued: int, usage: float | None
    ) -> None:
        st = self.open
        if s.kind == "prefill":
            if st is not None:
                st.t1 = max(st.t1, t)
                self._close(q)
            if self._counting_after:  # the admission that follows the longest stall
                self.prefills_after += 1
                self.admitted_after += s.new_seq or 0
                self.first_after = self.first_after or q
            return
        if not waiting:
            if st is not None:
                self._close(None)
            return
        if st is None:
            st = self.open = Stretch(t, q, queued, s.running, usage)
        st.t1, st.last, st.queued1, st.running1, st.usage1 = t, q, queued, s.running, usage
        st.samples += 1
        if usage is not None and (st.top_usage is None or usage > st.top_usage[0]):
            st.top_usage = (usage, q)

    def _close(self, prefill: Quote | None) -> None:
        st = self.open
        self.open = None
        if st is None:
            return
        st.ended_by = prefill
        if not st.stalled():
            return
        self.stalls += 1
        self.stalled_s += st.seconds
        if self.longest is None or st.seconds > self.longest.seconds:
            self.longest = st
            self.prefills_after = self.admitted_after = 0
            self.first_after = None
            self._counting_after = True

    # -- the prefill-bound burst -------------------------------------------------------------------

    def _burst(self, s: Sample, q: Quote, t: float | None, queued: int, usage: float | None) -> None:
        self.waiting_lines += 1
        entry = (t, queued, usage, q)
        if self.first_wait is None:
            self.first_wait = entry
        self.last_wait = entry
        if s.kind == "prefill" and s.new_token is not None:
            self.waiting_prefills += 1
            sizes = self.new_tokens
            seen = sizes.get(s.new_token)
            if seen is not None:
                sizes[s.new_token] = (seen[0] + 1, seen[1])
            elif len(sizes) < _MAX_TOKEN_SIZES:
                sizes[s.new_token] = (1, q)

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
