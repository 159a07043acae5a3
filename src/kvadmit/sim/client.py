"""A bench_serving-like client on the simulated clock: it sends requests at their arrival times behind a
concurrency limit and records what bench_serving would measure for each (TTFT to the first token, one
ITL gap per later token as the native backend streams them, end-to-end latency).

Token times are not recorded token by token. A running request gets a token in every decode step from
the one after its prefill until it ends or is retracted, so its token times are its prefill times plus
contiguous runs of the decode steps' end times; the client keeps those runs and, once the run is over,
turns every request's into gaps in one vectorised pass (`fill_token_times`: the same float subtractions a
per-token record would make).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from kvadmit.bench.metrics import BenchmarkMetrics, RequestOutcome, calculate_metrics
from kvadmit.bench.workload import SimRequest
from kvadmit.engine import Engine, VirtualClock
from kvadmit.request import FinishKind, Req, SamplingLimits
from kvadmit.scheduler.events import Event, Retraction
from kvadmit.scheduler.types import ScheduledBatch
from kvadmit.sim.token_times import Gathered, Piece, gather_gaps


@dataclass(slots=True)
class _Flight:
    spec: SimRequest
    outcome: RequestOutcome | None  # None for warm-up requests
    sent: float
    # Token times as pieces: a float (a prefill's token) or (first, last) decode-step indices.
    pieces: list[Piece] = field(default_factory=list)
    decoding_from: int = -1  # the decode step index its current run starts at, or −1

    # Written out (the fields, in order, with their defaults; tests/test_native_inits.py checks): the
    # compiled core builds it natively, where dataclass's generated __init__ is interpreted Python.
    # (`pieces` left out or passed as None starts empty.)
    def __init__(
        self,
        spec: SimRequest,
        outcome: RequestOutcome | None,
        sent: float,
        pieces: list[Piece] | None = None,
        decoding_from: int = -1,
    ) -> None:
        self.spec = spec
        self.outcome = outcome
        self.sent = sent
        self.pieces = [] if pieces is None else pieces
        self.decoding_from = decoding_from


class SimClient:
    """The engine's Listener (and a Retraction observer); `send_due` sends requests whose time has come."""

    def __init__(
        self,
        engine: Engine | None,
        clock: VirtualClock,
        vocab_size: int,
        max_concurrency: int | None,
        request_latency: float = 0.0,
    ):
        self.engine = engine
        # Seconds from a request going on the wire to the scheduler seeing it (HTTP, parsing, the engine's
        # queue): a request sent during a step, or at the very end of one, waits for the next pass.
        self.request_latency = request_latency
        self.clock = clock
        self.vocab_size = vocab_size
        self._token_ids = list(range(vocab_size))  # prompts are slices of it (one int object per id)
        # When each free slot of the concurrency limit became free (FIFO, like bench_serving's semaphore);
        # without a limit every request finds a slot the moment it arrives.
        self.free_slots: deque[float] | None = (
            deque([float("-inf")] * max_concurrency) if max_concurrency else None
        )
        self.queue: deque[tuple[float, str, SimRequest, RequestOutcome | None]] = deque()
        self.flights: dict[str, _Flight] = {}
        self.true_output_len: dict[str, int] = {}
        self.finished_rids: list[str] = []  # in the order requests ended (no Req kept alive)
        self.warmup_ok = 0
        self.warmup_errors: list[str] = []
        self.retractions = 0  # the retractions the scheduler chose (not those forced on it)
        self._decode_times = np.empty(4096)  # end times of the decode steps so far (first n_decode)
        self.n_decode = 0
        self._succeeded: list[tuple[_Flight, RequestOutcome]] = []  # token times not yet filled in

    def schedule(self, arrival: float, spec: SimRequest, outcome: RequestOutcome | None, rid: str) -> None:
        self.queue.append((arrival, rid, spec, outcome))

    def send_due(self) -> None:
        """Send every queued request that has arrived, while the concurrency limit allows (FIFO)."""
        assert self.engine is not None
        now = self.clock.now()
        slots = self.free_slots
        while self.queue and (slots is None or slots):
            # Sent when it arrived or when a slot freed, whichever is later: a request that arrives during
            # a step is on the wire at once; the server sees it request_latency later, at its next pass.
            sent = self.queue[0][0] if slots is None else max(self.queue[0][0], slots[0])
            if sent + self.request_latency > now:
                break
            _, rid, spec, outcome = self.queue.popleft()
            if slots is not None:
                slots.popleft()
            self.send_now(spec, outcome, rid, sent)

    def send_now(self, spec: SimRequest, outcome: RequestOutcome | None, rid: str, sent: float) -> None:
        """Hand one request to the engine now, as sent at `sent` (a step replay's way in)."""
        assert self.engine is not None
        if spec.true_output_len is not None:
            self.true_output_len[rid] = spec.true_output_len
        req = Req(
            rid=rid,
            origin_input_ids=spec.prompt(self.vocab_size, self._token_ids),
            sampling=SamplingLimits(
                requested_max_new_tokens=spec.max_new_tokens,
                ignore_eos=spec.ignore_eos,
                priority=spec.priority,
            ),
        )
        if outcome is not None:
            outcome.start_time = sent
            outcome.priority = spec.priority
        self.flights[rid] = _Flight(spec, outcome, sent)
        self.engine.submit(req)

    def next_arrival(self) -> float | None:
        """When the next request goes on the wire, if that does not wait for a request to end."""
        if not self.queue:
            return None
        if self.free_slots is None:
            return self.queue[0][0] + self.request_latency
        if not self.free_slots:
            return None
        return max(self.queue[0][0], self.free_slots[0]) + self.request_latency

    # ----- Listener ------------------------------------------------------------------------------
    def on_step(self, batch: ScheduledBatch, now: float) -> None:
        if batch.kind == "decode":
            if self.n_decode == len(self._decode_times):
                self._decode_times = np.concatenate((self._decode_times, np.empty(self.n_decode)))
            self._decode_times[self.n_decode] = now
            self.n_decode += 1
            return
        next_decode = self.n_decode
        decoding = set(map(id, batch.decoding or ()))
        for req in batch.reqs:
            if req is batch.chunked:
                continue  # an unfinished chunk streams nothing
            if not req.kv and req.finished_reason is None:
                continue  # retracted while the step was in flight (overlap loop): its token was dropped
            flight = self.flights.get(req.rid)
            if flight is not None:
                if id(req) in decoding:
                    self._close_run(flight)  # a mixed chunk's decode row: its decode run pauses here
                flight.pieces.append(now)
                flight.decoding_from = next_decode

    def observe(self, event: Event, now: float) -> None:
        if isinstance(event, Retraction):
            if not event.forced:
                self.retractions += 1
            for rid in event.rids:
                flight = self.flights.get(rid)
                if flight is not None:
                    self._close_run(flight)

    def _close_run(self, flight: _Flight) -> None:
        last = self.n_decode - 1
        if 0 <= flight.decoding_from <= last:
            flight.pieces.append((flight.decoding_from, last))
        flight.decoding_from = -1

    def on_finish(self, req: Req, now: float) -> None:
        flight = self.flights.pop(req.rid)
        if self.free_slots is not None:
            self.free_slots.append(now)
        self._close_run(flight)
        self.finished_rids.append(req.rid)
        out = flight.outcome
        reason = req.finished_reason
        if out is None:  # a warm-up request
            if reason is not None and reason.kind is FinishKind.ABORT:
                self.warmup_errors.append(reason.message)
            else:
                self.warmup_ok += 1
            return
        out.latency = now - flight.sent
        if reason is not None and reason.kind is FinishKind.ABORT:
            out.success = False
            out.error = reason.message
            return
        out.success = True
        out.output_len = len(req.output_ids)
        out.retokenized_output_len = out.output_len
        self._succeeded.append((flight, out))  # its TTFT and ITL gaps: fill_token_times()


