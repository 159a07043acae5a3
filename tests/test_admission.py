"""Admission, rule by rule (docs/sglang-rules.md §1), on snapshots built into real scheduler state.

Every expected number is worked out from the rules in the comment beside it.
"""

from __future__ import annotations

import pytest

from helpers import admit, r, w


def test_a_4096_pool_admits_five_256_plus_512_requests_and_the_sixth_waits() -> None:
    # Each needs 256 + 512 + 1 page = 769 < what remains; each is charged 769.
    # After five: 4096 − 5 × 769 = 251 remain, and the sixth needs 769.
    ans = admit({"max_total_tokens": 4096}, [w(f"q{i}", 256, 512, ignore_eos=True) for i in range(8)])
    assert ans["admitted"] == ["q0", "q1", "q2", "q3", "q4"]
    assert ans["verdict"] == "NO_TOKEN"
    assert ans["stopped_at"] == "q5"
    assert ans["rem_total_tokens"] == 251
    assert ans["cur_rem_tokens"] == 4096 - 5 * 257
    assert "needs 769 tokens" in ans["explanation"][5] and "only 251 remain" in ans["explanation"][5]


def test_the_reference_ignore_eos_example_leaves_325_then_minus_77() -> None:
    # Pool 1000, 300 used by two running 100+50 requests (max_new 300), ratio 0.5, cache disabled:
    # rem_total = 700 − (250 × 1.0 + 250 × 0.5) = 325. Candidates 100-in/100-new (ignore_eos):
    # the first leaves 325 − 201 = 124 (CONTINUE), the second is admitted and leaves −77 (NO_TOKEN).
    ans = admit(
        {"max_total_tokens": 1000, "disable_radix_cache": True},
        [w(f"c{i}", 100, 100, ignore_eos=True) for i in range(3)],
        new_token_ratio=0.5,
        running=[r("a", 100, 50, 300, ignore_eos=True), r("b", 100, 50, 300)],
    )
    assert ans["admitted"] == ["c0", "c1"]
    assert ans["verdict"] == "NO_TOKEN" and ans["stopped_at"] == "c1"
    assert ans["rem_total_tokens"] == -77.0
    assert ans["cur_rem_tokens"] == 700 - 2 * 101


def test_running_requests_hold_back_remaining_output_times_the_ratio() -> None:
    # One running normal request: 100 + 50 held, remaining 250 × 0.5 = 125 reserved.
    # rem_total = (1000 − 150) − 125 = 725.0; the candidate (100 + 100 + 1) leaves 524.0.
    ans = admit(
        {"max_total_tokens": 1000}, [w("c", 100, 100)], new_token_ratio=0.5, running=[r("a", 100, 50, 300)]
    )
    assert ans["admitted"] == ["c"]
    assert ans["rem_total_tokens"] == 725.0 - 201


@pytest.mark.parametrize(("version", "expected"), [("0.5.22", 850 - 250 - 201), ("0.5.10", 850 - 125 - 201)])
def test_a_running_ignore_eos_request_reserves_in_full_only_since_0_5_22(
    version: str, expected: float
) -> None:
    ans = admit(
        {"max_total_tokens": 1000, "sglang_version": version},
        [w("c", 100, 100)],
        new_token_ratio=0.5,
        running=[r("a", 100, 50, 300, ignore_eos=True)],
    )
    assert ans["rem_total_tokens"] == expected


def test_the_running_reservation_is_clipped_at_4096() -> None:
    # Remaining 10,000 is clipped to 4096: 4096 × 0.7 = 2867.2 held back of 20,000 − 100.
    ans = admit(
        {"max_total_tokens": 20000},
        [w("c", 100, 10000)],
        new_token_ratio=0.7,
        running=[r("a", 100, 0, 10000)],
    )
    # The candidate's own output is clipped too: it is charged 100 + 1 + 4096 = 4197.
    assert ans["rem_total_tokens"] == pytest.approx(19900 - 2867.2 - 4197)


