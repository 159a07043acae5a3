"""The engine loop: one scheduler, one executor, one clock (docs/architecture.md, "One step of the engine").

    step():  batch = scheduler.next_batch()      events (retraction, aborts) at the current time
             result = executor.run(batch)         the step takes result.seconds
             scheduler.on_batch_done(batch, …)    tokens, finishes and events at the step's end

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
    def advance(self, seconds: float) -> None: ...


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


class WallClock:
    """Real time; a step's duration has already passed when it returns."""

    def now(self) -> float:
        return time.time()

    def advance(self, seconds: float) -> None:
        pass


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
        """Run one batch. False when there was nothing to run."""
        batch = self.scheduler.next_batch()
        self._dispatch(self.clock.now())
        if batch is None:
            return False
        result = self.executor.run(batch)
        self.clock.advance(result.seconds)
        outcome = self.scheduler.on_batch_done(batch, result.next_token_ids)
        now = self.clock.now()
        for watch in self.step_observers:
            watch(batch, result, now)
        self.listener.on_step(batch, now)
        for req in outcome.finished:
            self._ended(req, now)
        self._dispatch(now)
        return True

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
        return bool(self.live)