def fill_token_times(clients: list[SimClient], outcomes: list[RequestOutcome]) -> Gathered:
    """Set the TTFT and ITL gaps of every request that succeeded (on any of the clients, a fleet's
    replicas' included) in one vectorised pass (the same float subtractions a per-request np.diff makes).
    The gaps of every successful outcome, end to end in the order of `outcomes`, are one array (each
    outcome's `itl` a view of it): what the metrics read (and reorder: then `rewrite()` it)."""
    where: dict[int, tuple[_Flight, int]] = {}  # id(outcome): its flight, its client's decode offset
    times: list[np.ndarray] = []
    base = 0
    for c in clients:
        for flight, out in c._succeeded:
            where[id(out)] = (flight, base)
        c._succeeded = []
        times.append(c._decode_times[: c.n_decode])
        base += c.n_decode
    done = [o for o in outcomes if o.success]
    if len(done) != len(where):
        raise ValueError(f"{len(where)} requests succeeded, {len(done)} of the outcomes say so")
    flights = [where[id(o)] for o in done]
    g = gather_gaps(
        np.concatenate(times) if times else np.empty(0),
        [f.pieces for f, _ in flights],
        [off for _, off in flights],
    )
    firsts, gaps, bounds = g.firsts, g.gaps, g.bounds
    for k, out in enumerate(done):
        out.ttft = firsts[k] - flights[k][0].sent
        out.itl = gaps[bounds[k] : bounds[k + 1]]  # type: ignore[assignment]  # a view; empty for one token
    return g


def run_metrics(
    clients: list[SimClient], outcomes: list[RequestOutcome], start: float
) -> tuple[float, BenchmarkMetrics]:
    """(the run's duration from `start`, its metrics), once every request has ended: the token times
    filled in (fill_token_times), the metrics read from the one array of gaps, which they reorder, then
    the gaps written back in order for the outcomes' ITL views."""
    gathered = fill_token_times(clients, outcomes)
    duration = max((o.start_time + o.latency for o in outcomes), default=start) - start
    metrics = calculate_metrics(outcomes, duration, gathered.gaps)
    gathered.rewrite()
    return duration, metrics
