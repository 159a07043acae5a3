"""A fleet's logs, one replica each: several logs (one per replica, e.g. servers behind sglang-router), or
one log whose lines carry data-parallel rank tags (SGLang's `--dp-size`: `[2026-… DP1 TP0] Decode …`;
`kvadmit simulate --replicas N` and `--dp-size N` tag theirs `[2026-… DP1] …`).

Each log is read once and its lines are dealt out: a line with a DP tag goes to that rank's replica; a
line with a timestamp and no DP tag (server arguments, access lines) is the whole server's and goes to
every replica of that log; a line with neither (a traceback's continuation) goes with the line before it.
Each replica's lines, in the log's order and with the log's line numbers, go through a parser and a
collector of their own, so a replica is read exactly as `kvadmit doctor` reads a log of that replica
alone. The collector also keeps the per-replica numbers of the fleet table (`ReplicaNumbers`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from kvadmit.doctor.collect import Collected, Collector
from kvadmit.doctor.model import InputSummary
from kvadmit.doctor.parse import LineParser
from kvadmit.doctor.source import DoctorInputError, LogSource
from kvadmit.doctor.trackers import Quote, Sample
from kvadmit.observe.logread import RANK_TAG, TIMESTAMP

MAX_SHARED_LINES = 10_000  # whole-server lines kept to hand to ranks that first appear later
MAX_REPLICAS = 256
USAGE_BINS = 101  # token usage in hundredths
# What a `server_args=ServerArgs(...)` start-up line says of the DP controller (SGLang prints it once).
_DP_ARGS = re.compile(r"\b(dp_size|load_balance_method)=('?)([\w.-]+)\2")


@dataclass
class ReplicaNumbers:
    """What the per-replica table shows, from the replica's batch lines."""

    admissions: int = 0  # Σ #new-seq over prefill lines (re-admissions after retraction count again)
    new_tokens: int = 0  # Σ #new-token
    cached_tokens: int = 0  # Σ #cached-token
    batch_lines: int = 0
    prefill_lines: int = 0
    peak_queue: tuple[int, Quote] | None = None
    peak_usage: tuple[float, Quote] | None = None
    peak_in_flight: tuple[int, Quote] | None = None  # running + queued: what the router counts in flight
    held_at_first_queue: int | None = None  # requests running (or just admitted) when one first waited
    usage_bins: list[int] = field(default_factory=lambda: [0] * USAGE_BINS)
    throughput_sum: float = 0.0
    throughput_lines: int = 0

    def sample(self, s: Sample, q: Quote) -> None:
        self.batch_lines += 1
        if s.kind == "prefill":
            self.prefill_lines += 1
            self.admissions += s.new_seq or 0
            self.new_tokens += s.new_token or 0
            self.cached_tokens += s.cached or 0
        elif s.throughput is not None:
            self.throughput_sum += s.throughput
            self.throughput_lines += 1
        if s.queued is not None and (self.peak_queue is None or s.queued > self.peak_queue[0]):
            self.peak_queue = (s.queued, q)
        if s.usage is not None:
            if self.peak_usage is None or s.usage > self.peak_usage[0]:
                self.peak_usage = (s.usage, q)
            self.usage_bins[min(USAGE_BINS - 1, max(0, round(s.usage * 100)))] += 1
        if s.running is not None and s.queued is not None:
            # a prefill line's #running-req does not yet count the batch it admits
            running = s.running + ((s.new_seq or 0) if s.kind == "prefill" else 0)
            if s.queued > 0 and self.held_at_first_queue is None:
                self.held_at_first_queue = running
            held = running + s.queued
            if self.peak_in_flight is None or held > self.peak_in_flight[0]:
                self.peak_in_flight = (held, q)

    def usage_median(self) -> float | None:
        """The median token usage over the batch lines (to the hundredth, as SGLang prints it)."""
        total = sum(self.usage_bins)
        if not total:
            return None
        seen = 0
        for i, n in enumerate(self.usage_bins):
            seen += n
            if 2 * seen >= total:
                return i / 100
        return None

    @property
    def throughput_mean(self) -> float | None:
        return self.throughput_sum / self.throughput_lines if self.throughput_lines else None


class ReplicaCollector(Collector):
    """The doctor's collector, keeping the fleet table's numbers too."""

    def __init__(self) -> None:
        super().__init__()
        self.numbers = ReplicaNumbers()

    def add_sample(self, s: Sample, q: Quote) -> None:
        super().add_sample(s, q)
        self.numbers.sample(s, q)


class ReplicaStream:
    """One replica's lines: its own parser and collector, fed line by line as `read_log` feeds them."""

    def __init__(self, name: str, source: str, tag: str) -> None:
        self.name, self.source, self.tag = name, source, tag
        self.parser = LineParser()
        self.collector = ReplicaCollector()
        self.last_line = 0
        self.dp_args: dict[str, str] = {}  # dp_size, load_balance_method from a server_args line

    def feed(self, lineno: int, text: str) -> None:
        self.last_line = lineno
        batch = self.parser.fast_batch(text)
        if batch is not None:
            self.collector.add_batch(lineno, text, *batch)
            return
        if "server_args=" in text:
            self.dp_args.update((m.group(1), m.group(3)) for m in _DP_ARGS.finditer(text))
        rec = self.parser.parse(text)
        if rec is None:
            self.collector.add_unknown(lineno, text)
        else:
            self.collector.add(lineno, rec, text)

    @property
    def collected(self) -> Collected:
        return self.collector.c

    def summary(self, notes: list[str]) -> InputSummary:
        c = self.collected
        label = f"{self.source} {self.tag}" if self.tag else self.source
        s = InputSummary(label, "log", c.lines, c.recognised, c.unknown, c.unknown_examples,
                         span_s=c.span_s, by_kind=dict(c.kinds))  # fmt: skip
        s.notes.extend(notes)
        if c.duplicate_rank_lines:
            s.notes.append(f"{c.duplicate_rank_lines:,} lines repeated by other ranks were counted once")
        return s


