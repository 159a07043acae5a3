"""Rule boundaries found by mutation testing: each test fails when the rule it names is changed.

Expected numbers are worked out by hand from the reference (sections cited per test), never read back.
"""

from __future__ import annotations

import pytest

from helpers import admit, cache_with, make_req, make_scheduler, r, step, w
from kvadmit.capacity.answer import answer_decode
from kvadmit.capacity.snapshot import parse_snapshot
from kvadmit.memory.pool import TokenPool
from kvadmit.scheduler.ordering import QueueOrder

OFF = {"max_total_tokens": 1000, "disable_radix_cache": True}


# §1.6 step 2: a running request about to finish frees its 500 tokens; normal fit would refuse (551 ≥ 490)
def test_eos_sim_counts_tokens_freed_by_earlier_finishers() -> None:
    # avail 500, rem_total 500-10=490; paged 101; cur 399; sorted [r(10,500), c(450,100)]
    # i0 bs2: 399-20=379>2; i1 bs1: 399+500-450=449>1 -> admitted; charged 551 -> 490-551=-61
    ans = admit(OFF, [w("c", 100, 450, ignore_eos=True)], running=[r("r", 500, 0, 10, True)])
    assert ans["admitted"] == ["c"] and ans["rem_total_tokens"] == -61 and ans["verdict"] == "NO_TOKEN"


# §1.6 step 1: paged_input (101) > rem_total (500-450=50) -> NO_TOKEN though the simulation would pass
def test_eos_paged_input_must_fit_rem_total() -> None:
    ans = admit(OFF, [w("c", 100, 10, ignore_eos=True)], running=[r("r", 500, 0, 450, True)])
    assert ans["admitted"] == [] and ans["verdict"] == "NO_TOKEN" and ans["stopped_at"] == "c"


# §1.6: a normal running request enters the simulation with max_new*ratio - out
def test_eos_sim_scales_normal_running_by_ratio() -> None:
    # pool 1500; r normal 100+0/1800, ratio .5: rem_total = 1400-900 = 500; cur = 1400-101 = 1299
    # [c 300/100, r 900/100]: i0 1299-600=699>2; i1 1299+100-900=499>1 -> admitted; 500-401=99
    ans = admit(
        {"max_total_tokens": 1500, "disable_radix_cache": True},
        [w("c", 100, 300, ignore_eos=True)],
        new_token_ratio=0.5,
        running=[r("r", 100, 0, 1800)],
    )
    assert ans["admitted"] == ["c"] and ans["rem_total_tokens"] == 99.0


# §1.6: reserve is 1 x bs
def test_eos_sim_reserve_is_one_per_remaining_request() -> None:
    # c0 100+398: 899-398=501>1, charged 499. c1 100+398: cur=899-101=798, [c1,c0] i0 bs2: 798-796=2<=2
    ans = admit(OFF, [w("c0", 100, 398, ignore_eos=True), w("c1", 100, 398, ignore_eos=True)])
    assert ans["admitted"] == ["c0"] and ans["stopped_at"] == "c1" and ans["verdict"] == "NO_TOKEN"
    ok = admit(OFF, [w("c0", 100, 397, ignore_eos=True), w("c1", 100, 397, ignore_eos=True)])
    assert ok["admitted"] == ["c0", "c1"] and ok["rem_total_tokens"] == 1000 - 2 * 498


# §10: insertion quirk: the larger tokens_left goes one before the end ([c1, c0], not [c0, c1])
def test_eos_insertion_places_the_largest_one_before_the_end() -> None:
    # c0 100+10 charged 111; c1 100+400: cur = 899-101 = 798; [c1 400, c0 10] i0 bs2: 798-800=-2 -> NO_TOKEN
    # (sorted properly [c0, c1]: 778>2, 898-400=498>1 would admit)
    ans = admit(OFF, [w("c0", 100, 10, ignore_eos=True), w("c1", 100, 400, ignore_eos=True)])
    assert ans["admitted"] == ["c0"] and ans["stopped_at"] == "c1" and ans["verdict"] == "NO_TOKEN"


# §10: no max_prefill_tokens check on the ignore_eos path with chunking off
def test_eos_path_has_no_input_budget_check() -> None:
    off = {
        "max_total_tokens": 10000,
        "disable_radix_cache": True,
        "chunked_prefill_size": -1,
        "max_prefill_tokens": 1000,
    }
    ans = admit(off, [w("a", 600, 10, ignore_eos=True), w("b", 600, 10, ignore_eos=True)])
    assert ans["admitted"] == ["a", "b"] and ans["rem_input_tokens"] == -200 and ans["verdict"] == "OTHER"


