"""The real logs gathered after the doctor was tuned (tests/data/logs 31–53; 54–62 in
test_doctor_unseen_logs_batch3.py), with the numbers a reader works out by hand from their lines, and the
rules they taught, on lines of our own.

Expected values are hand arithmetic on the quoted lines, not read back from the doctor."""

from __future__ import annotations

from pathlib import Path

import pytest

from doctor_helpers import LOGS, run, run_lines
from kvadmit.doctor.observed import read_observed
from kvadmit.doctor.parse import HTTP, LineParser
from kvadmit.doctor.reconstruct import CannotReconstruct, reconstruct

# -- the logs ------------------------------------------------------------------------------------------


def test_35_a_fall_in_throughput_with_more_requests_running_is_a_collapse_without_its_retraction_line() -> (
    None
):
    d = run("35")
    n = d.lead.numbers
    assert d.verdict == "throughput-collapse" and n["retraction_seen"] is False
    # Before: 429.34, 429.52, 429.74 tokens/s over 4 running; the median per request is 429.52 / 4.
    assert n["per_request_before"] == pytest.approx(429.52 / 4)
    # After: the middle of the last three (37.04, 38.44, 22.24 over 6) is 37.04 / 6.
    assert n["per_request_after"] == pytest.approx(37.04 / 6)
    assert n["samples_after"] == 7
    assert "4 → 6" in d.lead.title
    assert any("1.00 → 0.92" in line for line in d.lead.explanation)
    # Time-only stamps after dated ones stay on that date: 03:51:44 to 03:52:41 is 57 s (58 with the last
    # whole second), not a jump back to midnight.
    assert d.inputs[0].span_s == pytest.approx(58)


def test_36_steady_prefills_of_a_hybrid_model_are_a_burst_and_the_mamba_pool_counts() -> None:
    d = run("36")
    n = d.lead.numbers
    assert d.lead.kind == "prefill-bound-burst"
    # 43008, 43264, 43008, 43904, 43008: all within 5% of the median 43008.
    assert n["budget"] == 43008 and n["prefills_at_budget"] == 5 == n["prefills_waiting"]
    assert (n["queue_first"], n["queue_last"]) == (97, 49)
    # Usage is the fullest pool: mamba 0.20 → 0.60 (full attention only 0.14 → 0.40).
    assert (n["usage_first"], n["usage_last"]) == (0.20, 0.60)


def test_37_time_only_stamps_and_cache_hit_rate_read_as_a_burst_at_the_chunk_budget() -> None:
    d = run("37")
    n = d.lead.numbers
    assert d.lead.kind == "prefill-bound-burst" and n["budget"] == 8192
    # The six prefills after the first (which had an empty queue) all took 8192.
    assert n["prefills_waiting"] == 6 == n["prefills_at_budget"]
    assert (n["queue_first"], n["queue_last"], n["usage_first"], n["usage_last"]) == (38, 18, 0.04, 0.77)


def test_39_one_long_prompt_in_chunks_is_prefill_bound_not_an_idle_pool() -> None:
    d = run("39")
    n = d.lead.numbers
    assert d.lead.kind == "prefill-bound-burst" and n["budget"] == 8192
    assert n["prefills_waiting"] == 5 == n["prefills_at_budget"]
    assert (n["queue_first"], n["queue_last"]) == (1, 2)  # the queue did not shrink: every pass was full
    assert not any(f.verdict == "idle-pool-with-queue" for f in d.findings)


def test_40_three_retractions_in_nineteen_seconds_across_ranks_are_a_storm() -> None:
    d = run("40")
    n = d.lead.numbers
    # 21:49:33 (3 ranks), 21:49:45 (8 ranks), 21:49:51 (1 rank, its line cut): 3 events, 12 lines.
    assert (n["events"], n["lines"]) == (3, 12)
    assert n["per_minute"] == pytest.approx(3 / 19 * 60)  # 21:49:33 to the end of 21:49:51


def test_42_a_burst_at_the_chunk_budget_drains_the_queue() -> None:
    n = run("42").lead.numbers
    assert (n["budget"], n["prefills_waiting"], n["queue_first"], n["queue_last"]) == (8192, 9, 114, 53)
    assert (n["usage_first"], n["usage_last"]) == (0.0, 0.24)


def test_52_whole_prompts_up_to_the_default_prefill_budget_are_prefill_bound_not_an_idle_pool() -> None:
    d = run("52")
    n = d.lead.numbers
    # 6 prompts of 15360 / 6 = 2,560: a seventh would make 17,920, at least the default 16,384 budget.
    assert d.lead.kind == "prefill-bound-burst" and n["budget"] == 16384
    assert n["prefills_waiting"] == 2 == n["prefills_at_budget"]
    assert (n["queue_first"], n["queue_last"], n["usage_first"], n["usage_last"]) == (238, 238, 0.01, 0.01)
    assert not any(f.verdict == "idle-pool-with-queue" for f in d.findings)


