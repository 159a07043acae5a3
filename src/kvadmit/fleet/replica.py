"""One replica of a fleet: its own scheduler, simulated executor, clock and engine (driven only through the
engine's public API: submit via the client, step, clock), an inbox of requests on their way to it, and
what the per-replica table reports (requests, peak queue, retractions, KV usage)."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from typing import IO, Any

from kvadmit.bench.metrics import RequestOutcome
from kvadmit.bench.workload import SimRequest
from kvadmit.engine import Engine, StepObserver, VirtualClock
from kvadmit.executor.base import StepResult
from kvadmit.executor.simulated import EOS_TOKEN_ID, SimulatedExecutor
from kvadmit.observe.load_snapshot import LoadCounters, load_snapshot
from kvadmit.observe.step_trace import step_row
from kvadmit.request import Req
from kvadmit.scheduler.events import Event
from kvadmit.scheduler.scheduler import ScheduledBatch, Scheduler
from kvadmit.sim.client import SimClient
from kvadmit.sim.leap import Leaper
from kvadmit.sim.run import SimConfig, _log_writer


def rank_tagged(emit: Callable[[str], None], tag: str) -> Callable[[str], None]:
    """SGLang's rank tag inside the timestamp bracket: `[2026-01-01 00:00:01 DP0] …`."""

    def tagged(line: str) -> None:
        close = line.find("] ")
        emit(line[:close] + f" {tag}" + line[close:] if line.startswith("[") and close > 0 else line)

    return tagged


class Replica:
    def __init__(
        self,
        index: int,
        cfg: SimConfig,
        emit_log: Callable[[str], None] | None,
        step_trace: IO[str] | None,
        watch_steps: tuple[StepObserver, ...],
        watch_events: tuple[Callable[[Event, float], None], ...],
        tagged: bool,
    ) -> None:
        self.index = index
        self.scheduler = Scheduler(
            cfg.args, context_len=cfg.context_len, eos_token_ids=frozenset({EOS_TOKEN_ID})
        )
        if not watch_steps:  # (an outside step observer may read the requests' KV arrays)
            self.scheduler.defer_decode_slots()
        self.clock = VirtualClock(0.0)
        self.client = SimClient(None, self.clock, cfg.workload.vocab_size, None, 0.0)
        executor = SimulatedExecutor(cfg.cost, self.client.true_output_len)
        observers: list[Callable[[Event, float], None]] = [self.client.observe, *watch_events]
        if emit_log is not None:
            emit = rank_tagged(emit_log, f"DP{index}") if tagged else emit_log
            observers.append(_log_writer(cfg, self.scheduler, self.clock, emit).handle)
        steps: list[StepObserver] = [*watch_steps, self._watch]
        if step_trace is not None:
            steps.append(self._tracer(step_trace, tagged))
        self.engine = Engine(self.scheduler, executor, self.clock, self, observers, steps)
        self.client.engine = self.engine
        # One quiet step per STEP event (sim/leap.py), so the driver's events keep their order.
        self.leaper = Leaper(self.engine, executor, self.clock) if cfg.leaps and not watch_steps else None
        self.inbox: deque[tuple[float, SimRequest, RequestOutcome | None, str, float]] = deque()
        self.waiting_wakeup = False  # idle, with no step scheduled: the next delivery wakes it
        self.ended: list[float] = []  # end times of requests not yet reported to the router
        self.requests = 0
        self.steps = 0
        self.peak_queue = 0
        self.kv_peak = 0.0
        self.kv_time = 0.0  # ∫ token usage dt over the steps
        self.busy_time = 0.0
        self.load: LoadCounters | None = None  # what /v1/loads accumulates, once watch_load() is called

    # ----- the engine's Listener -----------------------------------------------------------------
    def on_step(self, batch: ScheduledBatch, now: float) -> None:
        self.client.on_step(batch, now)

    def on_finish(self, req: Req, now: float) -> None:
        self.client.on_finish(req, now)
        self.ended.append(now)

    # ----- driving -------------------------------------------------------------------------------
    def deliver(
        self, at: float, spec: SimRequest, outcome: RequestOutcome | None, rid: str, sent: float
    ) -> None:
        self.requests += outcome is not None
        self.inbox.append((at, spec, outcome, rid, sent))

    def step(self) -> bool:
        """Hand over what has arrived by now, then one scheduling pass (False: nothing ran)."""
        now = self.clock.now()
        inbox = self.inbox
        while inbox and inbox[0][0] <= now:
            _, spec, outcome, rid, sent = inbox.popleft()
            self.client.send_now(spec, outcome, rid, sent)
        if self.leaper is not None and self.leaper.leap(max_rounds=1):
            self.steps += 1
            return True
        ran = self.engine.step()
        self.steps += ran
        return ran

    def token_load(self) -> int:
        """/get_load's num_tokens (0.5.9): the pool's tokens in use plus the waiting requests' tokens."""
        s = self.scheduler
        used = s.max_total_num_tokens - s.pool.available_size() - s.cache.evictable_size()
        return used + sum(r.seqlen for r in s.waiting)

    def watch_load(self) -> None:
        """Keep the counters behind /v1/loads (a worker run with --enable-metrics, whose gen_throughput
        smg's power_of_two reads), from time 0 of the run."""
        self.load = LoadCounters(metrics_on=True, started=0.0)
        self.engine.observers.append(self.load.on_event)

    def snapshot(self, at: float) -> dict[str, Any]:
        """/v1/loads' snapshot (observe/load_snapshot.py) as the replica stands at `at` or, when a step
        runs past `at`, once that step is processed (its clock then)."""
        assert self.load is not None, "watch_load() first"
        return load_snapshot(self.scheduler, self.load, max(at, self.clock.now()))

    def _watch(self, batch: ScheduledBatch, result: StepResult, now: float) -> None:
        s = self.scheduler
        queue = len(s.waiting)
        if queue > self.peak_queue:
            self.peak_queue = queue
        usage = (s.max_total_num_tokens - s.pool.available_size() - s.cache.evictable_size()) / (
            s.max_total_num_tokens or 1
        )
        if usage > self.kv_peak:
            self.kv_peak = usage
        self.kv_time += usage * result.seconds
        self.busy_time += result.seconds

    def _tracer(self, out: IO[str], tagged: bool) -> StepObserver:
        number = 0

        def trace(batch: ScheduledBatch, result: StepResult, now: float) -> None:
            nonlocal number
            number += 1
            row = step_row(self.scheduler, batch, number, now, result.seconds)
            if tagged:
                row["replica"] = self.index
            out.write(json.dumps(row) + "\n")

        return trace
