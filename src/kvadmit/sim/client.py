"""A bench_serving-like client on the simulated clock: it sends requests at their arrival times behind a
concurrency limit and records what bench_serving would measure for each (TTFT to the first token, one
ITL gap per later token as the native backend streams them, end-to-end latency)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kvadmit.bench.metrics import RequestOutcome
from kvadmit.engine import Engine, VirtualClock
from kvadmit.request import FinishKind, Req, SamplingLimits
from kvadmit.sim.workload import SimRequest


@dataclass(slots=True)
class _Flight:
    spec: SimRequest
    outcome: RequestOutcome | None  # None for warm-up requests
    sent: float
    last_token: float = -1.0


class SimClient:
    """Implements the engine's Listener; `send_due` puts requests whose time has come on the wire."""

    def __init__(
        self, engine: Engine | None, clock: VirtualClock, vocab_size: int, max_concurrency: int | None
    ):
        self.engine = engine
        self.clock = clock
        self.vocab_size = vocab_size
        self.limit = max_concurrency or 1 << 62
        self.queue: deque[tuple[float, str, SimRequest, RequestOutcome | None]] = deque()
        self.flights: dict[str, _Flight] = {}
        self.true_output_len: dict[str, int] = {}
        self.finished: list[tuple[Req, float]] = []

    def schedule(self, arrival: float, spec: SimRequest, outcome: RequestOutcome | None, rid: str) -> None:
        self.queue.append((arrival, rid, spec, outcome))
        if spec.true_output_len is not None:
            self.true_output_len[rid] = spec.true_output_len

    def send_due(self) -> None:
        """Send every queued request that has arrived, while the concurrency limit allows (FIFO)."""
        assert self.engine is not None
        now = self.clock.now()
        while self.queue and self.queue[0][0] <= now and len(self.flights) < self.limit:
            _, rid, spec, outcome = self.queue.popleft()
            req = Req(
                rid=rid,
                origin_input_ids=spec.prompt(self.vocab_size),
                sampling=SamplingLimits(max_new_tokens=spec.max_new_tokens, ignore_eos=spec.ignore_eos),
            )
            if outcome is not None:
                outcome.start_time = now
            self.flights[rid] = _Flight(spec, outcome, now)
            self.engine.submit(req)

    def next_arrival(self) -> float | None:
        if self.queue and len(self.flights) < self.limit:
            return self.queue[0][0]
        return None

    # ----- Listener ------------------------------------------------------------------------------
    def on_tokens(self, tokens: list[tuple[Req, int]], now: float) -> None:
        flights = self.flights
        gap_cache: dict[float, float] = {}  # one float object per distinct gap (ITL lists share them)
        for req, _ in tokens:
            flight = flights.get(req.rid)
            if flight is None or flight.outcome is None:
                continue
            last = flight.last_token
            if last < 0:
                flight.outcome.ttft = now - flight.sent
            else:
                gap = gap_cache.get(last)
                if gap is None:
                    gap = gap_cache[last] = now - last
                flight.outcome.itl.append(gap)
            flight.last_token = now

    def on_finish(self, req: Req, now: float) -> None:
        flight = self.flights.pop(req.rid)
        self.finished.append((req, now))
        out = flight.outcome
        if out is None:
            return
        reason = req.finished_reason
        out.latency = now - flight.sent
        if reason is not None and reason.kind is FinishKind.ABORT:
            out.success = False
            out.error = reason.message
            return
        out.success = True
        out.output_len = len(req.output_ids)
        out.retokenized_output_len = out.output_len
