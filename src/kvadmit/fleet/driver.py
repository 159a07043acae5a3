"""A fleet run: N replicas (each the exact scheduler, replica.py) behind a router (router.py), one
bench_serving-like client in front, all on one virtual clock.

A discrete-event loop. Events, earliest first, and at equal times in this order:

    END       a request's answer reached the client and the router (the step that produced it ended):
              the router's in-flight count drops, a concurrency slot frees
    PERIODIC  the router's load poll or tree eviction
    SEND      the client puts the next request on the wire (its arrival, or when a slot frees); the
              router routes it at once and it reaches the replica --request-latency-ms later
    STEP      a replica's next scheduling pass starts: it takes what has reached it by then and runs one
              step of its engine (in the overlap loop: schedules the next batch, then processes the one
              in flight; END events are queued at the time results are processed), or, finding nothing,
              waits for the next request that reaches it

A step's decisions use only what reached its replica by the step's start, and the router sees a step's
answers only at the step's end, so the replicas never see each other's future. With one replica the
sequence of passes, clock values and submissions is `simulate`'s own (its output is byte-identical).
"""

from __future__ import annotations

import heapq
import itertools
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from kvadmit.bench.metrics import RequestOutcome
from kvadmit.bench.workload import SimRequest, build_workload
from kvadmit.engine import StepObserver
from kvadmit.fleet.replica import Replica
from kvadmit.fleet.router import INF, FleetRouter, RouterSettings
from kvadmit.observe.request_trace import simulated_line
from kvadmit.scheduler.events import Event
from kvadmit.sim.client import run_metrics
from kvadmit.sim.run import SimConfig, SimResult, SimulationStalled, WarmupFailed, gc_paused

END, PERIODIC, SEND, STEP = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class FleetSpec:
    replicas: int = 1
    router: RouterSettings = field(default_factory=RouterSettings)
    in_process: bool = False  # SGLang's --dp-size (its DP controller) rather than a router in front

    def describe(self) -> str:
        if self.in_process:
            return f"--dp-size {self.replicas}, --load-balance-method {self.router.policy}"
        if self.router.impl == "smg":
            metric = f" --power-of-two-load-metric {self.router.load_metric}"
            return f"{self.replicas} replicas behind smg 1.13.0, --policy {self.router.policy}" + (
                metric if self.router.policy == "power_of_two" else ""
            )
        return f"{self.replicas} replicas behind the router, --policy {self.router.policy}"

    def simulate(self, cfg: SimConfig, watch_steps: tuple[StepObserver, ...] = ()) -> SimResult:
        """The fleet's run as one SimResult (what sweeps and searches read)."""
        return simulate_fleet(cfg, self, watch_steps=watch_steps).sim


@dataclass(slots=True)
class FleetResult:
    sim: SimResult  # over all requests; its scheduler is replica 0's
    replicas: list[Replica]
    routed: list[int]  # the replica of each measured request, by index


def simulate_fleet(
    cfg: SimConfig,
    spec: FleetSpec,
    emit_log: Callable[[str], None] | None = None,
    request_trace: IO[str] | None = None,
    step_trace: IO[str] | None = None,
    watch_steps: tuple[StepObserver, ...] = (),
    watch_events: tuple[Callable[[Event, float], None], ...] = (),
) -> FleetResult:
    with gc_paused():  # as simulate()
        return _Fleet(cfg, spec, emit_log, step_trace, watch_steps, watch_events).run(request_trace)


def prompt_text(spec: SimRequest, chars: str) -> str:
    """The prompt as the router sees it, one character per token: "".join(map(chr, spec.prompt(…))),
    built, as SimRequest.prompt builds the ids, from slices of the vocabulary (`chars`)."""
    if spec.tokens is not None:
        return "".join(map(chr, spec.tokens))
    vocab, n = len(chars), spec.prompt_len
    start = (spec.offset + spec.index) % vocab
    text = chars[start : start + n]
    while len(text) < n:  # wrapped past the end of the vocabulary
        text += chars[: min(vocab, n - len(text))]
    return text


