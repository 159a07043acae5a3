"""Priority scheduling (docs/sglang-rules.md §13): the numbers come from SGLang 0.5.22's rules, by hand."""

from __future__ import annotations

import sys

import pytest

from helpers import admit, make_req, make_scheduler, step, w
from kvadmit.config import ConfigError, ServerArgs
from kvadmit.request import Req
from kvadmit.scheduler.events import Preemption, RequestAborted
from kvadmit.scheduler.priority import PriorityScheduling, tokens_to_free


def preq(rid: str, priority: int | None, prompt: int = 10, max_new: int = 128, **kw: object) -> Req:
    req = make_req(rid, prompt, max_new, **kw)  # type: ignore[arg-type]
    req.priority = priority
    return req


def rids(reqs: list[Req]) -> list[str]:
    return [r.rid for r in reqs]


# ----- the priority a request gets ---------------------------------------------------------------
def test_without_a_priority_a_request_is_the_least_urgent_possible() -> None:
    high_first = make_scheduler(max_total_tokens=10_000, enable_priority_scheduling=True)
    q = preq("q", None)
    assert high_first.add_request(q) and q.priority == -sys.maxsize - 1 == -9223372036854775808
    low_first = make_scheduler(
        max_total_tokens=10_000, enable_priority_scheduling=True, schedule_low_priority_values_first=True
    )
    q = preq("q", None)
    assert low_first.add_request(q) and q.priority == sys.maxsize == 9223372036854775807


def test_the_default_priority_value_is_given_to_requests_without_one() -> None:
    sched = make_scheduler(max_total_tokens=10_000, enable_priority_scheduling=True, default_priority_value=7)
    a, b = preq("a", None), preq("b", 3)
    assert sched.add_request(a) and sched.add_request(b)
    assert (a.priority, b.priority) == (7, 3)


def test_with_priorities_off_a_priority_is_kept_and_ignored_unless_the_server_aborts_it() -> None:
    sched = make_scheduler(max_total_tokens=10_000, default_priority_value=7)
    a, b = preq("a", 1), preq("b", 99)
    assert sched.add_request(a) and sched.add_request(b)
    batch, _ = step(sched)
    assert rids(batch.reqs) == ["a", "b"]  # arrival order: priorities are not looked at
    assert (a.priority, b.priority) == (1, 99)
    none = preq("none", None)
    assert sched.add_request(none) and none.priority is None  # the default applies only when on

    strict = make_scheduler(max_total_tokens=10_000, abort_on_priority_when_disabled=True)
    q = preq("q", 0)
    assert not strict.add_request(q)
    assert q.finished_reason is not None
    assert q.finished_reason.message == (
        "Using priority is disabled for this server. Please send a new request without a priority."
    )
    assert q.finished_reason.status_code == 503
    assert strict.drain_events() == [RequestAborted("q", q.finished_reason.message, 503)]
    assert strict.add_request(preq("plain", None))  # no priority: served as usual


# ----- the queue order ---------------------------------------------------------------------------
def _sorted(policy: str, reqs: list[Req], **kw: object) -> list[str]:
    sched = make_scheduler(
        max_total_tokens=100_000, enable_priority_scheduling=True, schedule_policy=policy, **kw
    )
    for q in reqs:
        sched.add_request(q)
    sched.order.sort(sched.waiting)
    return rids(sched.waiting)


def test_fcfs_larger_values_first_and_arrival_order_within_a_priority() -> None:
    reqs = [preq("a", 0), preq("b", 5), preq("c", 5), preq("d", 1), preq("e", None)]
    assert _sorted("fcfs", reqs) == ["b", "c", "d", "a", "e"]


def test_fcfs_with_low_values_first() -> None:
    reqs = [preq("a", 0), preq("b", 5), preq("c", 5), preq("d", 1), preq("e", None)]
    assert _sorted("fcfs", reqs, schedule_low_priority_values_first=True) == ["a", "d", "b", "c", "e"]


def test_lof_sorts_by_priority_then_longest_output() -> None:
    reqs = [
        preq("a", 1, max_new=10),
        preq("b", 1, max_new=300),
        preq("c", 2, max_new=5),
        preq("d", 1, max_new=10),
    ]
    assert _sorted("lof", reqs) == ["c", "b", "a", "d"]


