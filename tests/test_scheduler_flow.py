"""The scheduler over many steps: waves, batch_is_full, ratio decay and reset, finished requests."""

from __future__ import annotations

import pytest

from helpers import make_req, make_scheduler, step
from kvadmit.scheduler.events import DecodeBatchStats, PrefillBatchStats, Retraction
from kvadmit.scheduler.scheduler import Scheduler


def run_mission(sched: Scheduler, total: int = 32, concurrency: int = 16) -> tuple[list[object], list[int]]:
    """The mission's benchmark, as the scheduler sees it: 256 + 512 ignore_eos requests, at most
    `concurrency` open at once, a new one sent whenever one finishes."""
    sent = 0
    events: list[object] = []
    running_sizes: list[int] = []
    reqs = []

    def send() -> None:
        nonlocal sent
        q = make_req(f"q{sent}", 256, max_new_tokens=512, ignore_eos=True)
        reqs.append(q)
        sched.add_request(q)
        sent += 1

    for _ in range(concurrency):
        send()
    for _ in range(100_000):
        batch, out = step(sched)
        events.extend(sched.drain_events())
        if batch is None:
            break
        if batch.kind == "decode":
            running_sizes.append(len(batch.reqs))
        for _ in out.finished:
            if sent < total:
                send()
    assert all(len(q.output_ids) == 512 for q in reqs) and len(reqs) == total
    return events, running_sizes


def test_the_mission_run_keeps_exactly_five_running_in_waves(mission_scheduler: Scheduler) -> None:
    events, sizes = run_mission(mission_scheduler)
    assert max(sizes) == 5
    prefills = [e for e in events if isinstance(e, PrefillBatchStats)]
    assert all(e.new_seq <= 5 for e in prefills)
    assert sum(e.new_seq for e in prefills) == 32
    # 32 requests start in waves of five (the last wave has two).
    assert [e.new_seq for e in prefills] == [5, 5, 5, 5, 5, 5, 2]
    assert not [e for e in events if isinstance(e, Retraction)]
    usage = [e.token_usage for e in events if isinstance(e, DecodeBatchStats)]
    # Five requests hold at most 5 × (256 + 511) = 3835 slots: usage peaks in (0.90, 0.94].
    assert 0.90 < max(usage) <= 5 * 767 / 4096 < 0.94
    # While the first wave runs, eleven wait.
    assert next(e for e in events if isinstance(e, DecodeBatchStats)).queue_req == 11


def test_the_ratio_decays_once_per_decode_step_and_not_on_prefill() -> None:
    sched = make_scheduler(max_total_tokens=100_000, context_len=8192)
    sched.add_request(make_req("a", 10, max_new_tokens=1000))
    init, decay = 0.7, (0.7 - 0.098) / 600
    step(sched)  # prefill
    assert sched.ratio.current == init
    for _ in range(10):
        step(sched)
    assert sched.ratio.current == pytest.approx(init - 10 * decay)
    sched.add_request(make_req("b", 10, max_new_tokens=1000))
    batch, _ = step(sched)
    assert batch is not None and batch.kind == "prefill"
    assert sched.ratio.current == pytest.approx(init - 10 * decay)


def test_the_ratio_resets_only_when_the_scheduler_is_fully_idle() -> None:
    sched = make_scheduler(max_total_tokens=100_000, context_len=8192)
    sched.add_request(make_req("a", 10, max_new_tokens=5))
    while step(sched)[0] is not None:
        pass
    assert sched.ratio.current == sched.ratio.init


def test_a_request_that_does_not_fit_waits_until_running_requests_leave() -> None:
    # Pool 1000: two 100 + 300 requests fit (401 each: 1000 − 802 = 198 left), a third waits. The two
    # are ignore_eos, so they keep reserving their whole remaining output: q2 fits only when they end.
    # (That no admission is even tried meanwhile is test_rules_detail's no-retry test.)
    sched = make_scheduler(max_total_tokens=1000, context_len=8192)
    for i in range(3):
        sched.add_request(make_req(f"q{i}", 100, max_new_tokens=300, ignore_eos=True))
    batch, _ = step(sched)
    assert batch is not None and [q.rid for q in batch.reqs] == ["q0", "q1"]
    kinds = []
    for _ in range(298):
        batch, _ = step(sched)
        kinds.append(batch.kind)
    assert set(kinds) == {"decode"}
    batch, out = step(sched)  # the last decode: both finish
    assert batch.kind == "decode" and len(out.finished) == 2
    batch, _ = step(sched)
    assert batch.kind == "prefill" and [q.rid for q in batch.reqs] == ["q2"]


