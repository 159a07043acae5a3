"""Before a decode step: can every running request get a slot? If not (or when SGLANG_TEST_RETRACT forces
it), retract: retraction.py picks the victims; this applies the outcome (the last request's end as the
SGLang release had it, the events, the new-token ratio, the requeue). A mixin of Scheduler, like
StepResults; the state it reads belongs to Scheduler."""

from __future__ import annotations

from typing import Final

from kvadmit.config import SchedulerKnobs, VersionProfile
from kvadmit.memory.pool import ReqSlotPool, TokenPool
from kvadmit.memory.radix import RadixCache
from kvadmit.request import FinishKind, FinishReason, Req
from kvadmit.scheduler.batch import RunningBatch
from kvadmit.scheduler.errors import EngineCrash
from kvadmit.scheduler.events import Event, LastRequestAborted, RequestAborted, Retraction
from kvadmit.scheduler.policy import AdmissionPolicy
from kvadmit.scheduler.ratio import NewTokenRatio, ratio_after_retract
from kvadmit.scheduler.retraction import (
    LAST_REQUEST_ABORT_MESSAGE,
    LAST_REQUEST_ASSERTION,
    LAST_REQUEST_VALUE_ERROR,
    RetractResult,
    check_decode_mem,
    evict_for,
    retract_decode,
)
from kvadmit.scheduler.traits import trait
from kvadmit.scheduler.types import ScheduledBatch


class _DecodeSkipped:
    """The overlap loop's answer when the next decode step does not fit but requests finishing in the
    step in flight will free KV: skip decode this pass (no retraction, no ratio decay)."""

    def __repr__(self) -> str:
        return "DECODE_SKIPPED"


DECODE_SKIPPED: Final = _DecodeSkipped()