def test_a_request_that_enters_the_queue_again_goes_behind_its_equals() -> None:
    # The tie-break is the time of the latest queue entry, which a re-queued request renews.
    prio = PriorityScheduling(enabled=True)
    a, b, c = preq("a", 1), preq("b", 1), preq("c", 1)
    for q in (a, b, c):
        prio.stamp(q)
    prio.stamp(a)  # a is retracted and re-queued
    queue = [a, b, c]
    prio.sort_fcfs(queue)
    assert rids(queue) == ["b", "c", "a"]


def test_priority_scheduling_needs_fcfs_or_lof_and_retraction_by_priority_needs_it_on() -> None:
    with pytest.raises(ConfigError, match=r"schedule_policy must be 'fcfs' or 'lof'. 'lpm' is not supported"):
        ServerArgs(enable_priority_scheduling=True, schedule_policy="lpm").check_startup()
    with pytest.raises(
        ConfigError, match="--retraction-policy priority requires --enable-priority-scheduling"
    ):
        ServerArgs(retraction_policy="priority").check_startup()
    with pytest.raises(ConfigError, match="--retraction-policy 'oldest' is not supported"):
        ServerArgs(retraction_policy="oldest")
    ServerArgs(
        enable_priority_scheduling=True, schedule_policy="lof", retraction_policy="priority"
    ).check_startup()


# ----- a full queue ------------------------------------------------------------------------------
def test_a_full_queue_aborts_its_least_urgent_request_for_a_more_urgent_one() -> None:
    sched = make_scheduler(max_total_tokens=10_000, max_queued_requests=2, enable_priority_scheduling=True)
    a, b, c, d, e = preq("a", 0), preq("b", 0), preq("c", 5), preq("d", 5), preq("e", 5)
    assert sched.add_request(a) and sched.add_request(b)
    # a and b are equally least urgent: the later entry (b) goes.
    assert sched.add_request(c)
    assert b.finished_reason is not None
    assert b.finished_reason.message == "The request is aborted by a higher priority request."
    assert b.finished_reason.status_code == 503
    assert sched.add_request(d)  # a (0) is less urgent than d (5)
    assert a.finished_reason is not None and rids(sched.waiting) == ["c", "d"]
    # e is not strictly more urgent than c or d: e is the one turned away
    assert not sched.add_request(e)
    assert e.finished_reason is not None and e.finished_reason.message == "The request queue is full."
    assert rids(sched.waiting) == ["c", "d"]


def test_without_priority_scheduling_a_full_queue_turns_the_newcomer_away() -> None:
    sched = make_scheduler(max_total_tokens=10_000, max_queued_requests=1)
    assert sched.add_request(preq("a", 0))
    late = preq("b", 100)
    assert not sched.add_request(late)
    assert late.finished_reason is not None and late.finished_reason.message == "The request queue is full."


@pytest.mark.parametrize("by_priority", [False, True])
def test_a_retracted_request_meets_the_queue_cap_too(by_priority: bool) -> None:
    # a and b fill the two request slots; z waits and fills the one-place queue. SGLANG_TEST_RETRACT
    # retracts one at the third batch: b, with fewer outputs; b finds the queue full. Without
    # priorities b is aborted; with them b (priority 5) is more urgent than z (0), and z is aborted.
    from kvadmit.config import SchedulerKnobs
    from kvadmit.scheduler.events import Retraction

    sched = make_scheduler(
        max_total_tokens=4096, context_len=4096, max_running_requests=2, max_queued_requests=1,
        knobs=SchedulerKnobs(test_retract=True, test_retract_interval=3),
        enable_priority_scheduling=by_priority,
    )  # fmt: skip
    a, b, z = preq("a", 5, prompt=50, max_new=20), preq("b", 5, prompt=50, max_new=20), preq("z", 0)
    for q in (a, b):
        assert sched.add_request(q)
        step(sched)  # prefilled; b has one output fewer than a
    assert sched.add_request(z)
    retraction = None
    while retraction is None:
        step(sched)
        retraction = next((e for e in sched.drain_events() if isinstance(e, Retraction)), None)
    assert sched.forward_ct == 4  # the decode check before the fourth batch: forward_ct 3 % 3 == 0
    assert retraction is not None and retraction.rids == ("b",)
    loser, winner = (z, b) if by_priority else (b, z)
    assert loser.finished_reason is not None and loser.finished_reason.status_code == 503
    assert loser.finished_reason.message == (
        "The request is aborted by a higher priority request."
        if by_priority
        else "The request queue is full."
    )
    assert rids(sched.waiting) == [winner.rid]


