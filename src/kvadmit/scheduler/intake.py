"""Requests in: queue a request with the output budget it is granted, or turn it away (empty, too long,
queue full); client aborts. A mixin of Scheduler, like StepResults; the state it reads belongs to it."""

from __future__ import annotations

from kvadmit.config import SchedulerKnobs, ServerArgs
from kvadmit.request import FinishKind, FinishReason, Req
from kvadmit.scheduler.batch import RunningBatch
from kvadmit.scheduler.events import Event, RequestAborted
from kvadmit.scheduler.output_budget import grant_max_new_tokens
from kvadmit.scheduler.priority import (
    ABORTED_BY_PRIORITY_MESSAGE,
    PRIORITY_DISABLED_MESSAGE,
    PriorityScheduling,
)
from kvadmit.scheduler.results import CLIENT_ABORT_MESSAGE
from kvadmit.scheduler.traits import trait
from kvadmit.scheduler.types import QUEUE_FULL_MESSAGE, ScheduledBatch


@trait
class RequestIntake:
    """add_request, abort_request and the waiting queue's bookkeeping."""

    args: ServerArgs
    knobs: SchedulerKnobs
    page_size: int
    context_len: int
    max_req_len: int
    max_total_num_tokens: int
    eos_token_ids: frozenset[int]
    prio: PriorityScheduling
    waiting: list[Req]
    running: RunningBatch
    chunked_req: Req | None
    last_batch: ScheduledBatch | None
    events: list[Event]
    _seq: int
    _waiting_tokens: int  # Σ seqlen over the waiting queue
    _stop_token_union: frozenset[int]
    _abort_rids: set[str]

    def add_request(self, req: Req) -> bool:
        """Queue a request. Returns False (and finishes it with an abort) when it can never run or the
        queue is full. Grants its output budget (req.max_new_tokens, min_new_tokens, stop_token_ids)
        from what it asked (req.sampling, left as it is), as SGLang's init_req_max_new_tokens does."""
        req.seq = self._seq
        self._seq += 1
        if not self.prio.resolve(req):
            return self._reject(req, PRIORITY_DISABLED_MESSAGE, 503)
        input_len = len(req.origin_input_ids)
        if input_len == 0:
            return self._reject(req, "The input is empty: a request needs at least one prompt token.", 400)
        if input_len >= self.max_req_len:
            return self._reject(
                req,
                f"Input length ({input_len} tokens) exceeds the maximum allowed length "
                f"({self.max_req_len - 1} tokens): the context length is {self.context_len} and the KV "
                f"pool holds {self.max_total_num_tokens} tokens.",
                400,
            )
        asked = req.sampling
        granted = grant_max_new_tokens(
            asked.requested_max_new_tokens,
            input_len,
            max_req_len=self.max_req_len,
            pool_size=self.max_total_num_tokens,
            page_size=self.page_size,
            limit=self.knobs.max_new_tokens_limit,
        )
        req.max_new_tokens = granted
        req.min_new_tokens = min(asked.min_new_tokens, granted)
        req.stop_token_ids = asked.stop_token_ids
        if self.eos_token_ids and not asked.ignore_eos:
            req.stop_token_ids = req.stop_token_ids | self.eos_token_ids
        if not req.stop_token_ids <= self._stop_token_union:
            self._stop_token_union = self._stop_token_union | req.stop_token_ids
        return self._enqueue(req)

    def _enqueue(self, req: Req, front: bool = False) -> bool:
        cap = self.args.max_queued_requests
        if cap is not None and len(self.waiting) >= cap:
            # Retracted and preempted requests come back through here too, and are turned away alike.
            at = self.prio.queue_full_victim(req, self.waiting)
            if at is None:
                return self._reject(req, QUEUE_FULL_MESSAGE, 503)
            victim = self.waiting.pop(at)
            self._waiting_tokens -= victim.seqlen
            self._reject(victim, ABORTED_BY_PRIORITY_MESSAGE, 503)
        self.prio.stamp(req)
        if front:
            self.waiting.insert(0, req)
        else:
            self.waiting.append(req)
        self._waiting_tokens += req.seqlen
        return True

    def _reject(self, req: Req, message: str, status: int) -> bool:
        req.finished_reason = FinishReason(FinishKind.ABORT, message, status)
        self.events.append(RequestAborted(req.rid, message, status))
        return False

    def set_waiting(self, reqs: list[Req]) -> None:
        """Replace the waiting queue (to build a scheduling moment, as `capacity --scenario` does)."""
        self.waiting = list(reqs)
        self._waiting_tokens = sum(r.seqlen for r in reqs)
        for req in self.waiting:
            self.prio.stamp(req)

    def abort_request(self, rid: str) -> bool:
        """Client abort. A waiting request ends now; a running or chunked one at its next result."""
        for i, req in enumerate(self.waiting):
            if req.rid == rid:
                del self.waiting[i]
                self._waiting_tokens -= req.seqlen
                self._reject(req, CLIENT_ABORT_MESSAGE, 499)
                return True
        in_flight = [*self.running.reqs]
        if self.chunked_req is not None:
            in_flight.append(self.chunked_req)
        if self.last_batch is not None and self.last_batch.kind == "prefill":
            in_flight.extend(self.last_batch.reqs)  # prefilled, not yet merged into the running batch
        for req in in_flight:
            if req.rid == rid and not req.finished:
                req.abort_requested = True
                self._abort_rids.add(rid)
                return True
        return False