def test_the_fit_is_strictly_less_than_and_counts_one_page() -> None:
    # 100 + 898 + 1 = 999 < 1000 fits; 100 + 899 + 1 = 1000 does not.
    assert admit({"max_total_tokens": 1000}, [w("c", 100, 898)])["admitted"] == ["c"]
    refused = admit({"max_total_tokens": 1000}, [w("c", 100, 899)])
    assert refused["admitted"] == [] and refused["stopped_at"] == "c" and refused["rem_total_tokens"] == 1000


def test_classic_releases_have_no_page_term_in_the_fit() -> None:
    # 0.5.10: 100 + 899 = 999 < 1000 fits.
    ans = admit({"max_total_tokens": 1000, "sglang_version": "0.5.10"}, [w("c", 100, 899)])
    assert ans["admitted"] == ["c"]


def test_a_cached_prefix_is_locked_before_the_fit_test() -> None:
    # Pool 1000: 600 free + 400 evictable (the candidate's cached 300 + 100 other). The candidate
    # (400 prompt, 300 cached) needs 100 + 700 + 1 = 801: it would fit 1000, but locking its prefix
    # leaves 700, so it waits. With max_new 500 it needs 601 < 700 and is admitted.
    waits = admit({"max_total_tokens": 1000}, [w("c", 400, 700, cached_prefix_len=300)], evictable_tokens=400)
    assert waits["admitted"] == [] and waits["verdict"] == "NO_TOKEN"
    assert waits["prefix_lens"] == {"c": 300}
    fits = admit({"max_total_tokens": 1000}, [w("c", 400, 500, cached_prefix_len=300)], evictable_tokens=400)
    assert fits["admitted"] == ["c"] and fits["extend_lens"] == {"c": 100}
    assert fits["rem_total_tokens"] == 700 - 601


def test_the_match_leaves_at_least_one_token_to_compute_and_is_page_aligned() -> None:
    full = w("c", 300, 10, cached_prefix_len=300)
    assert admit({"max_total_tokens": 1000}, [full], evictable_tokens=300)["prefix_lens"] == {"c": 299}
    paged = admit({"max_total_tokens": 1024, "page_size": 16}, [full], evictable_tokens=300)
    assert paged["prefix_lens"] == {"c": 288}  # 299 rounded down to a multiple of 16


def test_a_retracted_request_matches_its_whole_cached_prompt() -> None:
    # Prompt 300 cached, 20 outputs: the cap is 320 − 1 = 319, so all 300 match; 20 are recomputed.
    ans = admit(
        {"max_total_tokens": 1000},
        [w("c", 300, 100, cached_prefix_len=300, output_len=20)],
        evictable_tokens=300,
    )
    assert ans["prefix_lens"] == {"c": 300} and ans["extend_lens"] == {"c": 20}


def test_fit_uses_the_remaining_output_but_the_charge_is_the_full_max_new_tokens() -> None:
    # A retracted request: 100 prompt + 50 outputs, max_new 200. Fit: 150 + 150 + 1 = 301.
    # Charge: 150 + 1 + 200 = 351, so 1000 − 351 = 649 remain.
    ans = admit({"max_total_tokens": 1000}, [w("c", 100, 200, output_len=50)])
    assert ans["admitted"] == ["c"] and ans["rem_total_tokens"] == 649
    # It fits with exactly 302 left (301 < 302) although 351 will be charged.
    tight = admit({"max_total_tokens": 302}, [w("c", 100, 200, output_len=50)])
    assert tight["admitted"] == ["c"] and tight["rem_total_tokens"] == 302 - 351


def test_a_long_prompt_is_chunked_but_must_fit_whole_to_start() -> None:
    # 10,000-token prompt, chunk 4096: needs 10,000 + 100 + 1 < 20,000; the first chunk is 4096 and
    # reserves no output: charged 4096 + 1. The chunk budget is then spent (OTHER).
    ans = admit(
        {"max_total_tokens": 20000, "chunked_prefill_size": 4096}, [w("big", 10000, 100), w("s", 10, 10)]
    )
    assert ans["admitted"] == ["big"] and ans["chunked"] == "big"
    assert ans["extend_lens"] == {"big": 4096}
    assert ans["rem_total_tokens"] == 20000 - 4097
    assert ans["rem_chunk_tokens"] == 0 and ans["verdict"] == "OTHER"
    # In an 8,000-token pool the whole prompt cannot fit, so it is not even chunked.
    small = admit({"max_total_tokens": 8000, "chunked_prefill_size": 4096}, [w("big", 10000, 100)])
    assert small["admitted"] == [] and small["verdict"] == "NO_TOKEN"


