"""Generation throughput per running request before a retraction and after it, for the collapse rule.

The baseline is set by the first retraction line (the median of the decode lines just before it), or,
when no retraction line is in the excerpt, by the first decode line whose throughput falls threefold in
total *and* per running request while no fewer requests run: more requests, a third of the tokens/s, is
not a smaller batch finishing. That unseen start is dropped again if throughput comes back, and gives way
to a retraction line that appears later; the rule ignores it when prefill lines after it are as many as
decode lines (the time went to prefill passes, which a decode line's tokens/s counts against decode).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvadmit.doctor.trackers import Quote, Sample

FALL = 3.0  # threefold


@dataclass
class CollapseTracker:
    baseline: tuple[float, Quote] | None = None
    after: int = 0
    after_low: int = 0
    recent: deque[tuple[float, Quote]] = field(default_factory=lambda: deque(maxlen=3))
    worst_after: tuple[float, Quote] | None = None
    retraction: Quote | None = None
    # Set when the fall itself started the count (no retraction line before it).
    unseen: bool = False
    running_before: int | None = None
    usage_before: float | None = None
    first_low: Sample | None = None
    prefills: int = 0  # prefill lines before any retraction line (collect counts them)
    prefills_after: int = 0  # of those, since the last decode line before the fall
    _prefills_at_ok: int = 0  # `prefills` at the last decode line that kept its throughput
    _ok: deque[tuple[float, float, int, float | None, Quote]] = field(default_factory=lambda: deque(maxlen=8))

    @staticmethod
    def _per_request(s: Sample) -> float | None:
        if s.kind not in ("decode", "vllm") or not s.running or not s.throughput or s.throughput <= 0:
            return None
        return s.throughput / s.running

    def sample(self, s: Sample, q: Quote) -> None:
        per = self._per_request(s)
        if per is None or self.baseline is None:
            return
        self.after += 1
        if per * FALL <= self.baseline[0]:
            self.after_low += 1
        self.recent.append((per, q))
        if self.worst_after is None or per < self.worst_after[0]:
            self.worst_after = (per, q)

    def watch(self, s: Sample, q: Quote) -> None:
        """A decode line before any retraction line: history, or the start of a fall that no retraction
        line explains."""
        per = self._per_request(s)
        if per is None or (self.baseline is not None and not self.unseen):
            return
        if self.unseen:
            assert self.baseline is not None
            if per * FALL > self.baseline[0]:  # it came back: no collapse after all
                self._reset()
            else:
                self.prefills_after = self.prefills - self._prefills_at_ok
                self.sample(s, q)
                return
        ok = self._ok
        if len(ok) >= 2:
            per0, total0, running0, _usage0, q0 = sorted(ok, key=lambda e: e[0])[len(ok) // 2]
            assert s.throughput is not None and s.running is not None
            if per * FALL <= per0 and s.throughput * FALL <= total0 and s.running >= running0:
                self.baseline, self.unseen = (per0, q0), True
                self.running_before, self.usage_before, self.first_low = running0, ok[-1][3], s
                self.prefills_after = self.prefills - self._prefills_at_ok
                self.sample(s, q)
                return
        ok.append((per, s.throughput or 0.0, s.running or 0, s.usage, q))
        self._prefills_at_ok = self.prefills

    def _reset(self) -> None:
        self.baseline, self.unseen, self.first_low = None, False, None
        self.after = self.after_low = 0
        self.recent.clear()
        self.worst_after = None

    def retracted(self, q: Quote, history: Iterable[tuple[Sample, Quote]]) -> None:
        """The first retraction after at least two decode lines sets the baseline: their median (of the
        last eight)."""
        if self.baseline is not None and not self.unseen:
            return
        if self.unseen:
            self._reset()
        before = [(per, hq) for hs, hq in history if (per := self._per_request(hs)) is not None][-8:]
        if len(before) >= 2:
            before.sort(key=lambda vq: vq[0])
            self.baseline = before[len(before) // 2]
            self.retraction = q
