"""The engine loop: one scheduler, one executor, one clock (docs/architecture.md, "One step of the engine").

SGLang's two event loops (docs/sglang-rules.md A.1), chosen by --disable-overlap-schedule:

    non-overlap step():  batch = scheduler.next_batch()      events (retraction, aborts) now
                         result = executor.run(batch)         the step takes result.seconds
                         scheduler.on_batch_done(batch, …)    tokens, finishes and events at its end

    overlap step():      next = scheduler.next_batch()       scheduled while the last batch still runs
                         on_batch_done(last, …)               at the time the last batch ends
                         executor.run(next)                   launched then; processed next step()

In the overlap loop the scheduler's own work hides behind the forward in flight, as on a GPU: a batch's
result is ready `seconds` after its launch, whatever the scheduling pass in between cost. (The executor
computes a batch after the last result is processed, since a real model needs that result's tokens; the
decisions and times are those of the overlapped loop.)

Observers get every scheduler event with the clock time it happened at; the listener hears each token and
each request's end exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Protocol

from kvadmit.executor.base import Executor, StepResult
from kvadmit.request import Req
from kvadmit.scheduler.events import Event, RequestAborted
from kvadmit.scheduler.scheduler import ScheduledBatch, Scheduler

Observer = Callable[[Event, float], None]
StepObserver = Callable[[ScheduledBatch, StepResult, float], None]


class Clock(Protocol):
    def now(self) -> float: ...
    def wait_until(self, t: float) -> None: ...


class VirtualClock:
    """Simulated time: a step of s seconds moves it by exactly s; nothing waits."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def advance_to(self, t: float) -> None:
        self.t = max(self.t, t)

    def wait_until(self, t: float) -> None:
        self.advance_to(t)


class WallClock:
    """Real time. A real model's step has taken its time when it returns; a simulated one's result is
    waited for until its predicted time after launch."""

    def now(self) -> float:
        return time.time()

    def wait_until(self, t: float) -> None:
        left = t - time.time()
        if left > 0:
            time.sleep(left)


class Listener(Protocol):
    """Hears each step (every request of the batch got a token, but a prefill's unfinished chunk) and
    each request's end, exactly once."""

    def on_step(self, batch: ScheduledBatch, now: float) -> None: ...
    def on_finish(self, req: Req, now: float) -> None: ...


class Engine:
    def __init__(
        self,
        scheduler: Scheduler,
        executor: Executor,
        clock: Clock,
        listener: Listener,
        observers: Iterable[Observer] = (),
        step_observers: Iterable[StepObserver] = (),
    ) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.clock = clock
        self.listener = listener
        self.observers = list(observers)
        self.step_observers = list(step_observers)
        self.live: dict[str, Req] = {}  # submitted and not yet ended
        self.overlap = not scheduler.args.disable_overlap_schedule
        # Overlap loop: the batch launched last, its result, and when that result is ready.
        self.pending: tuple[ScheduledBatch, StepResult, float] | None = None
        self.launched = 0  # batches run

    def submit(self, req: Req) -> bool:
        """Hand a request to the scheduler; False if it was rejected (its end is already reported)."""
        if req.rid in self.live:
            raise ValueError(f"request id {req.rid!r} is already in use")
        self.live[req.rid] = req
        accepted = self.scheduler.add_request(req)
        self._dispatch(self.clock.now())
        return accepted

    def abort(self, rid: str) -> bool:
        found = self.scheduler.abort_request(rid)
        self._dispatch(self.clock.now())
        return found

    def step(self) -> bool:
        """One iteration of the event loop. False when there was nothing to run or to process."""
        if self.overlap:
            return self._overlap_step()
        batch = self.scheduler.next_batch()
        self._dispatch(self.clock.now())
        if batch is None:
            return False
        start = self.clock.now()
        result = self.executor.run(batch)
        self.launched += 1
        self.clock.wait_until(start + result.seconds)
        self._process(batch, result)
        return True

    def _overlap_step(self) -> bool:
        batch = self.scheduler.next_batch()
        scheduled = self.clock.now()
        self._dispatch(scheduled)
        pending, self.pending = self.pending, None
        start = scheduled
        if pending is not None:
            last, result, ready = pending
            self.clock.wait_until(ready)
            self._process(last, result)
            # As on a GPU, the batch just scheduled starts the moment the last one ends (or when it was
            # scheduled, if later), not after that result's processing: a step lasts max(its cost, the
            # scheduler's work), the processing hides behind it. (A real executor has already taken its
            # time by the time run() returns, so its wait below never waits.)
            start = max(scheduled, ready)
        if batch is None:
            return pending is not None
        result = self.executor.run(batch)
        self.launched += 1
        self.pending = (batch, result, start + result.seconds)
        return True

    def _process(self, batch: ScheduledBatch, result: StepResult) -> None:
        batch.graph = result.graph
        outcome = self.scheduler.on_batch_done(batch, result.next_token_ids, result.filler)
        now = self.clock.now()
        for watch in self.step_observers:
            watch(batch, result, now)
        self.listener.on_step(batch, now)
        for req in outcome.finished:
            self._ended(req, now)
        self._dispatch(now)

    def _ended(self, req: Req, now: float) -> None:
        if self.live.pop(req.rid, None) is not None:
            self.listener.on_finish(req, now)

    def _dispatch(self, now: float) -> None:
        events = self.scheduler.drain_events()
        for event in events:
            for observe in self.observers:
                observe(event, now)
            if isinstance(event, RequestAborted):
                req = self.live.get(event.rid)
                if req is not None:
                    self._ended(req, now)

    @property
    def busy(self) -> bool:
        return bool(self.live) or self.pending is not None