@trait
class DecodeMemory:
    """check_decode_or_retract and what it needs."""

    running: RunningBatch
    cache: RadixCache
    pool: TokenPool
    req_slots: ReqSlotPool
    page_size: int
    knobs: SchedulerKnobs
    profile: VersionProfile
    policy: AdmissionPolicy
    ratio: NewTokenRatio
    forward_ct: int
    events: list[Event]
    last_retract_result: RetractResult | None
    in_flight: ScheduledBatch | None
    _left_in_pass: list[Req]
    _dropped_finishing: list[Req]
    _defer_slots: bool

    def _enqueue(self, req: Req, front: bool = False) -> bool:  # RequestIntake's, earlier in the MRO
        raise NotImplementedError

    def _alloc_kv(self, req: Req, n: int) -> None:  # Scheduler's, earlier in the MRO
        raise NotImplementedError

    def _new_running_batch(self, reqs: list[Req] | None = None) -> RunningBatch:  # Scheduler's
        raise NotImplementedError

    def defer_decode_slots(self) -> None:
        """Page size 1: count slots rather than name them (an anonymous pool), and keep each decode
        step's slots owed, writing them into the requests' KV arrays only when something reads them
        (scheduler/owed_slots.py). For an executor that reads no slot id and step observers that read no
        KV array (the simulator's); call before the first request."""
        if self.page_size == 1 and not self.running.reqs:
            self.pool.make_anonymous()
            self._defer_slots = True
            self.running = self._new_running_batch()

    def check_decode_or_retract(
        self, finishing_in_flight: bool = False
    ) -> Retraction | _DecodeSkipped | None:
        """Before a decode step: can every running request get a slot? If not (or when SGLANG_TEST_RETRACT
        forces it), retract, set the ratio to the post-retraction estimate and return what happened.
        `finishing_in_flight`: requests the batch in flight finishes by length were just taken out; if
        the rest do not fit, skip decode this pass instead (DECODE_SKIPPED)."""
        memory_ok = check_decode_mem(self.running.reqs, self.cache, self.pool, self.page_size)
        if not memory_ok and finishing_in_flight:
            return DECODE_SKIPPED
        forced = (
            memory_ok and self.knobs.test_retract and self.forward_ct % self.knobs.test_retract_interval == 0
        )
        if memory_ok and not forced:
            return None
        return self._retract(forced)

    def _retract(self, forced: bool) -> Retraction:
        running = self.running
        before = self.pool.available_size()
        old_ratio = self.ratio.current
        result = retract_decode(
            running.reqs,
            self.cache,
            self.pool,
            self.page_size,
            self.knobs.retract_decode_steps,
            self._release,
            self.policy.retraction_order,
        )
        last = result.last_request
        if last is not None:
            oom = self.profile.last_request_oom
            if oom == "value_error":
                raise EngineCrash(f"ValueError: {LAST_REQUEST_VALUE_ERROR}")
            if oom == "assertion":
                raise EngineCrash(
                    f"AssertionError: {LAST_REQUEST_ASSERTION}, "
                    f"self.token_to_kv_pool_allocator.available_size()={self.pool.available_size()}"
                )
            self._release(last)
            last.reset_for_retract()
            last.finished_reason = FinishReason(FinishKind.ABORT, LAST_REQUEST_ABORT_MESSAGE, 500)
            self.events.append(LastRequestAborted(last.rid))
            self.events.append(RequestAborted(last.rid, LAST_REQUEST_ABORT_MESSAGE, 500))
        self._left_in_pass += result.retracted if last is None else [*result.retracted, last]
        running.replace(result.kept)
        new_ratio = ratio_after_retract(
            [len(r.output_ids) for r in result.kept],
            [r.max_new_tokens for r in result.kept],
            self.knobs.retract_decode_steps,
        )
        self.ratio.current = new_ratio
        self.last_retract_result = result
        event = Retraction(
            rids=tuple(r.rid for r in result.retracted),
            new_tokens_gained=self.pool.available_size() - before,
            old_ratio=old_ratio,
            new_ratio=new_ratio,
            forced=forced,
            input_tokens=sum(len(r.origin_input_ids) for r in result.retracted),
            output_tokens=sum(len(r.output_ids) for r in result.retracted),
        )
        self.events.append(event)
        for req in result.retracted:
            self._enqueue(req, front=self.policy.requeue_at_front)
        return event

    def _release(self, req: Req) -> None:
        """Free a request's own KV (no caching) and its request slot."""
        self.running.settle_all()  # (a retraction or preemption: every member's slots, before any leaves)
        self.cache.release_req(req)
        self.req_slots.free()

    def _finishing_in_flight(self) -> list[Req]:
        """Overlap loop (SGLang's `_reqs_finishing_inflight`): running requests in the batch in flight
        whose result commits their last output by length (len(outputs) + 1 ≥ max_new_tokens, outputs
        lagging one token). They leave the running batch now and get no decode slot."""
        self._dropped_finishing = []
        if self.in_flight is None:
            return []
        due = self.running.due_within(1)
        if due:
            in_batch = set(map(id, self.in_flight.reqs))
            self._dropped_finishing = [r for r in due if id(r) in in_batch]
        return self._dropped_finishing

    def drop_finishing_in_flight(self) -> list[Req]:
        """Take the requests the batch in flight finishes by length out of the running batch."""
        finishing = self._finishing_in_flight()
        if finishing:
            self.running.drop_at(sorted(map(self.running.reqs.index, finishing)))
        return finishing

    def alloc_decode_slots(self) -> None:
        """SGLang's prepare_for_decode: one more slot for each running request."""
        running = self.running
        if self.page_size == 1:
            running.take_decode_slots(self.pool)
            return
        # SGLang over-estimates the step: it evicts as if every request needed a fresh page.
        evict_for(self.cache, self.pool, len(running.reqs) * self.page_size)
        for req in running.reqs:
            self._alloc_kv(req, 1)
        running.kv_tokens += len(running.reqs)  # one slot each