def test_53_chunk_budget_passes_while_arrivals_outrun_them() -> None:
    n = run("53").lead.numbers
    assert (n["budget"], n["prefills_at_budget"], n["queue_first"], n["queue_last"]) == (2048, 7, 30, 155)


def test_44_a_ray_actor_prefix_is_read_through() -> None:
    d = run("44")
    assert d.inputs[0].recognised == 7 and d.inputs[0].unknown == 0
    assert d.inputs[0].span_s == pytest.approx(2)  # 13:53:37 to the end of 13:53:38


def test_46_lines_cut_by_a_terminal_still_read_and_the_title_says_usage_is_unknown() -> None:
    d = run("46")
    assert (
        d.inputs[0].unknown == 0
    )  # the access lines end after "HTTP/1.1" with no status: still access lines
    assert "no token usage" in d.lead.title
    assert "pool is used up to the forecast" not in d.lead.title


def test_45_a_pool_whose_usage_reads_0_00_is_said_so_when_it_cannot_be_sized() -> None:
    # #token 4078 at "token usage: 0.00": the pool is over 4078 / 0.005 = 815,600 tokens, no more is known.
    with pytest.raises(CannotReconstruct, match=r"reads 0\.00"):
        reconstruct(read_observed(str(next(LOGS.glob("45-*.log")))))


# -- the parser ----------------------------------------------------------------------------------------


def test_a_time_of_day_alone_after_dated_lines_is_on_that_date_and_rolls_past_midnight() -> None:
    p = LineParser()
    dated = p.parse(
        "[2026-05-24 23:59:58 TP0] Decode batch, #running-req: 4, token usage: 0.50, #queue-req: 0"
    )
    assert dated is not None and dated.t is not None
    same_day = p.parse("[23:59:59] Decode batch, #running-req: 4, token usage: 0.50, #queue-req: 0")
    next_day = p.parse("[00:00:03] Decode batch, #running-req: 4, token usage: 0.50, #queue-req: 0")
    assert same_day is not None and next_day is not None
    assert same_day.t == dated.t + 1 and next_day.t == dated.t + 5


def test_a_time_of_day_alone_with_no_date_before_it_counts_from_midnight() -> None:
    rec = LineParser().parse("[04:40:55 TP0] Decode batch. #running-req: 2, token usage: 0.00, #queue-req: 0")
    assert rec is not None and rec.t == 4 * 3600 + 40 * 60 + 55


def test_the_fullest_of_full_swa_and_mamba_pools_is_the_usage() -> None:
    rec = LineParser().parse(
        "[2026-07-04 04:31:24 TP0] Prefill batch, #new-seq: 12, #new-token: 43008, #cached-token: 0, "
        "full token usage: 0.14, mamba usage: 0.20, #running-req: 1, #queue-req: 97"
    )
    assert rec is not None and rec.fields["token_usage"] == 0.20


def test_the_full_pools_token_count_stands_for_token_when_it_is_the_fullest() -> None:
    rec = LineParser().parse(
        "[2026-05-24 03:51:45 TP0] Decode batch, #running-req: 4, #full token: 2642688, full token usage: "
        "1.00, #swa token: 14592, swa token usage: 0.06, gen throughput (token/s): 429.52, #queue-req: 3"
    )
    assert rec is not None and rec.fields["num_used_tokens"] == 2642688 and rec.fields["token_usage"] == 1.0


def test_an_access_line_cut_before_its_status_is_an_access_line() -> None:
    rec = LineParser().parse(
        '[2026-05-28 02:59:59] INFO:     127.0.0.1:37664 - "POST /v1/completions HTTP/1.1"'
    )
    assert rec is not None and rec.kind == HTTP and rec.fields["status"] is None


# -- the rules, on lines of our own ---------------------------------------------------------------------


def _decode(sec: int, running: int, usage: float, tput: float, queued: int = 2) -> str:
    return (
        f"[2026-01-01 10:00:{sec:02d}] Decode batch, #running-req: {running}, #token: {int(usage * 10000)}, "
        f"token usage: {usage:.2f}, gen throughput (token/s): {tput:.2f}, #queue-req: {queued}"
    )


def test_a_fall_that_recovers_is_no_collapse(tmp_path: Path) -> None:
    lines = [_decode(0, 4, 0.90, 400), _decode(1, 4, 0.90, 400), _decode(2, 4, 0.90, 400)]
    lines += [_decode(3 + i, 4, 0.85, 100) for i in range(3)]  # a quarter for three lines
    lines += [_decode(6 + i, 4, 0.90, 400) for i in range(4)]  # and back
    d = run_lines(tmp_path, lines)
    assert not any(f.verdict == "throughput-collapse" for f in d.findings)


def test_a_batch_that_finishes_is_no_collapse(tmp_path: Path) -> None:
    # 8 running at 800 tokens/s, then 1 running at 90: total falls ninefold, per request it does not.
    lines = [_decode(i, 8, 0.50, 800, 0) for i in range(3)] + [
        _decode(3 + i, 1, 0.06, 90, 0) for i in range(5)
    ]
    d = run_lines(tmp_path, lines)
    assert not any(f.verdict == "throughput-collapse" for f in d.findings)