# §1.4 step 3: the candidate's max_new is clipped in the fit
def test_fit_clips_the_candidates_max_new() -> None:
    # 100 + min(10000,4096) + 1 = 4197 < 5000 fits; unclipped 10101 would not
    ans = admit({"max_total_tokens": 5000}, [w("c", 100, 10000)])
    assert ans["admitted"] == ["c"] and ans["rem_total_tokens"] == 5000 - 4197


# §1.4 step 4/7 with page 16: fit counts one page (16), charge ceil_page(extend)+page
def test_page_16_fit_and_charge() -> None:
    # extend 100 -> ceil 112; fit 100+883+16=999<1000 admitted; charge 112+16+883=1011 -> -11; cur 1000-128
    ok = admit({"max_total_tokens": 1000, "page_size": 16}, [w("c", 100, 883)])
    assert ok["admitted"] == ["c"] and ok["rem_total_tokens"] == -11 and ok["cur_rem_tokens"] == 872
    # 100+884+16 = 1000, not < 1000
    no = admit({"max_total_tokens": 1000, "page_size": 16}, [w("c", 100, 884)])
    assert no["admitted"] == [] and no["verdict"] == "NO_TOKEN"


# budget_state boundaries
def test_budget_state_rem_total_zero_is_no_token() -> None:
    # retracted 100+50 out, max_new 200: fit 150+150+1=301 < 351; charge 150+1+200=351
    # -> rem_total 0 -> NO_TOKEN
    z = admit({"max_total_tokens": 351}, [w("c", 100, 200, output_len=50), w("d", 1, 0)])
    assert (
        z["admitted"] == ["c"]
        and z["rem_total_tokens"] == 0
        and z["verdict"] == "NO_TOKEN"
        and z["stopped_at"] == "c"
    )


def test_budget_state_rem_input_zero_is_other() -> None:
    off = {"max_total_tokens": 10000, "chunked_prefill_size": -1, "max_prefill_tokens": 600}
    ans = admit(off, [w("a", 600, 10), w("b", 10, 10)])
    assert (
        ans["admitted"] == ["a"]
        and ans["rem_input_tokens"] == 0
        and ans["verdict"] == "OTHER"
        and ans["stopped_at"] == "a"
    )


def test_chunk_budget_spent_stops_at_the_chunked_request() -> None:
    ans = admit(
        {"max_total_tokens": 20000, "chunked_prefill_size": 4096}, [w("big", 10000, 100), w("s", 10, 10)]
    )
    assert ans["stopped_at"] == "big" and "s" not in ans["prefix_lens"]


def test_input_check_boundary_equal_is_other() -> None:
    off = {"max_total_tokens": 10000, "chunked_prefill_size": -1, "max_prefill_tokens": 1000}
    # after a (600) 400 remain; b 400 >= 400 -> OTHER; b 399 admitted
    assert admit(off, [w("a", 600, 10), w("b", 400, 10)])["admitted"] == ["a"]
    assert admit(off, [w("a", 600, 10), w("b", 399, 10)])["admitted"] == ["a", "b"]


def test_a_prompt_exactly_the_chunk_budget_is_not_chunked() -> None:
    ans = admit({"max_total_tokens": 10000, "chunked_prefill_size": 100}, [w("c", 100, 10)])
    assert (
        ans["chunked"] is None and ans["extend_lens"] == {"c": 100} and ans["rem_total_tokens"] == 10000 - 111
    )


# §3.1: only requests whose KV fills whole pages need a page
def test_decode_needs_a_page_only_at_page_boundaries() -> None:
    # page 16; a holds 32 (needs 16), b holds 17 (needs 0); pool 65 -> 16 free: no retraction
    snap = {
        "server": {"max_total_tokens": 65, "page_size": 16},
        "check": "decode",
        "new_token_ratio": 0.098,
        "running": [r("a", 22, 10, 400), r("b", 10, 7, 400)],
    }
    assert answer_decode(parse_snapshot(snap))["retract_called"] is False


