"""Property tests: the real scheduler, driven by a trivial executor, over random workloads and server args.

The executor is a pure function: the k-th output token of a request depends only on the request and k
(EOS at a drawn position, an ordinary token otherwise). So a run of a workload is reproducible, and the
exact output of a request that was not aborted is known in advance however often it was retracted.

After every scheduler call the driver checks docs/architecture.md's invariants (pool accounting, the request
cap,
a slot for every request of a decode step, the new-token ratio in [0, 1]); at the end it checks that every
request ended exactly once with the output its limits allow, and that a flushed cache leaves the pool
whole. Hand-picked runs then make sure retraction and the last-request abort really happen.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvadmit.config import ConfigError, SchedulerKnobs, ServerArgs
from kvadmit.request import FinishKind, FinishReason, Req, SamplingLimits
from kvadmit.scheduler.events import Event, LastRequestAborted, RequestAborted, Retraction
from kvadmit.scheduler.retraction import LAST_REQUEST_ABORT_MESSAGE
from kvadmit.scheduler.scheduler import UNSCHEDULABLE_MESSAGE, EngineCrash, ScheduledBatch, Scheduler
from kvadmit.scheduler.types import QUEUE_FULL_MESSAGE

EOS = 0
VOCAB = 50  # prompt and ordinary output tokens are 1..VOCAB−1
CLIENT_ABORT_MESSAGE = "Aborted by the client."


# ===== workloads =====================================================================================
@dataclass(frozen=True)
class Spec:
    """One request of a workload, and what the executor and the client will do with it."""

    rid: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    ignore_eos: bool = False
    min_new_tokens: int = 0
    eos_at: int | None = None  # the executor samples EOS as this (1-based) output token
    arrive_at: int = 0  # added before the driver's step with this number
    abort_at: int | None = None  # the client aborts it before this step, if it is still live


def output_token(spec: Spec, k: int) -> int:
    """The k-th (1-based) output token of a request: EOS at eos_at, else a fixed ordinary token."""
    if spec.eos_at == k:
        return EOS
    return 1 + (7 * k + 13 * len(spec.prompt) + 3 * int(spec.rid[1:])) % (VOCAB - 1)


def expected_end(spec: Spec, cap: int) -> tuple[FinishKind, int]:
    """How a request that is not aborted ends, from the rules: a prefill always yields one token (so a cap
    of 0 still gives one), stop tokens are checked before the length limit (SGLang 0.5.22's
    update_finish_state: an EOS on the last allowed token ends the request as "stop"), ignore_eos ignores
    EOS, and so does a request with fewer than min_new_tokens outputs (min_new_tokens is capped like
    max_new)."""
    limit = max(cap, 1)
    min_new = min(spec.min_new_tokens, cap)
    if not spec.ignore_eos and spec.eos_at is not None and min_new <= spec.eos_at <= limit:
        return FinishKind.STOP, spec.eos_at
    return FinishKind.LENGTH, limit


def _retraction_key(req: Req) -> tuple[int, int]:
    """Retraction keeps requests with more outputs, then shorter prompts (§3.2)."""
    return len(req.output_ids), -len(req.origin_input_ids)


def refused_on_empty_pool(sched: Scheduler, req: Req) -> bool:
    """By the admission rules, is `req` refused as the first candidate with nothing running and the whole
    pool free or evictable? (The scheduler ends such a request as unschedulable.)"""
    page = sched.page_size
    pool = sched.max_total_num_tokens
    outputs = len(req.output_ids)
    if req.sampling.ignore_eos and sched.args.disable_radix_cache:
        # §1.6: the prompt (+ outputs) in whole pages plus one page must fit, and then the request alone
        # must keep more than one free slot while it generates the rest of its max_new_tokens.
        paged_input = -(-req.seqlen // page) * page + page
        tokens_left = req.max_new_tokens - outputs
        return paged_input > pool or (tokens_left > 0 and pool - paged_input - tokens_left <= 1)
    # §1.4: extend + min(remaining max_new, clip) (+ page in 0.5.22) < available + evictable; the
    # matched prefix is locked, so it leaves both sides and the prompt counts in full.
    max_new = min(max(req.max_new_tokens - outputs, 0), sched.knobs.clip_max_new_tokens_estimation)
    page_term = page if sched.profile.page_size_in_fit_check else 0
    return req.seqlen + max_new + page_term >= pool


# ===== the driver ====================================================================================
class DriverFailure(AssertionError):
    pass


@dataclass
class Transcript:
    """What a run produced, in order; two runs of one workload must give equal transcripts."""

    batches: list[tuple[int, str, tuple[str, ...]]] = field(default_factory=list)  # (call, kind, rids)
    events: list[tuple[int, Event]] = field(default_factory=list)  # (call, event)
    outputs: dict[str, tuple[tuple[int, ...], FinishReason | None]] = field(default_factory=dict)


@dataclass
class Run:
    """One scheduler, the requests given to it, and every way each of them was reported ended."""

    sched: Scheduler
    specs: dict[str, Spec]
    reqs: dict[str, Req] = field(default_factory=dict)
    ended_at: dict[str, int] = field(default_factory=dict)  # rid → the scheduler call that ended it
    end_reason: dict[str, FinishReason] = field(default_factory=dict)
    rejected_at_arrival: set[str] = field(default_factory=set)  # add_request returned False
    in_finished_list: dict[str, int] = field(default_factory=dict)  # rid → times in StepOutcome.finished
    abort_events: dict[str, int] = field(default_factory=dict)  # rid → RequestAborted events
    last_request_aborts: list[str] = field(default_factory=list)
    retractions: list[Retraction] = field(default_factory=list)
    client_aborted: set[str] = field(default_factory=set)  # abort_request returned True
    aborted_in_queue: set[str] = field(default_factory=set)  # ... while it was waiting
    aborted_while_chunked: set[str] = field(default_factory=set)  # ... while its prompt was in chunks
    transcript: Transcript = field(default_factory=Transcript)
    call: int = 0
    steps: int = 0
    lagging: ScheduledBatch | None = None  # overlap loop: the batch whose result was still to come
    # id → tokens of its prompt a prefill never computed (SGLang's corner below): its KV stays that short
    cut_short: dict[int, int] = field(default_factory=dict)

    def live(self) -> list[Req]:
        return [r for rid, r in self.reqs.items() if rid not in self.ended_at]

    # ----- end notifications --------------------------------------------------------------------
    def _ended(self, rid: str, how: str) -> None:
        """Record an end notification. A request may be reported through two channels (a client abort of
        a running request is in the finished list and a RequestAborted event), but only by one call."""
        req = self.reqs[rid]
        if req.finished_reason is None:
            raise DriverFailure(f"{rid} reported ended ({how}) without a finish reason")
        if rid not in self.ended_at:
            self.ended_at[rid] = self.call
            self.end_reason[rid] = req.finished_reason
        elif self.ended_at[rid] != self.call:
            raise DriverFailure(f"{rid} ended at call {self.ended_at[rid]} and again ({how}) at {self.call}")
        elif req.finished_reason is not self.end_reason[rid]:
            raise DriverFailure(f"{rid} got two finish reasons in one call")

    def _take_events(self) -> None:
        for ev in self.sched.drain_events():
            self.transcript.events.append((self.call, ev))
            if isinstance(ev, RequestAborted):
                self.abort_events[ev.rid] = self.abort_events.get(ev.rid, 0) + 1
                self._ended(ev.rid, "RequestAborted")
                reason = self.reqs[ev.rid].finished_reason
                assert reason is not None and reason.kind is FinishKind.ABORT, (ev, reason)
                assert (reason.message, reason.status_code) == (ev.message, ev.status_code)
            elif isinstance(ev, LastRequestAborted):
                self.last_request_aborts.append(ev.rid)
            elif isinstance(ev, Retraction):
                self.retractions.append(ev)
                self._check_retraction(ev)

    def _check_retraction(self, ev: Retraction) -> None:
        assert 0.0 <= ev.new_ratio <= 1.0, ev
        running = {id(r) for r in self.sched.running.reqs}
        waiting = {id(r) for r in self.sched.waiting}
        for rid in ev.rids:
            req = self.reqs[rid]
            assert id(req) not in running, f"retracted {rid} is still running"
            assert len(req.kv) == 0 and req.last_node is None, f"retracted {rid} still holds KV"
            # Re-queued (at the end of the queue), or refused by a full queue and so ended.
            assert id(req) in waiting or req.finished_reason is not None, f"retracted {rid} was lost"
        # §3.2: victims go fewest outputs first, ties longest prompt first; every kept request ranks above.
        keys = [_retraction_key(self.reqs[rid]) for rid in ev.rids]
        assert keys == sorted(keys), (ev.rids, keys)
        if keys:
            assert all(max(keys) <= _retraction_key(r) for r in self.sched.running.reqs), ev

    # ----- the client side ----------------------------------------------------------------------
    def arrive(self, spec: Spec) -> None:
        self.call += 1
        req = Req(
            rid=spec.rid,
            origin_input_ids=list(spec.prompt),
            sampling=SamplingLimits(
                requested_max_new_tokens=spec.max_new_tokens,
                ignore_eos=spec.ignore_eos,
                min_new_tokens=spec.min_new_tokens,
            ),
        )
        self.reqs[spec.rid] = req
        if not self.sched.add_request(req):
            self.rejected_at_arrival.add(spec.rid)
        self._take_events()
        if spec.rid in self.rejected_at_arrival:
            assert spec.rid in self.ended_at, f"{spec.rid} was refused without a RequestAborted event"
        self.check_invariants_after_call(None)

    def client_abort(self, rid: str) -> None:
        if rid not in self.reqs or rid in self.ended_at:
            return
        req = self.reqs[rid]
        was_waiting = req in self.sched.waiting
        self.call += 1
        if self.sched.abort_request(rid):
            self.client_aborted.add(rid)
            if was_waiting:
                self.aborted_in_queue.add(rid)
        else:
            raise DriverFailure(f"abort_request({rid}) returned False for a live request")
        self._take_events()
        if rid in self.aborted_in_queue:
            assert rid in self.ended_at, f"{rid} was aborted in the queue but not reported ended"
        self.check_invariants_after_call(None)

    # ----- the executor side --------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch | None:
        self.call += 1
        queue = list(self.sched.waiting)
        continuing = self.sched.chunked_req
        retracted_before = len(self.retractions)
        batch = self.sched.next_batch()
        if continuing is not None and continuing.abort_requested and continuing.finished_reason is not None:
            self.aborted_while_chunked.add(continuing.rid)  # this pass ended it, before another chunk
        if batch is not None:
            self.transcript.batches.append((self.call, batch.kind, tuple(r.rid for r in batch.reqs)))
        self._take_events()
        self.check_invariants_after_call(batch)
        if batch is not None and batch.kind == "prefill":
            # Requests retracted in this call joined the end of the queue before a later pass admitted.
            queue += [self.reqs[rid] for ev in self.retractions[retracted_before:] for rid in ev.rids]
            self._check_admission_order(batch, queue, continuing)
        return batch

    def _check_admission_order(self, batch: ScheduledBatch, queue: list[Req], continuing: Req | None) -> None:
        """fcfs and lof (§1.2): the queue is walked in policy order and admission stops at the first
        request that is not admitted, so the new requests of a prefill batch are the head of the queue."""
        policy = self.sched.args.schedule_policy
        if policy not in ("fcfs", "lof"):
            return
        queue = [r for r in queue if r.rid not in self.ended_at]  # refused in this call as unschedulable
        if policy == "lof":
            queue.sort(key=lambda r: -r.max_new_tokens)  # stable, as the scheduler's sort
        riding = set(map(id, batch.decoding or ()))  # a mixed chunk's decode rows were not queued
        new = [r.rid for r in batch.reqs if r is not continuing and id(r) not in riding]
        assert new == [r.rid for r in queue[: len(new)]], (new, [r.rid for r in queue])

    def execute(self, batch: ScheduledBatch) -> None:
        self.call += 1
        tokens = [output_token(self.specs[r.rid], len(r.output_ids) + 1) for r in batch.reqs]
        outcome = self.sched.on_batch_done(batch, tokens)
        for req in outcome.finished:
            self.in_finished_list[req.rid] = self.in_finished_list.get(req.rid, 0) + 1
            self._ended(req.rid, "StepOutcome.finished")
        self._take_events()
        self.check_invariants_after_call(None)
        self.steps += 1

    # ----- invariants after every call -----------------------------------------------------------
    def check_invariants_after_call(self, batch: ScheduledBatch | None) -> None:
        sched = self.sched
        sched.check_invariants()  # free + evictable + locked + held by live requests == pool size
        assert 0.0 <= sched.ratio.current <= 1.0, sched.ratio.current

        # Requests holding a request slot: running, just prefilled (merged at the next pass), chunked.
        holders = {id(r) for r in sched.running.reqs if not r.finished}
        last = sched.last_batch
        if last is not None and last.kind == "prefill":
            holders |= {id(r) for r in last.reqs if not r.finished}
        if sched.chunked_req is not None:
            holders.add(id(sched.chunked_req))
        assert len(holders) <= sched.max_running_requests, (len(holders), sched.max_running_requests)
        if sched.args.max_running_requests is not None:
            assert len(holders) <= sched.args.max_running_requests

        if batch is None:
            return
        assert batch.reqs, "an empty batch"
        assert len({id(r) for r in batch.reqs}) == len(batch.reqs), "a request twice in one batch"
        for req in batch.reqs:
            assert not req.finished and req.rid not in self.ended_at, f"{req.rid} scheduled after its end"
        if batch.kind == "decode":
            # A decode step never runs without a slot for every request: its KV covers the prompt and all
            # outputs so far (this step computes the last output into kv[-1] and samples the next). Under
            # the overlap loop the requests of the batch in flight have one output still to come.
            lag = set() if self.lagging is None else {id(r) for r in self.lagging.reqs}
            for req in batch.reqs:
                expected = req.seqlen + (id(req) in lag and req is not self.lagging.chunked)  # type: ignore[union-attr]
                expected -= self.cut_short.get(id(req), 0)
                assert len(req.kv) == expected, (req.rid, len(req.kv), req.seqlen)
        else:
            # --enable-mixed-chunk: the running requests' decode rows follow the prefill rows
            decoding = batch.decoding or []
            rows = batch.reqs[: len(batch.reqs) - len(decoding)]
            lag = set() if self.lagging is None else {id(r) for r in self.lagging.reqs}
            for req in decoding:
                expected = req.seqlen + (id(req) in lag) - self.cut_short.get(id(req), 0)
                assert len(req.kv) == expected, (req.rid, len(req.kv), req.seqlen)
            if sched.args.prefill_max_requests is not None:
                assert len(rows) <= max(sched.args.prefill_max_requests, 1)
            if sched.chunked_prefill_size is not None:
                # §1.4–1.5: the batch's prefill, in whole pages, stays within one chunk.
                page = sched.page_size
                pages = sum(-(-(r.fill_len - r.prefix_len) // page) for r in rows)
                assert pages * page <= sched.chunked_prefill_size, (pages * page, sched.chunked_prefill_size)
            for req in rows:
                assert req.prefix_len <= req.fill_len <= req.seqlen, (req.rid, req.prefix_len, req.fill_len)
                assert len(req.kv) == req.fill_len, (req.rid, len(req.kv), req.fill_len)
                if req is batch.chunked or req.fill_len == req.seqlen:
                    assert (req is batch.chunked) == (req.fill_len < req.seqlen), req.rid
                    self.cut_short.pop(id(req), None)  # (prefilled again whole after a retraction)
                else:
                    # SGLang's corner (docs/sglang-rules.md §1.6): with mixed rows the chunk budget can end
                    # off a page multiple, a normal request is cut to whole pages, and an ignore_eos request
                    # without a cache after it takes the rest as a second first chunk; SGLang keeps only
                    # that one as the chunked request and runs the first as if its prefill were done.
                    chunked = batch.chunked
                    assert chunked is not None and sched.mixed_chunk and not sched.cache.enabled, req.rid
                    assert chunked.sampling.ignore_eos and rows.index(req) < rows.index(chunked), req.rid
                    self.cut_short[id(req)] = req.seqlen - req.fill_len
        self._check_owned_pages_disjoint()

    def _check_owned_pages_disjoint(self) -> None:
        """No page is owned by two live requests (cached prefixes are shared; owned tails are not)."""
        owner: dict[int, str] = {}
        page = self.sched.page_size
        for req in self.live():
            for slot in req.kv[req.cached_len :]:
                assert 0 <= slot < self.sched.max_total_num_tokens, (req.rid, slot)
                if owner.setdefault(slot // page, req.rid) != req.rid:
                    raise DriverFailure(
                        f"page {slot // page} is owned by {owner[slot // page]} and {req.rid}"
                    )


def drive(args: ServerArgs, specs: list[Spec], max_steps: int = 20_000, overlap: bool = False) -> Run:
    """Run a workload to its end: before each step the arrivals and client aborts due, then one batch.
    next_batch() returning None while requests are live and none is still to arrive is a stall.
    `overlap`: SGLang's overlap loop: each pass runs while the last batch's result is still to come,
    and that result is processed right after it."""
    run = Run(Scheduler(args, eos_token_ids=frozenset({EOS})), {s.rid: s for s in specs})
    pending = sorted(specs, key=lambda s: s.arrive_at)  # stable: equal times keep workload order
    step = 0
    in_flight: ScheduledBatch | None = None
    while True:
        while pending and pending[0].arrive_at <= step:
            run.arrive(pending.pop(0))
        for spec in specs:
            if spec.abort_at == step:
                run.client_abort(spec.rid)
        run.lagging = in_flight
        batch = run.schedule()
        if overlap:
            if in_flight is not None:
                run.execute(in_flight)
            in_flight = batch
            if batch is None:
                if run.lagging is not None:
                    continue  # the pass after a result: nothing new was in flight
                if not pending:
                    if run.live():
                        raise DriverFailure(f"stall at step {step} under the overlap loop")
                    break
                step = max(step + 1, pending[0].arrive_at)
                continue
            step += 1
            if run.steps > max_steps:
                raise DriverFailure(f"{len(run.live())} requests still live after {max_steps} steps")
            continue
        if batch is None:
            if not pending:
                if run.live():
                    s = run.sched
                    raise DriverFailure(
                        f"stall at step {step}: {len(s.waiting)} waiting, {len(s.running.reqs)} running, "
                        f"chunked={s.chunked_req is not None}, and next_batch() returned None"
                    )
                break
            step = max(step + 1, pending[0].arrive_at)
            continue
        run.execute(batch)
        step += 1
        if run.steps > max_steps:
            raise DriverFailure(f"{len(run.live())} requests still live after {max_steps} steps")
    for rid, req in run.reqs.items():
        run.transcript.outputs[rid] = (tuple(req.output_ids), req.finished_reason)
    return run


# ===== end-of-run checks =============================================================================
def check_every_request_ended_once(run: Run) -> None:
    """Each request ended exactly once, through the channel that matches how it ended, with the output
    its (capped) max_new_tokens, EOS position and aborts allow."""
    assert set(run.reqs) == set(run.specs)
    for rid, req in run.reqs.items():
        spec = run.specs[rid]
        reason = req.finished_reason
        assert rid in run.ended_at and reason is not None, f"{rid} was lost: never reported ended"
        assert reason is run.end_reason[rid], f"{rid}'s finish reason changed after it was reported"
        channels = (run.in_finished_list.get(rid, 0), run.abort_events.get(rid, 0))

        if rid in run.rejected_at_arrival:
            assert channels == (0, 1) and req.output_ids == [], (rid, channels)
            assert reason.message == QUEUE_FULL_MESSAGE or reason.status_code == 400, reason
            continue
        cap = req.max_new_tokens
        assert 0 <= cap <= spec.max_new_tokens, (rid, cap)
        assert len(req.output_ids) <= max(cap, 1), (rid, len(req.output_ids), cap)
        # The outputs are the executor's tokens in order: retraction lost or repeated none.
        assert req.output_ids == [output_token(spec, k) for k in range(1, len(req.output_ids) + 1)], rid

        if reason.kind is not FinishKind.ABORT:
            assert channels == (1, 0), (rid, reason, channels)
            assert rid not in run.client_aborted, f"{rid} was aborted by the client but ended {reason}"
            assert (reason.kind, len(req.output_ids)) == expected_end(spec, cap), (rid, reason)
        elif reason.message == CLIENT_ABORT_MESSAGE:
            assert rid in run.client_aborted, rid
            # Aborted in the queue: an event only. Aborted while its prompt was still being chunked: it
            # ends at the start of the next pass, which runs no further chunk of it, as an event only.
            # Aborted while live: it ends at its next result, in that step's finished list and as an event.
            event_only = rid in run.aborted_in_queue or rid in run.aborted_while_chunked
            assert channels == ((0, 1) if event_only else (1, 1)), (rid, channels)
        elif reason.message == LAST_REQUEST_ABORT_MESSAGE:
            assert channels == (0, 1) and reason.status_code == 500, (rid, channels, reason)
            assert run.last_request_aborts.count(rid) == 1, rid
        elif reason.message == QUEUE_FULL_MESSAGE:
            # Retracted into a full queue.
            assert channels == (0, 1) and req.retraction_count > 0, (rid, channels)
            assert run.sched.args.max_queued_requests is not None
        elif reason.message == UNSCHEDULABLE_MESSAGE:
            assert channels == (0, 1), (rid, channels)
            assert refused_on_empty_pool(run.sched, req), f"{rid} was refused but fits an empty pool"
        else:
            raise AssertionError(f"{rid} aborted for an unexpected reason: {reason}")
    for rid in run.last_request_aborts:
        assert run.end_reason[rid].message == LAST_REQUEST_ABORT_MESSAGE


def check_idle_and_no_leak(run: Run) -> None:
    """Idle: nothing to run, the ratio back at its start; a flushed cache leaves the whole pool free."""
    sched = run.sched
    assert sched.next_batch() is None
    assert not sched.waiting and not sched.running.reqs and sched.chunked_req is None
    sched.check_invariants()
    assert sched.cache.protected_size() == 0, "a finished request still locks cached tokens"
    assert sched.ratio.current == sched.ratio.init
    sched.cache.reset()
    assert sched.pool.available_size() == sched.max_total_num_tokens, "KV slots leaked"
    assert sched.req_slots.available_size() == sched.req_slots.size, "request slots leaked"


# ===== strategies ====================================================================================
def _tokens(seed: int, n: int) -> tuple[int, ...]:
    """n ordinary tokens from a seed (a tiny LCG: much cheaper for hypothesis than drawing each one)."""
    out = []
    x = seed * 2654435761 + 1
    for _ in range(n):
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(1 + (x >> 16) % (VOCAB - 1))
    return tuple(out)


@st.composite
def server_args(draw: st.DrawFn, pressure: bool = False) -> ServerArgs:
    """Any server args; under `pressure`, small pools that retraction has to rescue."""
    page = draw(st.sampled_from([1, 1, 2, 4, 16]))
    unit = max(8, page)  # chunk sizes are multiples of the page size, as SGLang requires
    test_retract = draw(st.booleans())
    no_prefill_bs = [2**31, 0, 1] if pressure else [2**31, 2**31, 0, 1]
    knobs = SchedulerKnobs(
        test_retract=test_retract,
        test_retract_interval=draw(st.integers(1, 5)) if test_retract else 3,
        # Blocking prefill while requests run lets a chunked prefill hold memory during decode steps:
        # the only way (short of a leak) for the last request of a batch to run out of memory.
        test_retract_no_prefill_bs=draw(st.sampled_from(no_prefill_bs)) if test_retract else 2**31,
        # A small clip under-reserves long outputs, so more admissions end in retraction.
        clip_max_new_tokens_estimation=draw(st.sampled_from([4096, 4096, 4096, 32, 0])),
        max_new_tokens_limit=draw(st.sampled_from([None, None, None, 50])),  # SGLANG_MAX_NEW_TOKENS_LIMIT
    )
    return ServerArgs(
        max_total_tokens=draw(st.integers(64, 256) if pressure else st.integers(64, 2048)),
        page_size=page,
        # A low conservativeness reserves little for running requests' outputs: more retraction.
        schedule_conservativeness=draw(st.floats(0.1, 0.6) if pressure else st.floats(0.1, 2.0)),
        max_running_requests=draw(st.one_of(st.none(), st.integers(1, 6))),
        max_queued_requests=draw(st.one_of(st.none(), st.none(), st.integers(1, 6))),
        max_prefill_tokens=draw(st.sampled_from([16384, 16384, 128])),
        chunked_prefill_size=draw(
            st.one_of(st.none(), st.just(-1), st.integers(1, 16).map(lambda k: unit * k))
        ),
        prefill_max_requests=draw(st.one_of(st.none(), st.none(), st.integers(1, 3))),
        schedule_policy=draw(st.sampled_from(["fcfs", "lpm", "lof", "random"])),
        disable_radix_cache=draw(st.booleans()),
        sglang_version=draw(st.sampled_from(["0.5.22", "0.5.22", "0.5.23", "0.5.10"])),
        enable_mixed_chunk=draw(st.booleans()),
        random_seed=draw(st.integers(0, 3)),
        context_length=draw(st.one_of(st.none(), st.none(), st.integers(32, 4096))),
        knobs=knobs,
    )


@st.composite
def workloads(draw: st.DrawFn, pool: int, pressure: bool = False) -> list[Spec]:
    """Requests sharing prefixes or not, arriving over time, some stopping on EOS, some aborted. Under
    `pressure`: more requests with short prompts and long outputs, so the outputs outgrow the pool."""
    longest = max(8, pool * 3 // 4)  # mostly admissible prompts, and now and then one the server refuses
    suffix_len = st.integers(1, max(1, pool // 8 if pressure else longest // 4))
    bases = [_tokens(draw(st.integers(0, 999)), longest) for _ in range(draw(st.integers(0, 2)))]
    specs = []
    for i in range(draw(st.integers(3, 10) if pressure else st.integers(1, 8))):
        suffix = _tokens(draw(st.integers(0, 999)), draw(suffix_len))
        if bases and draw(st.booleans()):
            share = draw(st.integers(0, pool // 4 if pressure else longest))
            prompt = bases[draw(st.integers(0, len(bases) - 1))][:share] + suffix
        else:
            prompt = suffix
        max_new = draw(st.integers(pool // 4, pool) if pressure else st.integers(0, 300))
        eos_at = st.integers(1, max(1, max_new))
        specs.append(
            Spec(
                rid=f"r{i}",
                prompt=prompt,
                max_new_tokens=max_new,
                ignore_eos=draw(st.booleans()),
                min_new_tokens=draw(st.sampled_from([0, 0, 0, 5])),
                eos_at=draw(
                    st.one_of(st.none(), st.none(), eos_at) if pressure else st.one_of(st.none(), eos_at)
                ),
                arrive_at=draw(st.one_of(st.just(0), st.integers(0, 40))),
                abort_at=draw(st.one_of(st.none(), st.none(), st.none(), st.integers(0, 60))),
            )
        )
    return specs


@st.composite
def scenarios(draw: st.DrawFn, pressure: bool = False) -> tuple[ServerArgs, list[Spec]]:
    args = draw(server_args(pressure))
    assert args.max_total_tokens is not None
    return args, draw(workloads(args.max_total_tokens, pressure))


def _label(run: Run) -> None:
    """hypothesis statistics (pytest --hypothesis-show-statistics): what the examples exercised."""
    event("retraction" if any(r.rids for r in run.retractions) else "no retraction")
    event("last-request abort" if run.last_request_aborts else "no last-request abort")
    event("client abort" if run.client_aborted else "no client abort")
    if any(
        r.finished_reason and r.finished_reason.message == UNSCHEDULABLE_MESSAGE for r in run.reqs.values()
    ):
        event("unschedulable")


def drive_unless_sglang_crashes(args: ServerArgs, specs: list[Spec], overlap: bool = False) -> Run | None:
    """`drive`, or None where SGLang itself dies: with mixed chunks the running requests' decode rows can
    fill the pool while a prompt is still in chunks, and SGLang then allocates the next chunk anyway and
    raises "Out of memory" (scheduler.py, _check_prefill_fits; found here, reproduced with SGLang 0.5.22's
    own scheduler). Without mixed chunks nothing grows between chunks, so there it must never happen."""
    try:
        return drive(args, specs, overlap=overlap)
    except EngineCrash as crash:
        assert args.enable_mixed_chunk, crash
        assert str(crash).startswith(
            ("RuntimeError: Out of memory.", "RuntimeError: Prefill out of memory.")
        ), crash
        event("SGLang's out-of-memory crash")
        return None


# ===== property tests ================================================================================
@settings(deadline=None, max_examples=120, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_workloads_keep_the_invariants_and_end_every_request_exactly_once(
    scenario: tuple[ServerArgs, list[Spec]],
) -> None:
    args, specs = scenario
    run = drive_unless_sglang_crashes(args, specs)
    if run is None:
        return
    _label(run)
    check_every_request_ended_once(run)
    check_idle_and_no_leak(run)


@settings(deadline=None, max_examples=80, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(pressure=True))
def test_small_pools_under_pressure_retract_and_abort_without_breaking_the_invariants(
    scenario: tuple[ServerArgs, list[Spec]],
) -> None:
    args, specs = scenario
    run = drive_unless_sglang_crashes(args, specs)
    if run is None:
        return
    _label(run)
    check_every_request_ended_once(run)
    check_idle_and_no_leak(run)


@settings(deadline=None, max_examples=120, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(pressure=True))
def test_the_overlap_loop_keeps_the_invariants_and_ends_every_request_exactly_once(
    scenario: tuple[ServerArgs, list[Spec]],
) -> None:
    args, specs = scenario
    run = drive_unless_sglang_crashes(args, specs, overlap=True)
    if run is None:
        return
    _label(run)
    check_every_request_ended_once(run)
    check_idle_and_no_leak(run)


@settings(deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_the_same_workload_twice_gives_the_same_batches_events_and_outputs(
    scenario: tuple[ServerArgs, list[Spec]],
) -> None:
    args, specs = scenario
    first = drive_unless_sglang_crashes(args, specs)
    if first is None:
        return
    second = drive(args, specs)
    assert first.transcript == second.transcript


# ===== hand-picked runs: retraction and the last-request abort really happen ===========================
def _prompt(start: int, n: int) -> tuple[int, ...]:
    return tuple(1 + (start + i) % (VOCAB - 1) for i in range(n))


def test_a_chunk_after_mixed_decode_rows_filled_the_pool_crashes_as_sglang_does() -> None:
    # Found by the property tests above and run through SGLang 0.5.22's own scheduler (crosscheck's
    # sglang_side.py, SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION=0), which raised exactly this. Pool 64, chunks
    # of 8, mixed chunks, no cache, clip 0 (running requests reserve nothing). r6's 24 tokens run in
    # chunks of 3 + 7 + 7 + 7 beside r2's decode row; r1 (27 tokens) arrives and is admitted on its prompt
    # alone (36 free, outputs reserving nothing), then runs in chunks of 8 - 2 = 6 while r6 and r2 decode
    # beside it: 6, 6, 6, 6, then 2 (the pool's last 2 slots), and at 64 = 26 + 29 + 9 in use its last
    # token finds none. SGLang still takes the chunk (a chunk must make progress), evicts nothing and raises.
    args = ServerArgs(
        max_total_tokens=64,
        chunked_prefill_size=8,
        enable_mixed_chunk=True,
        disable_radix_cache=True,
        disable_overlap_schedule=True,
        knobs=SchedulerKnobs(clip_max_new_tokens_estimation=0),
    )
    long = _prompt(1, 27)
    specs = [Spec("r0", (32,), 0), Spec("r1", long, 0, arrive_at=1), Spec("r2", (32,), 10)]
    specs += [Spec(f"r{i}", (32,), 0) for i in (3, 4, 5)] + [Spec("r6", (*long[:23], 32), 7)]
    with pytest.raises(EngineCrash) as crash:
        drive(args, specs)
    assert str(crash.value) == (
        "RuntimeError: Out of memory. Try to lower your batch size.\nTry to allocate 1 tokens.\n"
        "Available full tokens: 0 (full_available_size=0 + full_evictable_size_=0)"
    )
    # Without mixed chunks nothing decodes between r1's chunks, and every request ends.
    plain = drive(dataclasses.replace(args, enable_mixed_chunk=False), specs)
    check_every_request_ended_once(plain)


def test_two_requests_outgrowing_a_100_token_pool_retract_the_later_one_once() -> None:
    """Pool 100, page 1, no prefix cache, ratio 0.7. A (10 + 45) prefills alone; B (10 + 45) arrives
    next and is admitted because A's remaining 44 tokens are reserved at the ratio: 10 + 45 + 1 = 56 <
    90 − 0.7 × 44 = 59.2. Both prefilled, 80 slots are free: 40 decode steps fit, and before the 41st
    neither has a slot. Both have 41 outputs and 10-token prompts, a full tie, so the later one in the
    batch (B) is retracted, giving back its 10 + 40 slots; the ratio becomes min(1, (41 + 20) / (45 + 1))
    = 1. B cannot come back while A runs (51 + 4 + 1 = 56 > 49 − 3), so there is no second retraction;
    both end with their 45 tokens."""
    args = ServerArgs(max_total_tokens=100, disable_radix_cache=True)
    specs = [
        Spec("r0", _prompt(0, 10), max_new_tokens=45),
        Spec("r1", _prompt(20, 10), max_new_tokens=45, arrive_at=1),
    ]
    run = drive(args, specs)
    check_every_request_ended_once(run)
    check_idle_and_no_leak(run)

    assert len(run.retractions) == 1
    ev = run.retractions[0]
    assert ev.rids == ("r1",) and not ev.forced
    assert (ev.input_tokens, ev.output_tokens, ev.new_tokens_gained) == (10, 41, 50)
    assert ev.old_ratio == pytest.approx(0.7 - 40 * (0.7 - 0.098) / 600)
    assert ev.new_ratio == 1.0
    assert run.last_request_aborts == []
    for rid in ("r0", "r1"):
        assert run.reqs[rid].finished_reason.kind is FinishKind.LENGTH
        assert len(run.reqs[rid].output_ids) == 45
    assert (run.reqs["r0"].retraction_count, run.reqs["r1"].retraction_count) == (0, 1)


def test_last_request_is_aborted_when_a_stalled_chunk_holds_the_rest_of_the_pool() -> None:
    """Pool 100, chunk 16, no prefix cache, clip 0 (no output is reserved), and SGLANG_TEST_RETRACT with
    NO_PREFILL_BS 0 (no prefill while anything runs). One pass prefills A (10 tokens) and the first 6
    tokens of C (40), the rest of the 16-token chunk. Then C's chunk is stuck while A decodes: 84 slots
    are free, so 84 decode steps run (A has 85 outputs) and before the 85th A has no slot and nothing
    else to retract: A is aborted with the OOM message, giving back its 10 + 84 slots, and the ratio
    over the empty batch is 0. C then finishes its prompt (16 + 16 + 2) and its 10 tokens."""
    knobs = SchedulerKnobs(
        test_retract=True,
        test_retract_interval=10_000,  # no forced retraction in this run
        test_retract_no_prefill_bs=0,
        clip_max_new_tokens_estimation=0,
    )
    args = ServerArgs(max_total_tokens=100, chunked_prefill_size=16, disable_radix_cache=True, knobs=knobs)
    specs = [Spec("r0", _prompt(0, 10), max_new_tokens=88), Spec("r1", _prompt(20, 40), max_new_tokens=10)]
    run = drive(args, specs)
    check_every_request_ended_once(run)
    check_idle_and_no_leak(run)

    assert run.transcript.batches[0][1:] == ("prefill", ("r0", "r1"))
    a, c = run.reqs["r0"], run.reqs["r1"]
    assert run.last_request_aborts == ["r0"]
    assert a.finished_reason == FinishReason(FinishKind.ABORT, LAST_REQUEST_ABORT_MESSAGE, 500)
    assert len(a.output_ids) == 85
    assert len(run.retractions) == 1
    ev = run.retractions[0]
    assert (ev.rids, ev.new_tokens_gained, ev.new_ratio, ev.forced) == ((), 94, 0.0, False)
    assert ev.old_ratio == pytest.approx(0.7 - 84 * (0.7 - 0.098) / 600)
    assert c.finished_reason.kind is FinishKind.LENGTH and len(c.output_ids) == 10
    prefills_of_c = [rids for _, kind, rids in run.transcript.batches if kind == "prefill" and "r1" in rids]
    assert len(prefills_of_c) == 4  # chunks of 6, 16, 16 and 2 tokens


# ===== fixed bugs: their minimal reproductions =====================================================
def test_a_request_growing_inside_its_last_page_takes_no_new_page() -> None:
    """Page 2: A and B prefill one token each (a page each); B ends at once and frees its page. A's first
    decode token goes into the free slot of A's own page, so no page is taken: 31 of 32 pages free."""
    sched = Scheduler(ServerArgs(max_total_tokens=64, page_size=2))
    sched.add_request(Req("a", [5], SamplingLimits(requested_max_new_tokens=2)))
    sched.add_request(Req("b", [6], SamplingLimits(requested_max_new_tokens=1)))
    batch = sched.next_batch()
    assert batch is not None and len(batch.reqs) == 2
    sched.on_batch_done(batch, [7, 7])
    decode = sched.next_batch()
    assert decode is not None and decode.kind == "decode"
    assert sched.pool.available_size() == 62  # only A's page is in use
    sched.check_invariants()