def test_a_fall_that_stays_with_as_many_running_is_a_collapse(tmp_path: Path) -> None:
    lines = [_decode(i, 4, 0.99, 400) for i in range(3)] + [_decode(3 + i, 4, 0.95, 40) for i in range(4)]
    d = run_lines(tmp_path, lines)
    assert d.verdict == "throughput-collapse"
    assert d.lead.numbers["per_request_before"] == pytest.approx(100.0)
    assert d.lead.numbers["per_request_after"] == pytest.approx(10.0)


def test_a_fall_while_prefill_passes_take_the_time_is_no_collapse(tmp_path: Path) -> None:
    # Decode tokens/s fall tenfold with as many running, but a prefill pass runs before every slow decode
    # line: the wall time went to prefill (decode starved by a prefill burst), not to a slower decode.
    lines = [_decode(i, 4, 0.50, 400, 50) for i in range(3)]
    for i in range(4):
        lines.append(_prefill(3 + 2 * i, 8192, 0.50, 4, 50))
        lines.append(_decode(4 + 2 * i, 4, 0.50, 40, 50))
    d = run_lines(tmp_path, lines)
    assert not any(f.verdict == "throughput-collapse" for f in d.findings)


def _prefill(sec: int, new_token: int, usage: float, running: int, queued: int, new_seq: int = 4) -> str:
    return (
        f"[2026-01-01 10:00:{sec:02d}] Prefill batch, #new-seq: {new_seq}, #new-token: {new_token}, "
        f"#cached-token: 0, token usage: {usage:.2f}, #running-req: {running}, #queue-req: {queued}"
    )


def test_steady_prefills_under_the_largest_default_budget_are_not_a_burst(tmp_path: Path) -> None:
    # 12,000 tokens a pass, no start-up line: SGLang's default --max-prefill-tokens (16,384) would allow
    # more, so the steady size is not shown to be a budget; admission may be what holds the queue.
    lines = [_prefill(i, 12000, 0.10 + 0.01 * i, 4 * i, 90 - 4 * i) for i in range(5)]
    d = run_lines(tmp_path, lines)
    assert not any(f.kind == "prefill-bound-burst" for f in d.findings)


def test_steady_large_prefills_below_a_budget_the_start_up_line_names_are_not_a_burst(tmp_path: Path) -> None:
    startup = (
        "[2026-01-01 09:59:59] max_total_num_tokens=900000, chunked_prefill_size=65536, "
        "max_prefill_tokens=65536"
    )
    lines = [startup] + [_prefill(i, 30000, 0.10 + 0.05 * i, 4 * i, 90 - 4 * i) for i in range(5)]
    d = run_lines(tmp_path, lines)
    assert not any(f.kind == "prefill-bound-burst" for f in d.findings)


def test_steady_large_prefills_that_leave_the_queue_as_it_was_are_not_a_burst(tmp_path: Path) -> None:
    # Steady 30,000-token passes, no start-up line, but the queue does not fall: not shown.
    lines = [_prefill(i, 30000, 0.10 + 0.05 * i, 4 * i, 90) for i in range(5)]
    d = run_lines(tmp_path, lines)
    assert not any(f.kind == "prefill-bound-burst" for f in d.findings)


def test_steady_large_prefills_that_drain_the_queue_are_a_burst(tmp_path: Path) -> None:
    lines = [_prefill(i, 30000 + 100 * (i % 2), 0.10 + 0.05 * i, 4 * i, 90 - 4 * i) for i in range(5)]
    d = run_lines(tmp_path, lines)
    assert d.lead.kind == "prefill-bound-burst"
    # 30000, 30100, 30000, 30100, 30000: the median is 30,000 and all five are within 5% of it.
    assert d.lead.numbers["budget"] == 30000 and d.lead.numbers["prefills_at_budget"] == 5


def test_whole_prompt_passes_well_under_the_prefill_budget_are_not_at_it(tmp_path: Path) -> None:
    # 6 prompts of 1,500 = 9,000: a seventh (10,500) fits the default 16,384, so the pass was not full.
    lines = [_prefill(i, 9000, 0.10, 10 + 6 * i, 200, new_seq=6) for i in range(2)]
    d = run_lines(tmp_path, lines)
    assert not any(f.kind == "prefill-bound-burst" for f in d.findings)


def test_two_full_passes_with_a_decode_between_are_not_enough(tmp_path: Path) -> None:
    # Two passes at the budget, but a decode line ran while requests waited: the three-pass rule applies.
    lines = [
        _prefill(0, 15360, 0.10, 10, 200),
        _decode(1, 16, 0.10, 500, 200),
        _prefill(2, 15360, 0.10, 16, 200),
    ]
    d = run_lines(tmp_path, lines)
    assert not any(f.kind == "prefill-bound-burst" for f in d.findings)