# §3.2: after each victim evict so that remaining*20 are free
def test_evictable_tokens_that_cover_the_step_prevent_retraction() -> None:
    # Five requests hold 1550; 2 free + 3 evictable cover the 5 slots the step needs: no retraction.
    FIVE = [
        r("r1", 300, 40, 400),
        r("r2", 300, 35, 400),
        r("r3", 200, 35, 400),
        r("r4", 300, 30, 400),
        r("r5", 300, 10, 400),
    ]
    snap = {
        "server": {"max_total_tokens": 1550 + 2 + 3},
        "check": "decode",
        "new_token_ratio": 0.098,
        "evictable_tokens": 3,
        "running": FIVE,
    }
    a = answer_decode(parse_snapshot(snap))
    assert a["retract_called"] is False


# §2: after a retraction the ratio is the estimate (no decay that step)
def test_no_decay_in_the_retraction_step() -> None:
    from kvadmit.scheduler.events import Retraction

    sched = make_scheduler(max_total_tokens=600, context_len=4096)
    for i in range(4):
        sched.add_request(make_req(f"q{i}", 100, max_new_tokens=250))
    for _ in range(5000):
        batch = sched.next_batch()
        evs = [e for e in sched.events if isinstance(e, Retraction)]
        if evs:
            assert sched.ratio.current == evs[-1].new_ratio
            return
        if batch is None:
            break
        sched.on_batch_done(batch, [7] * len(batch.reqs))
        sched.drain_events()
    raise AssertionError("no retraction")


# §1.3 consequence: after NO_TOKEN (with a running batch) no retry until a running request leaves
def test_no_retry_after_no_token_even_if_the_budget_grows() -> None:
    # pool 10000, ratio 0.7. r0 (10+3000) runs alone. q1..q3 (10+3000): avail 9990, r0 reserves
    # 2999*0.7 = 2099.3 -> 7890.7; q1, q2 charged 3011 each -> 1868.7 < 3011: q3 NO_TOKEN, batch_is_full.
    # Next pass the budget would be 10000 - 30 - 3*2999*0.7 = 3672.1 > 3011, but no admission is tried.
    sched = make_scheduler(max_total_tokens=10000, context_len=100000)
    sched.add_request(make_req("r0", 10, max_new_tokens=3000))
    step(sched)
    for i in range(1, 4):
        sched.add_request(make_req(f"q{i}", 10, max_new_tokens=3000))
    b, _ = step(sched)
    assert [q.rid for q in b.reqs] == ["q1", "q2"]
    for _ in range(5):
        b, _ = step(sched)
        assert b.kind == "decode"


# §1.5 add_chunked_req: the last chunk reserves min(max_new, CLIP); continuation logs 0 cached
def test_last_chunk_reserves_its_max_new() -> None:
    sched = make_scheduler(max_total_tokens=10000, context_len=100000, chunked_prefill_size=64)
    q = make_req("long", 100, max_new_tokens=500)
    sched.add_request(q)
    step(sched)  # chunk 64
    rec = sched.run_admission(explain=True)
    # continuation: 36 tokens, last chunk: charged 36+1+500 = 537; avail 10000-64 = 9936 -> 9399
    assert rec.adder.snapshot_budget().rem_total_tokens == 9936 - 537


# §1.6: max_new_tokens is not clipped in the simulation
def test_eos_sim_does_not_clip_max_new() -> None:
    # pool 9000, c 100+8898: cur = 9000-101 = 8899; 8899-8898 = 1 <= 1 -> NO_TOKEN (clipped 4096 would pass)
    ans = admit({"max_total_tokens": 9000, "disable_radix_cache": True}, [w("c", 100, 8898, ignore_eos=True)])
    assert ans["admitted"] == [] and ans["verdict"] == "NO_TOKEN"


# §3.2: after each victim, evict cache until available >= remaining x 20
def test_retraction_evicts_the_victims_prefix_for_20_per_remaining() -> None:
    # pool 120, clip 0: six 10-token prompts (max_new 100) are all admitted (11 charged each).
    # Prefill: 60 held (prompts cached, locked); 10 decode steps take the other 60.
    # Before the 11th: full tie (11 outputs, prompt 10) -> the last (q5) goes: frees its 10 own slots,
    # its 10-token prompt becomes evictable; 10 < 5 x 20 -> evicted too: gained 20.
    from kvadmit.config import SchedulerKnobs
    from kvadmit.scheduler.events import Retraction

    sched = make_scheduler(
        max_total_tokens=120, context_len=4096, knobs=SchedulerKnobs(clip_max_new_tokens_estimation=0)
    )
    for i in range(6):
        sched.add_request(make_req(f"q{i}", 10, max_new_tokens=100))
    evs = []
    for _ in range(12):
        step(sched)
        evs += [e for e in sched.drain_events() if isinstance(e, Retraction)]
        if evs:
            break
    assert evs[0].rids == ("q5",) and evs[0].new_tokens_gained == 20
    assert evs[0].new_ratio == (5 * 11 + 20 * 5) / (5 * 100 + 1)