# ----- preemption --------------------------------------------------------------------------------
def _one_running(**kw: object) -> tuple[object, Req]:
    """A scheduler whose single request slot is taken by `r` (priority from kw, default 0)."""
    running_priority = kw.pop("running_priority", 0)
    sched = make_scheduler(
        max_total_tokens=4000, max_running_requests=1, enable_priority_scheduling=True, **kw
    )
    r = preq("r", running_priority, prompt=100)  # type: ignore[arg-type]
    sched.add_request(r)
    step(sched)
    return sched, r


@pytest.mark.parametrize(
    ("threshold", "priority", "preempts"),
    [(10, 10, False), (10, 11, True), (9, 10, True), (9, 9, False)],
)
def test_preemption_needs_a_priority_more_than_the_threshold_above(
    threshold: int, priority: int, preempts: bool
) -> None:
    sched, r = _one_running(priority_scheduling_preemption_threshold=threshold)
    b = preq("b", priority, prompt=100)
    sched.add_request(b)
    batch, _ = step(sched)
    events = sched.drain_events()
    if preempts:
        assert batch.kind == "prefill" and rids(batch.reqs) == ["b"]
        assert Preemption(rids=("r",), by_rid="b") in events
        assert rids(sched.waiting) == ["r"] and r.is_retracted and r.retraction_count == 1
        assert r.output_ids == [7]  # its output stays; the prefill recomputes prompt + output
    else:
        assert batch.kind == "decode" and rids(batch.reqs) == ["r"]
        assert not any(isinstance(e, Preemption) for e in events)
        assert rids(sched.waiting) == ["b"]


def test_the_prefill_line_counts_the_running_batch_after_the_preemption() -> None:
    # SGLang's PrefillStats.from_adder reads the running batch the adder left: r was preempted, so the
    # Prefill batch line that admits b says #running-req 0, not the 1 running when the pass began.
    sched, _ = _one_running()
    sched.add_request(preq("b", 11, prompt=100))
    batch, _ = step(sched)
    assert rids(batch.reqs) == ["b"] and batch.stats is not None and batch.stats.running_req == 0


def test_the_default_threshold_is_10() -> None:
    assert ServerArgs().priority_scheduling_preemption_threshold == 10
    sched, _ = _one_running()
    sched.add_request(preq("b", 10))
    assert step(sched)[0].kind == "decode"


def test_with_low_values_first_a_smaller_value_preempts() -> None:
    sched, r = _one_running(schedule_low_priority_values_first=True, running_priority=20)
    sched.add_request(preq("b", 10))  # 20 − 10 = 10: not more than 10
    assert step(sched)[0].kind == "decode"
    sched.add_request(preq("c", 9))  # 20 − 9 = 11
    batch, _ = step(sched)
    assert rids(batch.reqs) == ["c"] and r in sched.waiting


def test_disable_priority_preemption_keeps_the_running_request() -> None:
    sched, _ = _one_running(disable_priority_preemption=True)
    sched.add_request(preq("b", 1000))
    assert step(sched)[0].kind == "decode"
    assert rids(sched.waiting) == ["b"]


def test_preemption_waits_for_the_request_cap() -> None:
    # Two request slots, one used: b is admitted beside r; nothing is preempted.
    sched = make_scheduler(max_total_tokens=4000, max_running_requests=2, enable_priority_scheduling=True)
    r = preq("r", 0, prompt=100)
    sched.add_request(r)
    step(sched)
    sched.add_request(preq("b", 1000))
    batch, _ = step(sched)
    assert rids(batch.reqs) == ["b"] and not sched.waiting
    assert not any(isinstance(e, Preemption) for e in sched.drain_events())


def _two_running_and(candidate_prompt: int) -> tuple[object, Req, Req, Req]:
    """A and C (prompt 100, max_new 400, ignore_eos so they reserve in full) run in a 2,000-token pool
    with two request slots; each has one output. Free: 2000 − 200 = 1800; held back: 2 × 399 = 798;
    rem_total_tokens = 1002. Then B (priority 20, max_new 400) arrives."""
    sched = make_scheduler(max_total_tokens=2000, max_running_requests=2, enable_priority_scheduling=True)
    a = preq("A", 0, prompt=100, max_new=400, ignore_eos=True)
    c = preq("C", 0, prompt=100, max_new=400, ignore_eos=True)
    sched.add_request(a)
    sched.add_request(c)
    step(sched)
    b = preq("B", 20, prompt=candidate_prompt, max_new=400)
    sched.add_request(b)
    return sched, a, c, b