def dp_tag(text: str) -> tuple[str, bool]:
    """(the line's data-parallel rank tag or "", whether the line starts with a timestamped prefix)."""
    close = text.find("] ", 0, 200)
    prefix = text[: close + 1] if close > 0 else text[:40]
    if "P" in prefix:
        for tag in RANK_TAG.findall(prefix):
            if tag.startswith(("DP", "ATTN_DP")):
                return tag, True
    return "", TIMESTAMP.search(prefix) is not None


def dealt(lines: Iterable[tuple[int, str]]) -> Iterator[tuple[str, bool, int, str]]:
    """Each line of a log of DP ranks with the rank it belongs to: (its rank's tag, or "" for a line every
    rank reads; whether the line carries that tag itself; its number; its text). A line with a tag is that
    rank's; one with a timestamp and no tag, every rank's; one with neither continues the line before it
    (a traceback, a wrapped message), and before any tagged line it is every rank's."""
    owner = ""
    for lineno, text in lines:
        tag, stamped = dp_tag(text)
        if tag:
            owner = tag
            yield tag, True, lineno, text
        elif stamped or not owner:
            owner = ""
            yield "", False, lineno, text
        else:
            yield owner, False, lineno, text


def split_log(path: str) -> tuple[list[ReplicaStream], list[str]]:
    """One log dealt out to its DP ranks (one stream named after the file when it has no DP tags), and
    notes on how it was read."""
    src = LogSource(path)
    label = src.label.strip("'")
    streams: dict[str, ReplicaStream] = {}
    shared: list[tuple[int, str]] = []
    shared_dropped = 0
    whole = ReplicaStream(label, label, "")  # the log as one replica, if it has no DP tags
    try:
        for tag, _, lineno, text in dealt(src.lines()):
            if tag:
                stream = streams.get(tag)
                if stream is None:
                    if len(streams) >= MAX_REPLICAS:
                        raise DoctorInputError(f"{src.label} has over {MAX_REPLICAS} data-parallel ranks")
                    stream = streams[tag] = ReplicaStream(tag, label, tag)
                    for n, t in shared:  # the whole server's lines so far, in order
                        stream.feed(n, t)
                stream.feed(lineno, text)
                continue
            if not streams:
                whole.feed(lineno, text)
            if len(shared) < MAX_SHARED_LINES:
                shared.append((lineno, text))
            else:
                shared_dropped += 1
            for stream in streams.values():
                stream.feed(lineno, text)
    finally:
        src.close()
    notes = [f"read through {src.stats.compression}"] if src.stats.compression else []
    if src.stats.truncated:
        notes.append(src.stats.truncated + "; diagnosed what came before")
    if not streams:
        return [whole], notes
    if shared:
        n = len(shared) + shared_dropped
        were = "lines without a DP tag were" if n > 1 else "line without a DP tag was"
        notes.append(f"{n:,} {were} read by every rank")
    if shared_dropped:
        notes.append(f"{shared_dropped:,} of them came after the first {MAX_SHARED_LINES:,} and reached "
                     "only the ranks already seen")  # fmt: skip
    return sorted(streams.values(), key=lambda s: _rank_order(s.tag)), notes


def _rank_order(tag: str) -> tuple[str, int]:
    digits = tag.lstrip("ATN_DP")
    return (tag[: len(tag) - len(digits)], int(digits) if digits.isdigit() else 0)


def read_fleet(paths: list[str]) -> list[tuple[ReplicaStream, InputSummary]]:
    """Every replica of the fleet these logs show, each with what was read for it. DoctorInputError when
    they show fewer than two replicas or a log holds nothing the doctor knows."""
    out: list[tuple[ReplicaStream, InputSummary]] = []
    for path in paths:
        streams, notes = split_log(path)
        if len(paths) == 1 and len(streams) < 2:
            what = f"only {streams[0].tag}" if streams[0].tag else "no data-parallel rank tags (DP0, DP1, …)"
            raise DoctorInputError(
                f"{streams[0].source} has {what}: a fleet needs one log per replica (kvadmit doctor a.log "
                "b.log …) or one log of several DP ranks"
            )
        for stream in streams:
            c = stream.collected
            if c.recognised == 0:
                raise DoctorInputError(
                    f"no SGLang or vLLM log lines found in {stream.source} ({c.lines:,} lines read)"
                )
            if len(streams) == 1:
                stream.name = stream.source
            elif len(paths) > 1:
                stream.name = f"{stream.source} {stream.tag}"
            out.append((stream, stream.summary(notes)))
    return out