# §1.2: a retracted request goes behind those already waiting
def test_retracted_request_is_queued_behind_the_waiting_ones() -> None:
    from kvadmit.scheduler.events import Retraction

    sched = make_scheduler(max_total_tokens=600, context_len=4096)
    for i in range(4):
        sched.add_request(make_req(f"q{i}", 100, max_new_tokens=250))
    for _ in range(5000):
        _b, _ = step(sched)
        ev = [e for e in sched.drain_events() if isinstance(e, Retraction)]
        if ev:
            assert [q.rid for q in sched.waiting] == ["q3", *ev[0].rids]
            return
    raise AssertionError("no retraction")


# §1.5: a continuing chunk takes min(rem_chunk, int(rem_total)); with rem <= 0 it takes rem_chunk
def _continuation(reservation_max_new: int) -> int:
    from kvadmit.config import PROFILE_0_5_22
    from kvadmit.memory.radix import NoPrefixCache
    from kvadmit.request import Req, SamplingLimits
    from kvadmit.scheduler.admission import AdmissionPass, prepare_candidate
    from kvadmit.scheduler.batch import RunningBatch

    pool = TokenPool(1000)
    cache = NoPrefixCache(pool)
    run = Req("r", list(range(500)), SamplingLimits(reservation_max_new, True))
    run.kv = pool.alloc_extend([], 500)
    c = Req("c", list(range(1000, 1100)), SamplingLimits(10))
    c.kv = pool.alloc_extend([], 0)
    adder = AdmissionPass(
        cache=cache,
        pool=pool,
        running=RunningBatch(4096, True, [run]),
        new_token_ratio=0.7,
        page_size=1,
        profile=PROFILE_0_5_22,
        clip_max_new_tokens=4096,
        rem_input_tokens=16384,
        rem_chunk_tokens=64,
    )
    prepare_candidate(c, cache, continuing_chunk=True)
    adder.add_chunked_req(c)
    return c.extend_input_len


def test_chunk_continuation_budget() -> None:
    # available 500; running ignore_eos reserves 470 -> rem_total 30: chunk = min(64, 30) = 30
    assert _continuation(470) == 30
    # reserves 520 -> rem_total -20 <= 0: it takes rem_chunk_tokens = 64 anyway
    assert _continuation(520) == 64


# §10 floats: running reservations summed one by one in batch order:
# 30 x (7 x 0.1) = 20.99999999999999, not 21
def test_reservation_is_the_batch_order_float_sum() -> None:
    # pool 83, 30 running (2 prompt, 0 out, max_new 7) hold 60: available 23. c needs 1 + 0 + 1 = 2.
    # 2 < 23 - 20.99999999999999 = 2.00000000000001 -> admitted (with 0.1 x 210 = 21.0 it would not be)
    ans = admit(
        {"max_total_tokens": 83},
        [w("c", 1, 0)],
        new_token_ratio=0.1,
        running=[r(f"r{i}", 2, 0, 7) for i in range(30)],
    )
    s = 0.0
    for _ in range(30):
        s += 7 * 0.1
    assert ans["admitted"] == ["c"] and ans["rem_total_tokens"] == 23 - (s + 2)


def test_lpm_applies_at_128_and_falls_back_at_129() -> None:
    shared = list(range(100, 200))
    for n, first in ((127, "hit"), (128, "q0")):
        queue = [make_req(f"q{i}", 5) for i in range(n)] + [make_req("hit", prompt=[*shared, 1])]
        QueueOrder("lpm", cache_with([shared])).sort(queue)
        assert queue[0].rid == first, n + 1


def test_lpm_defer_threshold_is_32_shared_tokens() -> None:
    for share, order in ((31, ["a", "b", "c"]), (32, ["a", "c", "b"])):
        common = list(range(500, 500 + share))
        queue = [make_req("a", prompt=[*common, 1]), make_req("b", prompt=[*common, 2]), make_req("c", 10)]
        QueueOrder("lpm", cache_with([])).sort(queue)
        assert [q.rid for q in queue] == order, share


def test_lpm_checks_requests_with_a_short_cache_match() -> None:
    common = list(range(500, 540))
    queue = [make_req("a", prompt=[*common, 1]), make_req("b", prompt=[*common, 2]), make_req("c", 10)]
    QueueOrder("lpm", cache_with([common[:20]])).sort(queue)  # a and b match 20 <= 32: checked
    assert [q.rid for q in queue] == ["a", "c", "b"]