def test_preemption_takes_the_newest_of_the_least_urgent_and_the_candidate_is_admitted() -> None:
    # A fresh B counts 0 − 0 + 400 − 1002 = −602 tokens to free: one preemption. A and C tie at
    # priority 0; C entered the queue later, so C goes. Then B needs 1000 + 400 + 1 = 1401 <
    # 1900 − 399 = 1501 (C's KV is freed, A still holds back 399): admitted.
    sched, _, _, _ = _two_running_and(1000)
    batch, _ = step(sched)
    assert rids(batch.reqs) == ["B"]
    assert Preemption(rids=("C",), by_rid="B") in sched.drain_events()
    assert rids(sched.waiting) == ["C"] and rids(sched.running.reqs) == ["A"]


def test_a_fresh_candidate_counts_none_of_its_prompt_so_it_may_preempt_and_still_not_fit() -> None:
    # SGLang reads the candidate's fill ids before preparing it, and a request never prepared has none:
    # B (1,300-token prompt) counts 400 − 1002 < 0 and preempts only C. Then it needs 1300 + 400 + 1 =
    # 1701 ≥ 1501: it waits, and C waits too (re-queued behind it). A decodes alone.
    sched, _, c, _ = _two_running_and(1300)
    batch, _ = step(sched)
    assert batch.kind == "decode" and rids(batch.reqs) == ["A"]
    assert Preemption(rids=("C",), by_rid="B") in sched.drain_events()
    assert rids(sched.waiting) == ["B", "C"] and c.retraction_count == 1


def test_tokens_to_free_once_the_candidate_has_been_prepared() -> None:
    # Prepared before (1,300 prompt tokens, 40 of them cached): 1300 − 40 + 400 − 1002.5 = 657.5.
    b = preq("B", 20, prompt=1300, max_new=400)
    b.examined_fill_len, b.prefix_len = 1300, 40
    assert tokens_to_free(b, 1002.5, 4096) == 657.5
    assert tokens_to_free(b, 1002.5, 100) == 1300 - 40 + 100 - 1002.5


def test_choose_preempted_walks_from_the_least_urgent_until_the_tokens_are_covered() -> None:
    prio = PriorityScheduling(enabled=True, preemption=True, preemption_threshold=10)
    running = [preq("p0", 0), preq("p5", 5), preq("p30", 30), preq("q0", 0)]
    for q in running:
        prio.stamp(q)
    b = preq("b", 20)
    offset = {"p0": 300.0, "p5": 200.0, "p30": 999.0, "q0": 100.0}.__getitem__
    # Least urgent first: q0 (0, newer than p0), p0, p5 (20 − 5 = 15 > 10), then p30 (not more urgent).
    assert rids(prio.choose_preempted(b, running, 50, lambda r: offset(r.rid)) or []) == ["q0"]
    assert rids(prio.choose_preempted(b, running, 350, lambda r: offset(r.rid)) or []) == ["q0", "p0"]
    # covered exactly (400 − 100 − 300 = 0) is enough
    assert rids(prio.choose_preempted(b, running, 400, lambda r: offset(r.rid)) or []) == ["q0", "p0"]
    assert rids(prio.choose_preempted(b, running, 600, lambda r: offset(r.rid)) or []) == ["q0", "p0", "p5"]
    assert prio.choose_preempted(b, running, 600.5, lambda r: offset(r.rid)) is None  # p30 stops the walk
    b15 = preq("b15", 15)  # 15 − 5 = 10: p5 no longer qualifies
    assert rids(prio.choose_preempted(b15, running, 350, lambda r: offset(r.rid)) or []) == ["q0", "p0"]
    assert prio.choose_preempted(b15, running, 450, lambda r: offset(r.rid)) is None


# ----- retraction --------------------------------------------------------------------------------
def test_retraction_policy_priority_retracts_the_least_urgent_first() -> None:
    prio = PriorityScheduling(enabled=True, retract_by_priority=True)
    reqs = [preq("hi", 9, prompt=300), preq("lo_long", 1, prompt=300), preq("lo_short", 1, prompt=100)]
    reqs[0].output_ids = [1] * 2  # fewest outputs, but the most urgent
    reqs[1].output_ids = [1] * 50
    reqs[2].output_ids = [1] * 50
    order = prio.retraction_order(reqs)  # keep-preference order; victims from the end
    assert [reqs[i].rid for i in order] == ["hi", "lo_short", "lo_long"]
    low_first = PriorityScheduling(enabled=True, low_values_first=True, retract_by_priority=True)
    assert [reqs[i].rid for i in low_first.retraction_order(reqs)] == ["lo_short", "lo_long", "hi"]


