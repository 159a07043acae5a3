"""One simulated benchmark run: server (scheduler + simulated executor on a virtual clock) and a
bench_serving-like client, printing SGLang's log lines and returning what bench_serving would report."""

from __future__ import annotations

import gc
import itertools
import json
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import IO

from kvadmit.bench.metrics import BenchmarkMetrics, RequestOutcome
from kvadmit.bench.workload import SimRequest, WorkloadSpec, build_workload
from kvadmit.config import SIMULATED_CONTEXT_LENGTH, ServerArgs
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.engine import Engine, StepObserver, VirtualClock
from kvadmit.executor.base import StepResult
from kvadmit.executor.simulated import EOS_TOKEN_ID, SimulatedExecutor
from kvadmit.observe.request_trace import simulated_line
from kvadmit.observe.sglang_log import SGLangLogWriter
from kvadmit.observe.startup import startup_info
from kvadmit.observe.step_trace import step_row
from kvadmit.scheduler.events import Event
from kvadmit.scheduler.scheduler import ScheduledBatch, Scheduler
from kvadmit.sim.client import SimClient, run_metrics
from kvadmit.sim.leap import Leaper
from kvadmit.sim.replay import Replay

DEFAULT_START = datetime(2026, 1, 1, tzinfo=timezone.utc)
INF = float("inf")


class WarmupFailed(RuntimeError):
    """No warm-up request succeeded (bench_serving stops there too): the message says why."""


