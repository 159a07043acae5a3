"""Retraction before a decode step (docs/sglang-rules.md §3), on snapshots and in a running scheduler."""

from __future__ import annotations

from typing import Any

import pytest

from helpers import drain, make_req, make_scheduler, step
from kvadmit.capacity.answer import answer_decode
from kvadmit.capacity.snapshot import parse_snapshot
from kvadmit.config import SchedulerKnobs
from kvadmit.scheduler.events import Retraction
from kvadmit.scheduler.retraction import LAST_REQUEST_ABORT_MESSAGE


def decode(pool: int, running: list[dict[str, Any]], **server: Any) -> dict[str, Any]:
    snap = {
        "server": {"max_total_tokens": pool, **server},
        "check": "decode",
        "new_token_ratio": 0.098,
        "running": running,
    }
    return answer_decode(parse_snapshot(snap))


def r(rid: str, prompt: int, out: int, max_new: int = 400) -> dict[str, Any]:
    return {"rid": rid, "prompt_len": prompt, "output_len": out, "max_new_tokens": max_new}


FIVE = [r("r1", 300, 40), r("r2", 300, 35), r("r3", 200, 35), r("r4", 300, 30), r("r5", 300, 10)]
HELD = 340 + 335 + 235 + 330 + 310  # 1550


def test_no_retraction_while_every_request_gets_a_slot() -> None:
    ans = decode(HELD + 5, FIVE)
    assert ans["retract_called"] is False and ans["kept"] == ["r1", "r2", "r3", "r4", "r5"]
    assert ans["new_ratio"] is None


def test_fewest_outputs_go_first_and_the_ratio_becomes_220_over_1601() -> None:
    # Five need five slots, two are free: r5 (10 outputs) goes and frees 310.
    # The four left: (40 + 35 + 35 + 30 + 20 × 4) / (4 × 400 + 1) = 220/1601 = 0.137414.
    ans = decode(HELD + 2, FIVE)
    assert ans["retracted"] == ["r5"]
    assert ans["new_ratio"] == pytest.approx(220 / 1601)
    assert round(ans["new_ratio"], 6) == 0.137414
    assert ans["new_tokens_gained"] == 310
    # Survivors in keep-preference order: most outputs first, then shorter prompt (r3 before r2).
    assert ans["kept"] == ["r1", "r3", "r2", "r4"]
    assert ans["aborted"] is None


def test_on_equal_outputs_the_longest_prompt_goes_first() -> None:
    running = [r("short", 100, 5), r("long", 300, 5), r("mid", 200, 5)]
    ans = decode(100 + 300 + 200 + 15, running)  # no free slot at all
    assert ans["retracted"] == ["long"]
    assert ans["kept"] == ["short", "mid"]


def test_on_a_full_tie_the_later_request_goes_first() -> None:
    ans = decode(2 * 105, [r("a", 100, 5), r("b", 100, 5)])
    assert ans["retracted"] == ["b"] and ans["kept"] == ["a"]


def test_retraction_continues_until_the_rest_fit() -> None:
    # Page size 16 (in a snapshot each request holds exactly prompt + outputs): a request needs a new
    # page when it holds a multiple of 16. a holds 32, b 16, c 16: the step needs 48. Pool 75: 11 free.
    # Retract c (1 output): 27 free < 32 still needed; retract b (6 outputs): 43 free ≥ 16. a stays.
    running = [r("a", 22, 10), r("b", 10, 6), r("c", 15, 1)]
    ans = decode(75, running, page_size=16)
    assert ans["retracted"] == ["c", "b"] and ans["kept"] == ["a"]
    assert ans["new_tokens_gained"] == 32


def test_the_last_request_is_aborted_when_even_it_alone_does_not_fit() -> None:
    # Page size 16, pool 60: a holds 48 (needs a page of 16), b holds 1 (needs none); 11 free.
    # Retracting b frees 1: 12 < 16, and a is the last one: aborted. Nothing remains: ratio 0/1 = 0.
    ans = decode(60, [r("a", 38, 10), r("b", 1, 0)], page_size=16)
    assert ans["retracted"] == ["b"]
    assert ans["aborted"] == "a"
    assert ans["abort_message"] == LAST_REQUEST_ABORT_MESSAGE
    assert LAST_REQUEST_ABORT_MESSAGE == (
        "Out of memory even after retracting all other requests in the decode batch. "
        "Aborting the last request."
    )
    assert ans["kept"] == [] and ans["new_ratio"] == 0.0


def test_a_single_request_that_does_not_fit_is_aborted_without_retracting() -> None:
    ans = decode(60, [r("a", 38, 10)], page_size=16)
    assert ans["retracted"] == [] and ans["aborted"] == "a"


def test_releases_before_0_5_10_crash_instead_of_aborting() -> None:
    ans = decode(60, [r("a", 38, 10)], page_size=16, sglang_version="0.5.8")
    assert ans["abort_message"].startswith("ValueError: Out of memory even after retracting")
    ans = decode(60, [r("a", 38, 10)], page_size=16, sglang_version="0.5.6")
    assert ans["abort_message"].startswith("AssertionError: No space left for only one request")


def test_evictable_cache_is_sacrificed_before_any_running_request() -> None:
    snap = {
        "server": {"max_total_tokens": HELD + 5},
        "check": "decode",
        "evictable_tokens": 5,
        "running": FIVE,
    }
    ans = answer_decode(parse_snapshot(snap))
    assert ans["retract_called"] is False


def test_in_a_running_server_retraction_requeues_and_every_request_ends_once() -> None:
    # Four 100-token prompts with max_new 250 in a 600-token pool: q0 is charged 100 + 1 + 250 = 351,
    # leaving 249 < 351, so it runs alone at first; as the ratio decays more are let in, none stops
    # early (no EOS), so the pool fills and the scheduler retracts.
    sched = make_scheduler(max_total_tokens=600, context_len=4096)
    reqs = [make_req(f"q{i}", 100, max_new_tokens=250) for i in range(4)]
    for q in reqs:
        sched.add_request(q)
    retractions = []
    for _ in range(5000):
        batch, _ = step(sched)
        if batch is None:
            break
        for event in sched.drain_events():
            if isinstance(event, Retraction):
                # The decode batch right after it is the requests that stayed (each now one token on):
                # the new ratio is (Σ outputs + 20 × n) / (Σ max_new_tokens + 1) over them.
                outs = sum(len(q.output_ids) - 1 for q in batch.reqs)
                n = len(batch.reqs)
                assert event.new_ratio == min(1.0, (outs + 20 * n) / (250 * n + 1))
                retractions.append(event)
    assert retractions, "the pool must fill"
    assert all(q.finished_reason is not None for q in reqs)
    assert all(len(q.output_ids) == 250 for q in reqs)
    sched.cache.reset()
    assert sched.pool.available_size() == 600


def test_forced_retraction_every_third_batch_prints_testing_retraction() -> None:
    sched = make_scheduler(
        max_total_tokens=4096,
        context_len=4096,
        knobs=SchedulerKnobs(test_retract=True, test_retract_interval=3),
    )
    for i in range(3):
        sched.add_request(make_req(f"q{i}", 50, max_new_tokens=20))
    events = drain(sched)
    forced = [e for e in events if isinstance(e, Retraction)]
    assert forced and all(e.forced for e in forced)
    # Memory is fine, so exactly one victim each time: all three have the same outputs and prompt
    # length while they run together, so the full tie retracts the later one in batch order.
    assert all(len(e.rids) == 1 for e in forced)