def test_a_decode_snapshot_retracts_by_priority() -> None:
    from kvadmit.capacity.answer import answer_decode
    from kvadmit.capacity.snapshot import parse_snapshot

    def run(p: int, o: int, prio: int) -> dict[str, object]:
        return {"rid": f"r{prio}", "prompt_len": p, "output_len": o, "max_new_tokens": 400, "priority": prio}

    server = {"max_total_tokens": 100 + 10 + 100 + 40, "enable_priority_scheduling": True}
    running = [run(100, 10, 5), run(100, 40, 1)]  # no free slot
    length = answer_decode(parse_snapshot({"server": server, "check": "decode", "running": running}))
    assert length["retracted"] == ["r5"]  # fewest outputs
    server["retraction_policy"] = "priority"
    ans = answer_decode(parse_snapshot({"server": server, "check": "decode", "running": running}))
    assert ans["retracted"] == ["r1"] and ans["kept"] == ["r5"]
    assert "priority 1, 40 outputs" in ans["explanation"][1]


def test_an_admission_snapshot_names_the_preemption() -> None:
    running = [
        {
            "rid": "A",
            "prompt_len": 100,
            "output_len": 1,
            "max_new_tokens": 400,
            "ignore_eos": True,
            "priority": 0,
        },
        {
            "rid": "C",
            "prompt_len": 100,
            "output_len": 1,
            "max_new_tokens": 400,
            "ignore_eos": True,
            "priority": 0,
        },
    ]
    server = {"max_total_tokens": 2000, "max_running_requests": 2, "enable_priority_scheduling": True}
    ans = admit(server, [w("B", 1000, 400, priority=20)], running=running)
    assert ans["admitted"] == ["B"] and ans["preempted"] == ["C"]
    assert ans["explanation"][0].startswith(
        "C: preempted for B (priority 20 against 0: more urgent by more than "
        "--priority-scheduling-preemption-threshold 10, with the request cap reached)"
    )
    ans = admit({**server, "priority_scheduling_preemption_threshold": 20}, [w("B", 1000, 400, priority=20)],
                running=running)  # fmt: skip
    assert ans["admitted"] == [] and ans["preempted"] == []


def test_preemption_evicts_the_cache_down_to_20_tokens_per_request_left() -> None:
    # A pool of 177: A holds 101, C holds 1, the cache 25 (the oldest entry) + B's 50-token prefix;
    # nothing free. B preempts C (the newer of the two at priority 0); C's 1 token is freed and the cache
    # is evicted until 20 × 1 (one request left) are free: the 25-token entry goes, B's prefix stays.
    running = [
        {"rid": "A", "prompt_len": 100, "output_len": 1, "max_new_tokens": 2, "priority": 0},
        {"rid": "C", "prompt_len": 1, "output_len": 0, "max_new_tokens": 1, "priority": 0},
    ]
    server = {"max_total_tokens": 177, "max_running_requests": 2, "enable_priority_scheduling": True}
    waiting = [w("B", 1000, 1, cached_prefix_len=50, priority=20)]
    ans = admit(server, waiting, running=running, evictable_tokens=75)
    assert ans["preempted"] == ["C"] and ans["prefix_lens"] == {"B": 50}


def test_a_request_that_ended_in_the_batch_leaves_it_after_a_preemption_in_front_of_it() -> None:
    # Batch [A, C]; C (priority 50) ends in a decode step and still sits in the batch when B (20) preempts
    # A (0) at the request cap. The next decode pass drops C, and B decodes alone.
    sched = make_scheduler(max_total_tokens=4000, max_running_requests=2, enable_priority_scheduling=True)
    a, c = preq("A", 0, prompt=20, max_new=100), preq("C", 50, prompt=20, max_new=2)
    for q in (a, c):
        sched.add_request(q)
        step(sched)
    batch, _ = step(sched)
    assert batch.kind == "decode" and c.finished and rids(sched.running.reqs) == ["A", "C"]
    sched.add_request(preq("B", 20, prompt=20))
    batch, _ = step(sched)
    assert rids(batch.reqs) == ["B"] and Preemption(("A",), "B") in sched.drain_events()
    batch, _ = step(sched)
    assert batch.kind == "decode" and rids(batch.reqs) == ["B"]