class SimulationStalled(RuntimeError):
    """Requests are in flight but the scheduler has nothing to run (a bug if it ever happens)."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    args: ServerArgs
    workload: WorkloadSpec
    cost: CostModel
    request_rate: float = float("inf")
    max_concurrency: int | None = None
    warmup_requests: int = 1
    context_len: int = SIMULATED_CONTEXT_LENGTH
    backend: str = "sglang"
    start: datetime = DEFAULT_START
    replay: Replay | None = None  # requests and send times from a trace, instead of the workload
    request_latency_s: float = 0.0  # from a client sending a request to the scheduler seeing it
    # Replay by step (replay.py): each request handed over right after the step it followed on the server.
    replay_by_step: bool = False
    # Run uneventful decode steps as leaps (sim/leap.py): the same output, faster; False steps one by one.
    leaps: bool = True


@dataclass(slots=True)
class SimResult:
    outcomes: list[RequestOutcome]
    duration_s: float
    metrics: BenchmarkMetrics
    retractions: int
    steps: int
    scheduler: Scheduler
    finished_rids: list[str] = field(default_factory=list)
    leapt: int = 0  # of the steps, those run as leaps (quiet steps, sim/leap.py)


def simulate(
    cfg: SimConfig,
    emit_log: Callable[[str], None] | None = None,
    request_trace: IO[str] | None = None,
    step_trace: IO[str] | None = None,
    watch_steps: tuple[StepObserver, ...] = (),
    watch_events: tuple[Callable[[Event, float], None], ...] = (),
) -> SimResult:
    with gc_paused():
        return _simulate(cfg, emit_log, request_trace, step_trace, watch_steps, watch_events)


@contextmanager
def gc_paused() -> Iterator[None]:
    """A run makes millions of short-lived objects but (almost) no reference cycles: refcounting frees
    them, and the cyclic collector's passes over an ever larger heap only cost time. Pause it for the
    run; whatever cycles there are get collected when it is back on."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _simulate(
    cfg: SimConfig,
    emit_log: Callable[[str], None] | None,
    request_trace: IO[str] | None,
    step_trace: IO[str] | None,
    watch_steps: tuple[StepObserver, ...],
    watch_events: tuple[Callable[[Event, float], None], ...],
) -> SimResult:
    if cfg.replay is not None:
        specs, rng, offsets = list(cfg.replay.requests), None, cfg.replay.arrivals
    else:
        (specs, rng), offsets = build_workload(cfg.workload), None
    scheduler = Scheduler(cfg.args, context_len=cfg.context_len, eos_token_ids=frozenset({EOS_TOKEN_ID}))
    if not watch_steps:  # (an outside step observer may read the requests' KV arrays)
        scheduler.defer_decode_slots()
    clock = VirtualClock(0.0)  # seconds since cfg.start (small numbers keep full float precision)
    client = SimClient(None, clock, cfg.workload.vocab_size, cfg.max_concurrency, cfg.request_latency_s)
    executor = SimulatedExecutor(cfg.cost, client.true_output_len)
    observers: list[Callable[[Event, float], None]] = [client.observe, *watch_events]
    if emit_log is not None:
        observers.append(_log_writer(cfg, scheduler, clock, emit_log).handle)
    step_observers = list(watch_steps)
    if step_trace is not None:
        step_observers.append(_step_tracer(scheduler, step_trace))
    engine = Engine(scheduler, executor, clock, client, observers, step_observers)
    client.engine = engine
    # Leaps need step observers that read no request's lengths (the trace's and the client's do not).
    leaper = Leaper(engine, executor, clock) if cfg.leaps and not watch_steps else None
    steps = 0

    def run_until_idle() -> None:
        nonlocal steps
        steps += _run_until_idle(engine, client, clock, leaper)

    if cfg.replay is not None and cfg.replay_by_step:
        outcomes = [RequestOutcome(prompt_len=s.prompt_len) for s in specs]
        steps = _run_by_step(cfg.replay, engine, client, clock, outcomes)
        return _finish(cfg, specs, outcomes, client, 0.0, request_trace, client.retractions, steps, scheduler)

    # Warm-up: the first request's prompt, at most 32 output tokens, behind the same concurrency limit.
    if cfg.warmup_requests > 0:
        first = specs[0]
        warm = type(first)(
            first.index, first.prompt_len, first.output_len, min(first.output_len, 32), None,
            first.ignore_eos, first.offset, first.tokens,
        )  # fmt: skip
        for k in range(cfg.warmup_requests):
            client.schedule(clock.now(), warm, None, f"warmup-{k}")
        run_until_idle()
        if not client.warmup_ok:
            raise WarmupFailed(f"the warm-up request failed: {client.warmup_errors[0]}")
        clock.advance(1.0)  # bench_serving sleeps a second before the measured run

    start = clock.now()
    outcomes = [RequestOutcome(prompt_len=s.prompt_len) for s in specs]
    arrival = start
    for spec, outcome in zip(specs, outcomes, strict=True):
        if offsets is not None:
            arrival = start + offsets[spec.index]
        client.schedule(arrival, spec, outcome, f"req-{spec.index}")
        if rng is not None and cfg.request_rate != float("inf"):
            arrival += float(rng.exponential(1.0 / cfg.request_rate))
    run_until_idle()
    result = _finish(cfg, specs, outcomes, client, start, request_trace, client.retractions, steps, scheduler)
    result.leapt = leaper.total if leaper is not None else 0
    return result


def _run_until_idle(engine: Engine, client: SimClient, clock: VirtualClock, leaper: Leaper | None) -> int:
    """Send requests as they come due and run steps (quiet ones as leaps) until all have ended; the
    steps run."""
    steps = 0
    while True:
        client.send_due()
        if leaper is not None:
            nxt = client.next_arrival()
            ran = leaper.leap(INF if nxt is None else nxt)
            if ran:
                steps += ran
                continue
        if engine.step():
            steps += 1
            continue
        nxt = client.next_arrival()
        if nxt is not None:
            clock.advance_to(nxt)
            continue
        if client.flights:
            raise SimulationStalled(f"{len(client.flights)} requests in flight, nothing to run")
        return steps