def test_client_abort_right_after_a_prefill_is_not_lost() -> None:
    sched = Scheduler(ServerArgs(max_total_tokens=256))
    req = Req("a", [1, 2, 3, 4], SamplingLimits(requested_max_new_tokens=10))
    sched.add_request(req)
    batch = sched.next_batch()
    assert batch is not None
    sched.on_batch_done(batch, [5])
    assert sched.abort_request("a")
    decode = sched.next_batch()  # merged into the running batch; it ends at its next result
    assert decode is not None and decode.kind == "decode"
    sched.on_batch_done(decode, [6])
    assert req.finished_reason == FinishReason(FinishKind.ABORT, "Aborted by the client.", 499)
    assert req.output_ids == [5, 6]
    sched.cache.reset()
    assert sched.pool.available_size() == 256


def test_next_batch_continues_a_chunked_prefill_once_the_running_batch_empties() -> None:
    """Chunk 8 and SGLANG_TEST_RETRACT_NO_PREFILL_BS 0 (no prefill while anything runs). A (1 token) and
    the first 7 tokens of C (8) prefill together; C's chunk then waits while A decodes its second and
    last token. The next pass drops the finished A; nothing runs, so C's chunk can continue now."""
    knobs = SchedulerKnobs(test_retract=True, test_retract_interval=1000, test_retract_no_prefill_bs=0)
    sched = Scheduler(ServerArgs(max_total_tokens=64, chunked_prefill_size=8, knobs=knobs))
    sched.add_request(Req("a", [1], SamplingLimits(requested_max_new_tokens=2)))
    sched.add_request(Req("c", list(range(2, 10)), SamplingLimits(requested_max_new_tokens=1)))
    for kind in ("prefill", "decode"):
        batch = sched.next_batch()
        assert batch is not None and batch.kind == kind
        sched.on_batch_done(batch, [7] * len(batch.reqs))
    assert sched.chunked_req is not None and sched.running.reqs[0].finished  # A ended; C waits
    assert sched.next_batch() is not None


def test_server_args_refuse_a_chunked_prefill_size_that_is_not_a_multiple_of_the_page_size() -> None:
    """SGLang asserts chunked_prefill_size % page_size == 0 at startup. Accepted here, a chunk smaller than
    a page cannot hold one whole page, so every request (even a 1-token prompt) is refused as
    unschedulable."""
    with pytest.raises(ConfigError, match="must be a multiple of --page-size 16"):
        ServerArgs(page_size=16, chunked_prefill_size=8).check_startup()
