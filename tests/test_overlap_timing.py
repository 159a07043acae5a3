"""The overlap loop's times when the scheduler's own work takes time (a served, simulated model on the
wall clock): as on a GPU, the batch scheduled while the last one runs starts the moment that one ends, so
each step lasts max(its cost, the work between steps), never their sum. Expected times by hand."""

from __future__ import annotations

from kvadmit.config import ServerArgs
from kvadmit.engine import Engine, VirtualClock
from kvadmit.executor.base import StepResult
from kvadmit.request import Req, SamplingLimits
from kvadmit.scheduler.scheduler import ScheduledBatch, Scheduler

STEP_S = 0.010  # every batch, prefill or decode, costs 10 ms


class _FixedCost:
    def run(self, batch: ScheduledBatch) -> StepResult:
        return StepResult([7] * len(batch.reqs), STEP_S)


class _BusyListener:
    """Handing a step's tokens out takes `work` seconds of the loop's own time."""

    def __init__(self, clock: VirtualClock, work: float) -> None:
        self.clock, self.work = clock, work

    def on_step(self, batch: ScheduledBatch, now: float) -> None:
        self.clock.advance(self.work)

    def on_finish(self, req: Req, now: float) -> None:
        pass


def _processed_at(work: float, outputs: int, overlap: bool = True) -> list[float]:
    """When each batch's result was processed: one request of `outputs` tokens."""
    sched = Scheduler(ServerArgs(max_total_tokens=200, disable_overlap_schedule=not overlap))
    clock = VirtualClock()
    times: list[float] = []
    engine = Engine(sched, _FixedCost(), clock, _BusyListener(clock, work), (),
                    (lambda batch, result, now: times.append(round(now, 9)),))  # fmt: skip
    engine.submit(Req("r", list(range(100, 110)), SamplingLimits(requested_max_new_tokens=outputs)))
    while engine.step():
        pass
    return times


def test_work_shorter_than_the_step_hides_behind_it() -> None:
    # 3 ms of work after each result: batch k+1 was scheduled before batch k ended and starts at its end,
    # so results are ready at 10, 20, 30, 40 ms (not 10, 23, 36, 49)
    assert _processed_at(work=0.003, outputs=4) == [0.010, 0.020, 0.030, 0.040]


def test_work_longer_than_the_step_sets_the_pace() -> None:
    # 15 ms of work: batch k+1 starts when it was scheduled (after batch k-1's work), 15 ms apart:
    # 0 → ready 10, processed 10..25; next starts at 10 → ready 20, processed at 25..40; next starts at
    # 25 → ready 35, processed at 40; next starts at 40 → ready 50, processed at 55
    assert _processed_at(work=0.015, outputs=4) == [0.010, 0.025, 0.040, 0.055]


def test_the_non_overlap_loop_still_adds_the_work_to_every_step() -> None:
    # SGLang's non-overlap loop: schedule, run 10 ms, process 3 ms, then schedule the next
    assert _processed_at(work=0.003, outputs=3, overlap=False) == [0.010, 0.023, 0.036]