def test_prefill_line_fields_for_a_chunked_prompt() -> None:
    from kvadmit.scheduler.events import PrefillBatchStats

    sched = make_scheduler(max_total_tokens=10_000, context_len=8192, chunked_prefill_size=64)
    sched.add_request(make_req("long", 200, max_new_tokens=4))
    sched.add_request(make_req("w", 50, max_new_tokens=4))
    lines = []
    for _ in range(4):
        b = sched.next_batch()
        if _ == 0:
            sched.add_request(make_req("late", 7, max_new_tokens=4))  # arrives before the result is processed
        sched.on_batch_done(b, [7] * len(b.reqs))
        lines += [e for e in sched.drain_events() if isinstance(e, PrefillBatchStats)]
    first = lines[0]
    # #new-token 64, #cached-token 0, #queue-req at log time = w + late = 2;
    # #pending-token = 50 + (200 - 64) = 186
    # (the reference fixes e at log time but not f; with no arrival in between f = 186 either way)
    assert (first.new_token, first.cached_token, first.queue_req) == (64, 0, 2)
    assert lines[1].pending_token == 50 + 7 + (200 - 128)
    assert [line.cached_token for line in lines[:3]] == [0, 0, 0]  # continuations log 0 cached


def test_new_token_is_raw_in_0_5_22_and_page_ceiled_in_0_5_10() -> None:
    from kvadmit.scheduler.events import PrefillBatchStats

    for version, expected in (("0.5.22", 100), ("0.5.10", 112)):
        sched = make_scheduler(max_total_tokens=4096, context_len=8192, page_size=16, sglang_version=version)
        sched.add_request(make_req("a", 100, max_new_tokens=4))
        step(sched)
        line = next(e for e in sched.drain_events() if isinstance(e, PrefillBatchStats))
        assert line.new_token == expected, version


def test_batch_is_full_clears_when_a_running_request_leaves() -> None:
    # As in the no-retry test, q3 waits behind batch_is_full; r0 stops on EOS after 6 outputs.
    # The decode pass that drops r0 clears the flag; the next pass admits q3:
    # 10000 - (kv of q1, q2 ~ 2 x 16) - 2 x (2999 - 5) x ~0.7 reserved ~ 5775 > 3011.
    from kvadmit.config import ServerArgs
    from kvadmit.scheduler.scheduler import Scheduler

    sched = Scheduler(ServerArgs(max_total_tokens=10000), context_len=100000, eos_token_ids=frozenset({9}))
    sched.add_request(make_req("r0", 10, max_new_tokens=3000))
    b = sched.next_batch()
    sched.on_batch_done(b, [7])
    for i in range(1, 4):
        sched.add_request(make_req(f"q{i}", 10, max_new_tokens=3000))
    kinds = []
    for _n in range(12):
        b = sched.next_batch()
        kinds.append((b.kind, tuple(q.rid for q in b.reqs)))
        toks = [9 if (q.rid == "r0" and len(q.output_ids) == 5) else 7 for q in b.reqs]
        sched.on_batch_done(b, toks)
    assert kinds[0] == ("prefill", ("q1", "q2"))
    # decodes with r0 until it samples EOS as its 6th output, one decode without it, then q3
    i = kinds.index(("prefill", ("q3",)))
    assert kinds[i - 1] == ("decode", ("q1", "q2")) and all(k[0] == "decode" for k in kinds[1:i])


def test_no_decay_when_the_batch_empties_and_no_reset_while_a_request_waits() -> None:
    # pool 1000: a (100 + 5, ignore_eos) runs; b (100 + 850) needs 951 and waits while a holds 101+.
    # a decodes 4 times (4 decays) and finishes; the pass that drops it neither decays (batch empty)
    # nor resets (b waits); b is admitted with ratio 0.7 - 4 x 0.602/600.
    sched = make_scheduler(max_total_tokens=1000, context_len=100000)
    sched.add_request(make_req("a", 100, max_new_tokens=5, ignore_eos=True))
    sched.add_request(make_req("b", 100, max_new_tokens=850, ignore_eos=True))
    for _ in range(20):
        b, _ = step(sched)
        if b.kind == "prefill" and [q.rid for q in b.reqs] == ["b"]:
            assert sched.ratio.current == pytest.approx(0.7 - 4 * 0.602 / 600, abs=1e-12)
            return
    raise AssertionError("b never admitted")
