"""The output budget: what a request is granted on arrival (docs/sglang-rules.md §1.9), computed in one
place, and the client's ask left as it was sent. Expected numbers are worked out by hand from the rule:
granted = max(0, min(ask or 2^30, SGLANG_MAX_NEW_TOKENS_LIMIT, max_req_len − input − 1,
pool − ceil_page(input) − page − 1)), max_req_len = min(context − 1, pool − 1)."""

from __future__ import annotations

from helpers import make_scheduler
from kvadmit.memory.pool import ceil_page, pages_for
from kvadmit.request import Req, SamplingLimits
from kvadmit.scheduler.output_budget import grant_max_new_tokens, max_request_len, pool_room_for_output


def test_the_page_ceiling() -> None:
    assert ceil_page(100, 16) == 112  # 6 pages hold 96, the 7th holds the last 4
    assert ceil_page(112, 16) == 112 and ceil_page(113, 16) == 128
    assert ceil_page(0, 16) == 0 and ceil_page(5, 1) == 5
    assert pages_for(100, 16) == 7 and pages_for(96, 16) == 6 and pages_for(0, 16) == 0


def test_the_pool_cap_leaves_the_prompt_in_pages_and_one_page() -> None:
    # pool 4096, page 16, prompt 100 → 112 in pages: 4096 − 112 − 16 − 1 = 3967
    assert pool_room_for_output(100, 4096, 16) == 3967
    # prompt 4090 → 4096 in pages: 4096 − 4096 − 16 − 1 = −17 (the prompt alone fills the pool)
    assert pool_room_for_output(4090, 4096, 16) == -17


def test_the_longest_request_is_one_short_of_the_context_and_the_pool() -> None:
    assert max_request_len(1000, 20_000) == 999
    assert max_request_len(100_000, 4096) == 4095


def grant(
    requested: int | None, input_len: int, context: int, pool: int, page: int, limit: int | None = None
) -> int:
    max_req_len = max_request_len(context, pool)
    return grant_max_new_tokens(
        requested, input_len, max_req_len=max_req_len, pool_size=pool, page_size=page, limit=limit
    )


def test_the_pool_caps_a_large_ask() -> None:
    # max_req_len 4095: 4095 − 100 − 1 = 3994 by length; the pool allows 3967 (above)
    assert grant(5000, 100, context=100_000, pool=4096, page=16) == 3967
    assert grant(None, 100, context=100_000, pool=4096, page=16) == 3967  # no ask: up to what fits


def test_the_context_caps_a_large_ask() -> None:
    # context 1000: max_req_len 999, 999 − 100 − 1 = 898; the pool (page 1) would allow 20000 − 100 − 2
    assert grant(5000, 100, context=1000, pool=20_000, page=1) == 898
    assert grant(None, 100, context=1000, pool=20_000, page=1) == 898


def test_a_small_ask_is_granted_as_asked() -> None:
    assert grant(200, 100, context=100_000, pool=4096, page=16) == 200
    assert grant(0, 100, context=100_000, pool=4096, page=16) == 0


def test_the_limit_knob_caps_the_ask_first() -> None:
    assert grant(5000, 100, context=100_000, pool=4096, page=16, limit=150) == 150
    assert grant(None, 100, context=100_000, pool=4096, page=16, limit=150) == 150
    assert grant(100, 100, context=100_000, pool=4096, page=16, limit=150) == 100  # below the limit
    assert grant(None, 100, context=100_000, pool=4096, page=16, limit=10_000) == 3967  # the pool is lower


def test_the_grant_is_never_negative() -> None:
    # context 1000: max_req_len 999; a 999-token prompt leaves 999 − 999 − 1 = −1 → 0
    assert grant(50, 999, context=1000, pool=20_000, page=1) == 0


def test_add_request_grants_on_the_request_and_leaves_the_ask_alone() -> None:
    sched = make_scheduler(max_total_tokens=1000, context_len=100_000)
    sched.eos_token_ids = frozenset({0})
    asked = SamplingLimits(5000, ignore_eos=False, min_new_tokens=6000, stop_token_ids=frozenset({7}))
    req = Req("a", list(range(1, 101)), asked)
    assert sched.add_request(req)
    # max_req_len 999: 999 − 100 − 1 = 898; the pool (page 1): 1000 − 100 − 1 − 1 = 898
    assert req.max_new_tokens == 898 and req.remaining_new_tokens == 898
    assert req.min_new_tokens == 898  # clipped to the grant
    assert req.stop_token_ids == frozenset({0, 7})  # the model's EOS joins the client's stop ids
    assert asked == SamplingLimits(5000, ignore_eos=False, min_new_tokens=6000, stop_token_ids=frozenset({7}))
    assert req.sampling is asked


def test_requests_sharing_one_ask_are_each_granted_from_it() -> None:
    sched = make_scheduler(max_total_tokens=1000, context_len=100_000)
    asked = SamplingLimits(None)
    short, long = Req("s", list(range(1, 101)), asked), Req("l", list(range(1, 501)), asked)
    assert sched.add_request(short) and sched.add_request(long)
    assert short.max_new_tokens == 898  # as above
    assert long.max_new_tokens == 498  # 999 − 500 − 1 = 1000 − 500 − 1 − 1 = 498
    assert asked.requested_max_new_tokens is None


def test_a_request_not_yet_queued_has_the_budget_it_asked_for() -> None:
    req = Req("a", [1, 2, 3], SamplingLimits(40, min_new_tokens=5, stop_token_ids=frozenset({9})))
    req.output_ids = [4] * 15
    assert (req.max_new_tokens, req.min_new_tokens, req.stop_token_ids) == (40, 5, frozenset({9}))
    assert req.remaining_new_tokens == 25
    assert Req("b", [1], SamplingLimits(None)).max_new_tokens == 1 << 30  # unset: up to the context


def test_the_clients_ask_is_checked_in_one_place() -> None:
    """None means up to the context; a whole number at or above the API's minimum passes (an integral
    float as its integer); anything else names the field as the client wrote it."""
    import pytest

    from kvadmit.scheduler.output_budget import OutputBudgetError, check_requested_max_new_tokens

    assert check_requested_max_new_tokens(None) is None
    assert check_requested_max_new_tokens(0) == 0  # the native API allows an empty generation
    assert check_requested_max_new_tokens(5.0) == 5
    assert check_requested_max_new_tokens(1, "max_tokens", minimum=1) == 1
    cases = [
        ((-1,), "max_new_tokens must be ≥ 0, got -1"),
        ((-1.0,), "max_new_tokens must be ≥ 0, got -1"),  # a float slipped past the native check before
        ((0, "max_tokens", 1), "max_tokens must be at least 1, got 0"),
        ((2.5,), "max_new_tokens must be an integer, got 2.5"),
        ((True,), "max_new_tokens must be an integer, got True"),
        (("12",), "max_new_tokens must be an integer, got '12'"),
        ((float("inf"),), "max_new_tokens must be an integer, got inf"),
    ]
    for args, message in cases:
        with pytest.raises(OutputBudgetError) as err:
            check_requested_max_new_tokens(*args)
        assert str(err.value) == message