def _log_writer(
    cfg: SimConfig, scheduler: Scheduler, clock: VirtualClock, emit_log: Callable[[str], None]
) -> SGLangLogWriter:
    """SGLang's log lines on the virtual clock, from cfg.start; the start-up line written."""
    writer = SGLangLogWriter(
        emit_log,
        start_time=clock.now(),
        pending_token_field=scheduler.profile.prefill_log_has_pending_token,
        to_datetime=lambda t: cfg.start + timedelta(seconds=t),
    )
    writer.handle(startup_info(scheduler, cfg.args, available_mem_gb=0.0), clock.now())
    return writer


def _step_tracer(scheduler: Scheduler, step_trace: IO[str]) -> StepObserver:
    """--trace-steps: one JSON line per step (observe/step_trace.py), numbered from 1."""
    numbers = itertools.count(1)

    def trace(batch: ScheduledBatch, result: StepResult, now: float) -> None:
        row = step_row(scheduler, batch, next(numbers), now, result.seconds)
        step_trace.write(json.dumps(row) + "\n")

    return trace


def _run_by_step(
    replay: Replay, engine: Engine, client: SimClient, clock: VirtualClock, outcomes: list[RequestOutcome]
) -> int:
    """Hand each request over right after the step it followed on the server; the steps run.

    Request i was received by the server after its step arrival_steps[i] (counted from the trace's
    first request), before the next scheduling pass; if an idle pass came between, the replay takes one
    too (it resets the new-token ratio). While the engine has nothing to run the clock moves on to the
    request's recorded arrival, so idle gaps stay in the simulated times. Should the replay find nothing
    to run where the server had work (its decisions differed), the next request is handed over at once."""
    steps_of, after_idle = replay.arrival_steps, replay.after_idle
    assert steps_of is not None and after_idle is not None
    base, first = min(steps_of), min(replay.arrivals)
    pending = deque(sorted(range(len(replay.requests)), key=lambda i: (steps_of[i], i)))
    steps = 0
    idle_pass = True  # the engine found nothing to run since its last step (true before the first)
    while True:
        while pending:
            i = pending[0]
            due = steps_of[i] - base <= steps
            if not due and not (idle_pass and engine.scheduler.is_fully_idle()):
                break
            pending.popleft()
            if after_idle[i] and not idle_pass:
                # The server's pass that found nothing to run before this request came: it drops the
                # requests that finished in the last step and, the engine then idle, resets the ratio.
                if engine.step():
                    steps += 1  # the replay had work there: its decisions have already differed
                else:
                    idle_pass = True
            if idle_pass and engine.scheduler.is_fully_idle():
                clock.advance_to(replay.arrivals[i] - first)  # the engine waited for it
            spec = replay.requests[i]
            client.send_now(spec, outcomes[spec.index], f"req-{spec.index}", clock.now())
            if not due:
                break  # handed over ahead of its step: run what it brought first
        if engine.step():
            steps += 1
            idle_pass = False
            continue
        idle_pass = True
        if pending:
            continue
        if client.flights:
            raise SimulationStalled(f"{len(client.flights)} requests in flight, nothing to run")
        return steps


def _finish(
    cfg: SimConfig,
    specs: list[SimRequest],
    outcomes: list[RequestOutcome],
    client: SimClient,
    start: float,
    request_trace: IO[str] | None,
    retractions: int,
    steps: int,
    scheduler: Scheduler,
) -> SimResult:
    duration, metrics = run_metrics([client], outcomes, start)
    if request_trace is not None:
        for spec, o in zip(specs, outcomes, strict=True):
            line = simulated_line(
                f"req-{spec.index}", o.start_time - start, spec.prompt_len, spec.max_new_tokens, o.output_len,
                spec.true_output_len, spec.ignore_eos, o.success, o.ttft, o.latency, o.error,
            )  # fmt: skip
            request_trace.write(line)
    return SimResult(
        outcomes=outcomes,
        duration_s=duration,
        metrics=metrics,
        retractions=retractions,
        steps=steps,
        scheduler=scheduler,
        finished_rids=client.finished_rids,
    )
