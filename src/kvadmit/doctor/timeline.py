"""The timeline: what a scheduler reported over time, kept in bounded memory.

Each series holds at most `capacity` points. When it is full, neighbouring points are merged in pairs
(peaks kept for usage, running and queued; throughput averaged), so a 1 GB log still yields a few
thousand points that draw the same picture. Markers (retractions, aborts, health failures) are merged
the same way, adding their counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CAPACITY = 2000
MAX_STREAMS = 8


@dataclass(slots=True)
class Point:
    t: float | None  # seconds since the log's first timestamp (None: the line had none)
    line: int
    usage: float | None
    running: int | None
    queued: int | None
    throughput: float | None  # generation tokens/s
    tokens: int | None = None  # #token: KV slots in use
    prefills: int = 0  # prefill batches among the merged samples
    admitted: int = 0  # requests those prefill batches admitted
    weight: int = 1  # how many samples were merged into this point

    def merge(self, other: Point) -> Point:
        tput = _mean(self.throughput, self.weight, other.throughput, other.weight)
        return Point(
            self.t,
            self.line,
            _max(self.usage, other.usage),
            _max(self.running, other.running),
            _max(self.queued, other.queued),
            tput,
            _max(self.tokens, other.tokens),
            self.prefills + other.prefills,
            self.admitted + other.admitted,
            self.weight + other.weight,
        )


@dataclass(slots=True)
class Marker:
    t: float | None
    line: int
    kind: str  # "retract" | "abort" | "oom" | "health"
    count: int
    label: str  # e.g. "0.0980 -> 0.3487"

    def merge(self, other: Marker) -> Marker:
        return Marker(self.t, self.line, self.kind, self.count + other.count, other.label or self.label)


def _max(a: float | int | None, b: float | int | None) -> float | int | None:  # type: ignore[return]
    if a is None:
        return b
    if b is None:
        return a
    return a if a >= b else b


def _mean(a: float | None, wa: int, b: float | None, wb: int) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return (a * wa + b * wb) / (wa + wb)


@dataclass
class Series:
    """One scheduler's points (one per batch line or status line), bounded: samples are gathered into
    the pending point until it holds `stride` of them; when the list is full, pairs merge and the stride
    doubles, so every point always stands for about the same number of samples."""

    name: str
    capacity: int = CAPACITY
    points: list[Point] = field(default_factory=list)
    samples: int = 0
    stride: int = 1
    _pending: Point | None = None

    def add(
        self,
        t: float | None,
        line: int,
        usage: float | None,
        running: int | None,
        queued: int | None,
        throughput: float | None,
        tokens: int | None = None,
        admitted: int | None = None,
    ) -> None:
        """One sample; `admitted` is set for a prefill batch (the requests it admitted)."""
        self.samples += 1
        p = self._pending
        if p is None:
            self._pending = p = Point(t, line, usage, running, queued, throughput, tokens)
            if admitted is not None:
                p.prefills, p.admitted = 1, admitted
        else:
            if tokens is not None and (p.tokens is None or tokens > p.tokens):
                p.tokens = tokens
            if admitted is not None:
                p.prefills += 1
                p.admitted += admitted
            if usage is not None and (p.usage is None or usage > p.usage):
                p.usage = usage
            if running is not None and (p.running is None or running > p.running):
                p.running = running
            if queued is not None and (p.queued is None or queued > p.queued):
                p.queued = queued
            if throughput is not None:
                p.throughput = (
                    throughput
                    if p.throughput is None
                    else ((p.throughput * p.weight + throughput) / (p.weight + 1))
                )
            p.weight += 1
        if self._pending is not None and self._pending.weight >= self.stride:
            self.points.append(self._pending)
            self._pending = None
            if len(self.points) > self.capacity:
                self.points = _halve(self.points)
                self.stride *= 2

    def all_points(self) -> list[Point]:
        return self.points + ([self._pending] if self._pending is not None else [])


def _halve(points: list[Point]) -> list[Point]:
    out = [points[i].merge(points[i + 1]) for i in range(0, len(points) - 1, 2)]
    if len(points) % 2:
        out.append(points[-1])
    return out


@dataclass
class Timeline:
    """Series per scheduler (DP rank), plus markers. Streams past MAX_STREAMS are counted, not kept."""

    series: dict[str, Series] = field(default_factory=dict)
    markers: list[Marker] = field(default_factory=list)
    marker_capacity: int = CAPACITY
    dropped_streams: int = 0

    def add(
        self,
        stream: str,
        t: float | None,
        line: int,
        usage: float | None,
        running: int | None,
        queued: int | None,
        throughput: float | None,
        tokens: int | None = None,
        admitted: int | None = None,
    ) -> None:
        s = self.series.get(stream)
        if s is None:
            if len(self.series) >= MAX_STREAMS:
                self.dropped_streams += 1
                return
            s = self.series[stream] = Series(stream or "scheduler")
        s.add(t, line, usage, running, queued, throughput, tokens, admitted)

    def mark(self, m: Marker) -> None:
        self.markers.append(m)
        if len(self.markers) > self.marker_capacity:
            merged: list[Marker] = []
            for i in range(0, len(self.markers) - 1, 2):
                a, b = self.markers[i], self.markers[i + 1]
                if a.kind == b.kind:
                    merged.append(a.merge(b))
                else:
                    merged.extend((a, b))
            if len(self.markers) % 2:
                merged.append(self.markers[-1])
            self.markers = merged if len(merged) < len(self.markers) else merged[-self.marker_capacity :]

    def primary(self) -> Series | None:
        """The stream with the most samples (the one the findings quote first)."""
        if not self.series:
            return None
        return max(self.series.values(), key=lambda s: s.samples)

    @property
    def timed(self) -> bool:
        """Whether every point and marker has a time (else charts use line numbers)."""
        points = [p for s in self.series.values() for p in s.all_points()]
        return (
            bool(points)
            and all(p.t is not None for p in points)
            and all(m.t is not None for m in self.markers)
        )

    def to_json(self) -> dict[str, object]:
        return {
            "x_unit": "s" if self.timed else "line",
            "series": {
                s.name: [
                    {
                        "t": _r(p.t),
                        "line": p.line,
                        "usage": p.usage,
                        "running": p.running,
                        "queued": p.queued,
                        "tokens": p.tokens,
                        "gen_throughput": p.throughput,
                        "prefill_batches": p.prefills,
                        "admitted": p.admitted,
                        "samples": p.weight,
                    }
                    for p in s.all_points()
                ]
                for s in self.series.values()
            },
            "markers": [
                {"t": _r(m.t), "line": m.line, "kind": m.kind, "count": m.count, "label": m.label}
                for m in self.markers
            ],
        }


def _r(t: float | None) -> float | None:
    return None if t is None else round(t, 3)