def test_a_request_finished_in_decode_still_counts_as_running_in_the_next_prefill_line() -> None:
    # SGLang filters finished requests out of the running batch only in the next decode pass; a prefill
    # formed before it prints them in #running-req (and reserves for them).
    sched = make_scheduler(max_total_tokens=100_000, context_len=8192)
    sched.add_request(make_req("a", 10, max_new_tokens=3))
    step(sched)
    step(sched)
    _, out = step(sched)  # a finishes here (3 tokens)
    assert [q.rid for q in out.finished] == ["a"]
    sched.add_request(make_req("b", 10, max_new_tokens=3))
    step(sched)
    prefill = [e for e in sched.drain_events() if isinstance(e, PrefillBatchStats)][-1]
    assert prefill.running_req == 1 and prefill.new_seq == 1


def test_a_chunked_prompt_takes_several_prefill_steps_then_decodes() -> None:
    sched = make_scheduler(max_total_tokens=10_000, context_len=8192, chunked_prefill_size=64)
    q = make_req("long", 200, max_new_tokens=4)
    sched.add_request(q)
    extends = []
    for _ in range(4):
        _batch, _ = step(sched)
        extends.append(q.extend_input_len)
    assert extends == [64, 64, 64, 8]
    assert len(q.output_ids) == 1  # only the last chunk samples a token
    while step(sched)[0] is not None:
        pass
    assert len(q.output_ids) == 4


def test_a_shared_prefix_is_served_from_the_cache() -> None:
    sched = make_scheduler(max_total_tokens=10_000, context_len=8192)
    prompt = list(range(100, 400))
    sched.add_request(make_req("a", prompt=prompt, max_new_tokens=2))
    while step(sched)[0] is not None:
        pass
    sched.drain_events()
    sched.add_request(make_req("b", prompt=[*prompt, 1, 2, 3], max_new_tokens=2))
    step(sched)
    prefill = next(e for e in sched.drain_events() if isinstance(e, PrefillBatchStats))
    assert prefill.cached_token == 300 and prefill.new_token == 3


def test_arrival_caps_max_new_tokens_to_fit_the_pool() -> None:
    # §1.9: max_new is capped at max_req_len − input_len − 1 with max_req_len = min(context − 1, pool − 1)
    # = 999: 999 − 100 − 1 = 898 (the allocator's cap, pool − ceil_page(input) − page − 1, agrees here).
    sched = make_scheduler(max_total_tokens=1000, context_len=100_000)
    q = make_req("a", 100, max_new_tokens=5000)
    assert sched.add_request(q)
    assert q.max_new_tokens == 898


def test_a_prompt_longer_than_the_context_is_rejected_at_arrival() -> None:
    sched = make_scheduler(max_total_tokens=10_000, context_len=512)
    q = make_req("a", 600)
    assert not sched.add_request(q)
    assert q.finished_reason is not None and "exceeds the maximum allowed length" in q.finished_reason.message


def test_the_queue_cap_rejects_with_sglangs_message() -> None:
    sched = make_scheduler(max_total_tokens=10_000, context_len=512, max_queued_requests=1)
    assert sched.add_request(make_req("a", 10))
    q = make_req("b", 10)
    assert not sched.add_request(q)
    assert q.finished_reason.message == "The request queue is full." and q.finished_reason.status_code == 503


def test_a_request_that_can_never_pass_admission_is_ended_not_left_waiting() -> None:
    # Cache disabled, ignore_eos: max_new is capped to 1000 − 100 − 1 − 1 = 898, and the
    # future-occupancy check needs (1000 − 101) − 898 = 1 > 1 free at the end: it never passes.
    # SGLang would wait forever; kvadmit ends the request with a message saying why.
    sched = make_scheduler(max_total_tokens=1000, context_len=100_000, disable_radix_cache=True)
    q = make_req("a", 100, max_new_tokens=5000, ignore_eos=True)
    ok = make_req("b", 100, max_new_tokens=896, ignore_eos=True)  # 899 − 896 = 3 > 1 passes
    sched.add_request(q)
    sched.add_request(ok)
    batch, _ = step(sched)
    assert q.finished_reason is not None and "can never be scheduled" in q.finished_reason.message
    assert batch is not None and [r.rid for r in batch.reqs] == ["b"]