class _Fleet:
    def __init__(
        self,
        cfg: SimConfig,
        spec: FleetSpec,
        emit_log: Callable[[str], None] | None,
        step_trace: IO[str] | None,
        watch_steps: tuple[StepObserver, ...],
        watch_events: tuple[Callable[[Event, float], None], ...],
    ) -> None:
        if spec.replicas < 1:
            raise ValueError(f"a fleet needs at least one replica, got {spec.replicas}")
        tagged = spec.replicas > 1
        self.cfg = cfg
        self.replicas = [
            Replica(k, cfg, emit_log, step_trace, watch_steps, watch_events, tagged)
            for k in range(spec.replicas)
        ]
        self.router = FleetRouter(spec.router, spec.replicas)
        if self.router.reads_snapshot:
            for r in self.replicas:
                r.watch_load()
        self.latency = cfg.request_latency_s
        self.queue: deque[tuple[float, str, SimRequest, RequestOutcome | None]] = deque()
        mc = cfg.max_concurrency
        self.free_slots: deque[float] | None = deque([float("-inf")] * mc) if mc else None
        self.heap: list[tuple[float, int, int, int]] = []
        self.order = itertools.count()
        self.now = 0.0
        self.routed: dict[str, int] = {}
        self.vocab = cfg.workload.vocab_size
        # the router's text: one character per prompt token (chr of its id), the vocabulary as one string
        self.chars = "".join(map(chr, range(self.vocab))) if self.router.needs_text else ""
        for k in range(spec.replicas):
            self._push(0.0, STEP, k)

    def _push(self, t: float, kind: int, k: int) -> None:
        heapq.heappush(self.heap, (t, kind, next(self.order), k))

    def _next_send(self) -> float | None:
        if not self.queue:
            return None
        slots = self.free_slots
        if slots is None:
            return self.queue[0][0]
        return max(self.queue[0][0], slots[0]) if slots else None

    def _run_until_idle(self) -> None:
        heap, router = self.heap, self.router
        while True:
            t, kind = (heap[0][0], heap[0][1]) if heap else (INF, STEP)
            send = self._next_send()
            if send is not None and (send < t or (send == t and kind > SEND)):
                t, kind = send, SEND
            if t == INF:
                break
            periodic = router.next_periodic()
            if periodic < t or (periodic == t and kind > PERIODIC):
                self.now = periodic
                router.run_periodic(self._loads, self._snapshots)
                continue
            self.now = t
            if kind == SEND:
                self._send(t)
                continue
            if kind == END:
                router.answered(heapq.heappop(heap)[3])
                if self.free_slots is not None:
                    self.free_slots.append(t)
            else:
                self._step(heap[0][3], t)  # (it takes its event off the heap)
        stuck = [r for r in self.replicas if r.client.flights]
        if stuck:
            n = sum(len(r.client.flights) for r in stuck)
            raise SimulationStalled(f"{n} requests in flight, nothing to run (replica {stuck[0].index})")

    def _loads(self) -> list[int]:
        return [r.token_load() for r in self.replicas]

    def _snapshots(self) -> list[dict[str, Any]]:
        return [r.snapshot(self.now) for r in self.replicas]

    def _send(self, sent: float) -> None:
        _, rid, spec, outcome = self.queue.popleft()
        if self.free_slots is not None:
            self.free_slots.popleft()
        text = prompt_text(spec, self.chars) if self.router.needs_text else None
        k = self.router.route(text)
        self.routed[rid] = k
        replica = self.replicas[k]
        at = sent + self.latency
        replica.deliver(at, spec, outcome, rid, sent)
        if replica.waiting_wakeup:
            replica.waiting_wakeup = False
            self._push(at, STEP, k)

    def _step(self, k: int, t: float) -> None:
        """Run replica k's STEP event, the top of the heap, and put the replica's next one in its place (a
        heap's replace sifts once where a pop and a push sift twice). The order numbers are drawn as when
        the step's ends were pushed before its next step, so the heap pops the same sequence."""
        replica = self.replicas[k]
        replica.clock.advance_to(t)
        ran = replica.step()
        order, heap = self.order, self.heap
        ends = [(end, END, next(order), k) for end in replica.ended]
        replica.ended.clear()
        if ran:
            heapq.heapreplace(heap, (replica.clock.now(), STEP, next(order), k))
        elif replica.inbox:  # idle until the next request reaches it
            heapq.heapreplace(heap, (replica.inbox[0][0], STEP, next(order), k))
        else:
            heapq.heappop(heap)
            replica.waiting_wakeup = True
        for end in ends:
            heapq.heappush(heap, end)

    def run(self, request_trace: IO[str] | None) -> FleetResult:
        cfg = self.cfg
        if cfg.replay is not None:
            specs, rng, offsets = list(cfg.replay.requests), None, cfg.replay.arrivals
        else:
            (specs, rng), offsets = build_workload(cfg.workload), None
        if cfg.warmup_requests > 0:
            first = specs[0]
            warm = type(first)(
                first.index, first.prompt_len, first.output_len, min(first.output_len, 32), None,
                first.ignore_eos, first.offset, first.tokens,
            )  # fmt: skip
            for k in range(cfg.warmup_requests):
                self.queue.append((self.now, f"warmup-{k}", warm, None))
            self._run_until_idle()
            if not sum(r.client.warmup_ok for r in self.replicas):
                errors = [e for r in self.replicas for e in r.client.warmup_errors]
                raise WarmupFailed(f"the warm-up request failed: {errors[0]}")
            self.now += 1.0  # bench_serving sleeps a second before the measured run
        start = self.now
        outcomes = [RequestOutcome(prompt_len=s.prompt_len) for s in specs]
        arrival = start
        for spec, outcome in zip(specs, outcomes, strict=True):
            if offsets is not None:
                arrival = start + offsets[spec.index]
            self.queue.append((arrival, f"req-{spec.index}", spec, outcome))
            if rng is not None and cfg.request_rate != float("inf"):
                arrival += float(rng.exponential(1.0 / cfg.request_rate))
        self._run_until_idle()
        return self._finish(specs, outcomes, start, request_trace)

    def _finish(
        self,
        specs: list[SimRequest],
        outcomes: list[RequestOutcome],
        start: float,
        request_trace: IO[str] | None,
    ) -> FleetResult:
        duration, metrics = run_metrics([r.client for r in self.replicas], outcomes, start)
        routed = [self.routed[f"req-{s.index}"] for s in specs]
        if request_trace is not None:
            tagged = len(self.replicas) > 1
            for spec, o, k in zip(specs, outcomes, routed, strict=True):
                line = simulated_line(
                    f"req-{spec.index}", o.start_time - start, spec.prompt_len, spec.max_new_tokens,
                    o.output_len, spec.true_output_len, spec.ignore_eos, o.success, o.ttft, o.latency,
                    o.error,
                )  # fmt: skip
                if tagged:
                    line = json.dumps({**json.loads(line), "replica": k}) + "\n"
                request_trace.write(line)
        sim = SimResult(
            outcomes=outcomes,
            duration_s=duration,
            metrics=metrics,
            retractions=sum(r.client.retractions for r in self.replicas),
            steps=sum(r.steps for r in self.replicas),
            scheduler=self.replicas[0].scheduler,
            finished_rids=[rid for r in self.replicas for rid in r.client.finished_rids],
            leapt=sum(r.leaper.total for r in self.replicas if r.leaper is not None),
        )
        return FleetResult(sim, self.replicas, routed)
