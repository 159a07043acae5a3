"""Random workloads under priority scheduling (docs/sglang-rules.md §13): with preemption, a full queue that
aborts its least urgent request and retraction by priority in play, the pool accounting holds after every
step, every request ends exactly once, and nothing leaks."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvadmit.config import ServerArgs
from kvadmit.request import FinishKind, Req, SamplingLimits
from kvadmit.scheduler.events import Preemption, RequestAborted, Retraction
from kvadmit.scheduler.priority import ABORTED_BY_PRIORITY_MESSAGE
from kvadmit.scheduler.retraction import LAST_REQUEST_ABORT_MESSAGE
from kvadmit.scheduler.scheduler import UNSCHEDULABLE_MESSAGE, Scheduler
from kvadmit.scheduler.types import QUEUE_FULL_MESSAGE, ScheduledBatch

EOS = 0
ABORTS = {QUEUE_FULL_MESSAGE, ABORTED_BY_PRIORITY_MESSAGE, LAST_REQUEST_ABORT_MESSAGE, UNSCHEDULABLE_MESSAGE}


@dataclass(frozen=True)
class Spec:
    rid: str
    prompt_len: int
    max_new: int
    priority: int | None
    eos_at: int | None
    arrive_at: int


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[ServerArgs, list[Spec]]:
    args = ServerArgs(
        max_total_tokens=draw(st.integers(96, 600)),
        page_size=draw(st.sampled_from([1, 1, 4])),
        schedule_conservativeness=draw(st.floats(0.1, 1.0)),
        max_running_requests=draw(st.integers(1, 4)),
        max_queued_requests=draw(st.one_of(st.none(), st.integers(1, 4))),
        schedule_policy=draw(st.sampled_from(["fcfs", "lof"])),
        disable_radix_cache=draw(st.booleans()),
        enable_priority_scheduling=True,
        schedule_low_priority_values_first=draw(st.booleans()),
        default_priority_value=draw(st.sampled_from([None, 0, 10])),
        disable_priority_preemption=draw(st.sampled_from([False, False, True])),
        priority_scheduling_preemption_threshold=draw(st.sampled_from([0, 5, 10])),
        retraction_policy=draw(st.sampled_from(["length", "priority"])),
        context_length=4096,
    )
    specs = []
    for i in range(draw(st.integers(2, 10))):
        max_new = draw(st.integers(1, 120))
        specs.append(
            Spec(
                rid=f"r{i}",
                prompt_len=draw(st.integers(1, 60)),
                max_new=max_new,
                priority=draw(st.sampled_from([None, 0, 3, 11, 25])),
                eos_at=draw(st.one_of(st.none(), st.integers(1, max_new))),
                arrive_at=draw(st.integers(0, 30)),
            )
        )
    return args, specs


def run(
    args: ServerArgs, specs: list[Spec], overlap: bool = False
) -> tuple[Scheduler, dict[str, Req], dict[str, int]]:
    """`overlap`: each pass runs before the last batch's result is processed (SGLang's overlap loop)."""
    sched = Scheduler(args, eos_token_ids=frozenset({EOS}))
    reqs: dict[str, Req] = {}
    ended: dict[str, int] = {}
    pending = sorted(specs, key=lambda s: s.arrive_at)
    by_rid = {s.rid: s for s in specs}
    step = 0

    def take_events() -> None:
        for ev in sched.drain_events():
            if isinstance(ev, RequestAborted):
                ended[ev.rid] = ended.get(ev.rid, 0) + 1
            elif isinstance(ev, Preemption):
                event("preemption")
                for rid in ev.rids:
                    req = reqs[rid]
                    assert req not in sched.running.reqs and len(req.kv) == 0, rid
                    assert req in sched.waiting or req.finished_reason is not None, f"preempted {rid} lost"
            elif isinstance(ev, Retraction):
                event("retraction")

    def process(batch: ScheduledBatch) -> None:
        tokens = []
        for req in batch.reqs:  # the token is fixed when the result is read (outputs lag under overlap)
            k = len(req.output_ids) + 1
            tokens.append(EOS if by_rid[req.rid].eos_at == k else 7)
        outcome = sched.on_batch_done(batch, tokens)
        for req in outcome.finished:
            if req.finished_reason is not None and req.finished_reason.kind is not FinishKind.ABORT:
                ended[req.rid] = ended.get(req.rid, 0) + 1
        take_events()
        sched.check_invariants()

    in_flight: ScheduledBatch | None = None
    while True:
        while pending and pending[0].arrive_at <= step:
            spec = pending.pop(0)
            first = 1000 * (int(spec.rid[1:]) + 1)  # prompts of their own: no shared prefixes
            prompt = list(range(first, first + spec.prompt_len))
            req = Req(spec.rid, prompt, SamplingLimits(spec.max_new), priority=spec.priority)
            reqs[spec.rid] = req
            sched.add_request(req)
            take_events()
        batch = sched.next_batch()
        take_events()
        processed = in_flight is not None
        if in_flight is not None:
            process(in_flight)
            in_flight = None
        if overlap:
            in_flight = batch
        if batch is None:
            if processed:
                continue  # the pass after a result: nothing new was in flight
            if not pending:
                break
            step = pending[0].arrive_at
            continue
        if not overlap:
            process(batch)
        step += 1
        assert step < 50_000, "no progress"
    return sched, reqs, ended


@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
@pytest.mark.parametrize("overlap", [False, True])
def test_priority_workloads_keep_the_invariants_and_end_every_request_once(
    overlap: bool, case: tuple[ServerArgs, list[Spec]]
) -> None:
    args, specs = case
    sched, reqs, ended = run(args, specs, overlap)
    assert set(reqs) == {s.rid for s in specs}
    for rid, req in reqs.items():
        reason = req.finished_reason
        assert reason is not None, f"{rid} never ended"
        assert ended.get(rid) == 1, (rid, ended.get(rid), reason)
        if reason.kind is FinishKind.ABORT:
            assert reason.message in ABORTS, reason
            if reason.message == ABORTED_BY_PRIORITY_MESSAGE:
                event("aborted by a higher priority request")
    assert not sched.waiting and not sched.running.reqs and sched.chunked_req is None
    sched.cache.reset()
    assert sched.pool.available_size() == sched.max_total_num_tokens, "KV slots leaked"
    assert sched.req_slots.available_size() == sched.req_slots.size, "request slots leaked"