def test_a_chunk_ends_on_a_page_boundary() -> None:
    ans = admit({"max_total_tokens": 4096, "chunked_prefill_size": 100, "page_size": 16}, [w("c", 1000, 10)])
    assert ans["extend_lens"] == {"c": 96}


def test_the_first_request_may_exceed_max_prefill_tokens_but_not_a_second() -> None:
    off = {"max_total_tokens": 10000, "chunked_prefill_size": -1, "max_prefill_tokens": 1000}
    first = admit(off, [w("a", 1500, 10), w("b", 10, 10)])
    assert first["admitted"] == ["a"] and first["verdict"] == "OTHER" and first["rem_input_tokens"] == -500
    second = admit(off, [w("a", 600, 10), w("b", 600, 10)])
    # After a, 400 input tokens remain and b's 600 ≥ 400: OTHER, b not admitted.
    assert second["admitted"] == ["a"] and second["stopped_at"] == "b" and second["verdict"] == "OTHER"


def test_with_chunking_on_0_5_22_has_no_per_request_input_check() -> None:
    on = {"max_total_tokens": 10000, "max_prefill_tokens": 1000}
    ans = admit(on, [w("a", 600, 10), w("b", 600, 10)])
    # b is admitted whole (600 ≤ chunk budget), then the input budget is spent: 1000 − 1200 = −200.
    assert ans["admitted"] == ["a", "b"] and ans["rem_input_tokens"] == -200 and ans["verdict"] == "OTHER"
    classic = admit({**on, "sglang_version": "0.5.10"}, [w("a", 600, 10), w("b", 600, 10)])
    assert classic["admitted"] == ["a"] and classic["verdict"] == "OTHER"


def test_head_of_line_blocking_stops_at_the_first_request_that_does_not_fit() -> None:
    ans = admit({"max_total_tokens": 1000}, [w("big", 500, 600), w("small", 10, 10)])
    assert ans["admitted"] == [] and ans["stopped_at"] == "big"
    assert "small" not in ans["prefix_lens"]


def test_the_request_cap_limits_admissions_per_pass() -> None:
    # max_running_requests 3 with 2 running: one more.
    ans = admit(
        {"max_total_tokens": 10000, "max_running_requests": 3},
        [w(f"c{i}", 10, 10) for i in range(3)],
        running=[r("a", 10, 1, 10), r("b", 10, 1, 10)],
    )
    assert ans["admitted"] == ["c0"] and ans["verdict"] == "CONTINUE" and ans["stopped_at"] is None


def test_prefill_max_requests_caps_a_pass() -> None:
    ans = admit(
        {"max_total_tokens": 10000, "prefill_max_requests": 2}, [w(f"c{i}", 10, 10) for i in range(3)]
    )
    assert ans["admitted"] == ["c0", "c1"] and ans["verdict"] == "OTHER" and ans["stopped_at"] == "c2"


def test_the_ignore_eos_check_needs_room_for_every_request_to_finish() -> None:
    # Cache disabled, pool 1000, nothing running. A 100-token prompt with 900 max_new: its prompt fits,
    # but the simulation needs (1000 − 101) − 900 × 1 > 1 free when it finishes: 899 − 900 ≤ 1 → NO_TOKEN.
    ans = admit({"max_total_tokens": 1000, "disable_radix_cache": True}, [w("c", 100, 900, ignore_eos=True)])
    assert ans["admitted"] == [] and ans["verdict"] == "NO_TOKEN"
    # With 897 max_new: 899 − 897 = 2 > 1 passes (test_rules_detail shows a case the normal fit would refuse).
    ok = admit({"max_total_tokens": 1000, "disable_radix_cache": True}, [w("c", 100, 897, ignore_eos=True)])
    assert ok["admitted"] == ["c"]
