"""The reconstruction's inferences from lines of our own (issue 21), each with the number its rule gives:
the decode-log-interval from #token growth, the conservativeness from the ratio's floor, the server_args
line, the arrival rate over whole seconds, prompts less re-admissions, the output spread from the
inspection paradox (lengths.py), and the replay check's allowance for chance."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvadmit.costmodel.costmodel import DecodeCost
from kvadmit.doctor.arrivals import (
    arrival_rate,
)
from kvadmit.doctor.inferred import Inferred
from kvadmit.doctor.lengths import OutputLengths
from kvadmit.doctor.observed import observe_lines
from kvadmit.doctor.prove import _info_row, _retraction_row
from kvadmit.doctor.reconstruct import _loop_note
from kvadmit.doctor.reconstruct_server import (
    infer_conservativeness,
    infer_decode_log_interval,
    infer_overlap,
)
from kvadmit.doctor.reconstruct_workload import (
    infer_lengths,
    infer_prompt,
    infer_prompt_spread,
    infer_spread,
    prompt_cap_from_retractions,
)
from kvadmit.doctor.resimulate import warmup_seconds
from kvadmit.doctor.whatif import Outcome, Scenario, Stats
from kvadmit.doctor.whatif_report import _vs, within_chance


def decode(t: int, running: int, tokens: int, usage: float = 0.9, queue: int = 0) -> str:
    return (
        f"[2026-09-13 16:06:{t:02d}] Decode batch, #running-req: {running}, #token: {tokens}, token usage: "
        f"{usage:.2f}, cuda graph: False, gen throughput (token/s): 2000.00, #queue-req: {queue}"
    )


def prefill(t: int, seqs: int, new: int, cached: int = 0) -> str:
    return (
        f"[2026-09-13 16:06:{t:02d}] Prefill batch, #new-seq: {seqs}, #new-token: {new}, #cached-token: "
        f"{cached}, token usage: 0.50, #running-req: 3, #queue-req: 0"
    )


def retract(t: int, gained: int, old: float, new: float) -> str:
    return (
        f"[2026-09-13 16:06:{t:02d}] KV cache pool is full. Retract requests. #retracted_reqs: 1, "
        f"#new_tokens_gained: {gained}, #new_token_ratio: {old:.4f} -> {new:.4f}"
    )


def test_the_decode_log_interval_is_how_much_token_grew_per_running_request() -> None:
    # 66 running: 82,002 → 84,642 is 2,640 = 40 × 66 (log 04, 16:06:05 → 16:06:06); 48: 85,585 → 87,505 is
    # 1,920 = 40 × 48. A prefill between two lines (16:06:08) spoils that pair.
    lines = [decode(5, 66, 82002), decode(6, 66, 84642), prefill(7, 1, 500), decode(8, 66, 87282),
             decode(16, 48, 85585), decode(17, 48, 87505)]  # fmt: skip
    got = infer_decode_log_interval(observe_lines(lines))
    assert (got.value, got.confidence) == (40, "exact")
    assert "2 of 2 pairs" in got.how
    # Interval 10: 32 running grow by 320.
    got = infer_decode_log_interval(observe_lines([decode(1, 32, 1000), decode(2, 32, 1320)]))
    assert got.value == 10
    # 20 pairs give 40 × 35 = 1,400; one odd pair grows by 1,225 = 35 × 35. 20 of 21 agree (over 95%):
    # still exact. With a second odd pair, 20 of 22 (91%): an estimate.
    good = [decode(1 + i, 35, 10_000 + 1_400 * i) for i in range(21)]
    odd = [prefill(29, 1, 100), decode(30, 35, 10_000), decode(31, 35, 11_225)]
    got = infer_decode_log_interval(observe_lines(good + odd))
    assert (got.value, got.confidence) == (40, "exact") and "20 of 21 pairs" in got.how
    more = [prefill(39, 1, 100), decode(40, 35, 10_000), decode(41, 35, 11_225)]
    got = infer_decode_log_interval(observe_lines(good + odd + more))
    assert (got.value, got.confidence) == (40, "estimate") and "20 of 22 pairs" in got.how
    # No two back-to-back lines with the same count: SGLang's default, as a guess.
    got = infer_decode_log_interval(observe_lines([decode(1, 32, 1000), decode(2, 31, 1200)]))
    assert (got.value, got.confidence) == (40, "guess")


@pytest.mark.parametrize(("old", "conservativeness"), [(0.0980, 1.0), (0.1274, 1.3), (0.0686, 0.7)])
def test_the_conservativeness_is_the_ratio_floor_over_0_098(old: float, conservativeness: float) -> None:
    # The floor is min(0.7 × c, 1) × 0.14: 0.098 at 1.0, 0.1274 at 1.3, 0.0686 at 0.7.
    got = infer_conservativeness(observe_lines([decode(1, 10, 5000), retract(2, 600, old, 0.35)]))
    assert got.value == pytest.approx(conservativeness)
    assert got.confidence == "estimate"


def test_a_ratio_above_any_floor_tells_no_conservativeness() -> None:
    got = infer_conservativeness(observe_lines([decode(1, 10, 5000), retract(2, 600, 0.3397, 0.35)]))
    assert (got.value, got.confidence) == (1.0, "guess")


def test_the_server_args_line_gives_the_flags_and_the_loop() -> None:
    line = (
        "[2026-09-13 16:00:00] server_args=ServerArgs(model_path='Qwen/Qwen3-4B', schedule_policy='fcfs', "
        "schedule_conservativeness=1.3, decode_log_interval=10, disable_overlap_schedule=True, page_size=1)"
    )
    obs = observe_lines([line, decode(1, 32, 1000), decode(2, 32, 1640)])  # 640 = 20 × 32: not used
    assert infer_decode_log_interval(obs).value == 10
    assert infer_conservativeness(obs).value == 1.3 and infer_conservativeness(obs).confidence == "exact"
    overlap = infer_overlap(obs)
    assert overlap.value is False and overlap.confidence == "exact"
    assert "one step at a time" in _loop_note(overlap)
    silent = infer_overlap(observe_lines([decode(1, 32, 1000)]))
    assert silent.value is None
    assert _loop_note(silent).startswith("loop: not shown in the log")


def test_the_arrival_rate_counts_the_whole_seconds_between_the_first_and_last() -> None:
    # Arrivals in seconds 10 to 15: the 8 in seconds 11 to 14 (4 whole seconds) give 2 a second; the
    # partial first and last seconds (3 and 1 arrivals) do not count.
    times = [10.2, 10.5, 10.9, 11.1, 11.6, 12.3, 12.8, 13.4, 13.9, 14.2, 14.7, 15.1]
    rate, how = arrival_rate(times, 6.0, 1.0)
    assert rate == pytest.approx(2.0)
    assert "8 arrivals in the 4 s" in how
    # Sub-second stamps: n arrivals span n − 1 gaps.
    rate, _ = arrival_rate([0.0, 0.5, 1.0, 1.5], 2.0, 0.0)
    assert rate == pytest.approx(3 / 1.5)


def test_prompts_leave_out_what_a_retracted_request_prefills_again() -> None:
    # Three 100-token prompts; one is retracted holding 150 tokens (its prompt and 50 outputs) and comes
    # back as a 150-token prefill: (300 + 150 − 150) ÷ (4 − 1) = 100.
    lines = [prefill(1, 3, 300), decode(2, 3, 450), retract(3, 150, 0.098, 0.4), prefill(4, 1, 150)]
    got = infer_prompt(observe_lines(lines))
    assert got is not None and got.value == pytest.approx(100.0)


LOG_04 = Path(__file__).parent / "data" / "logs" / "04-sglang-q2-qwen3-4b-retraction-burst.log"


def test_log_04s_prompt_is_at_most_what_a_retraction_freed_less_what_it_had_decoded() -> None:
    # Log 04 has no Prefill line and #running-req only falls (67 → 41), so every request running at a
    # retraction was running at the first Decode line and has decoded 40 tokens per Decode line since.
    # The 14th Decode line and the retraction right after it:
    #   [2026-09-13 16:06:17] Decode batch, #running-req: 48, #token: 87505, token usage: 1.00, ...
    #   [2026-09-13 16:06:17] KV cache pool is full. Retract requests. #retracted_reqs: 1,
    #       #new_tokens_gained: 1005, #new_token_ratio: 0.4113 -> 0.5096
    # 14 Decode lines (16:06:04 … 16:06:17) span 13 × 40 = 520 steps: 1,005 − 520 = 485. The other
    # retractions give more: the first, 646 after 4 Decode lines, 646 − 3 × 40 = 526; 1,064 after the
    # same 14, 544; 1,153 after 16, 1,153 − 600 = 553; 1,371 after 21, 1,371 − 800 = 571.
    lines = LOG_04.read_text().splitlines()
    assert any("#new_tokens_gained: 1005, #new_token_ratio: 0.4113 -> 0.5096" in line for line in lines)
    cap = prompt_cap_from_retractions(observe_lines(lines), 40)
    assert cap is not None and cap[0] == 485.0
    assert "1,005 tokens" in cap[1] and "13 × 40 = 520" in cap[1]
    # Up to the first retraction only (16:06:04 … 16:06:07, 4 Decode lines): 646 − 3 × 40 = 526.
    first = lines[: next(i for i, line in enumerate(lines) if "#new_tokens_gained: 646" in line) + 1]
    cap = prompt_cap_from_retractions(observe_lines(first), 40)
    assert cap is not None and cap[0] == 526.0
    # The reconstruction takes it: 2 × 1,681 − 1,978 = 1,384, capped by 485 (was 646, the smallest
    # #new_tokens_gained alone; the log's source says 387).
    prompt, _ = infer_lengths(observe_lines(lines), 40, None)
    assert prompt.value == 485.0 and prompt.confidence == "guess"


def test_the_decoded_steps_do_not_bound_the_prompt_once_something_was_admitted() -> None:
    # Three Decode lines, 10 running, then a retraction freeing 900: 900 − 2 × 40 = 820.
    base = [decode(1, 10, 5000), decode(2, 10, 5400), decode(3, 10, 5800)]
    cap = prompt_cap_from_retractions(observe_lines([*base, retract(3, 900, 0.1, 0.4)]), 40)
    assert cap is not None and cap[0] == 820.0
    # With interval 10 the same lines give 900 − 2 × 10 = 880.
    cap = prompt_cap_from_retractions(observe_lines([*base, retract(3, 900, 0.1, 0.4)]), 10)
    assert cap is not None and cap[0] == 880.0
    # A Prefill line before it: the retracted request may be the one just admitted, nothing decoded.
    lines = [*base[:2], prefill(2, 1, 300), base[2], retract(3, 900, 0.1, 0.4)]
    assert prompt_cap_from_retractions(observe_lines(lines), 40) is None
    # #running-req rises (10 → 11) with no Prefill line shown: an admission outside the excerpt.
    lines = [decode(1, 10, 5000), decode(2, 11, 5400), decode(3, 11, 5840), retract(3, 900, 0.1, 0.4)]
    assert prompt_cap_from_retractions(observe_lines(lines), 40) is None
    # A retraction before any Decode line: nothing known to have been decoded.
    assert prompt_cap_from_retractions(observe_lines([retract(1, 900, 0.1, 0.4), *base]), 40) is None
    # One before an admission counts, one after it does not, however small: 900 − 40 = 860.
    lines = [*base[:2], retract(2, 900, 0.1, 0.4), prefill(3, 1, 300), base[2], retract(3, 200, 0.1, 0.4)]
    cap = prompt_cap_from_retractions(observe_lines(lines), 40)
    assert cap is not None and cap[0] == 860.0
    # Freed no more than it had decoded (a shared prefix): no bound, rather than a prompt under 1.
    assert prompt_cap_from_retractions(observe_lines([*base, retract(3, 80, 0.1, 0.4)]), 40) is None


def test_the_output_spread_is_twice_the_held_output_over_the_mean_less_one() -> None:
    # Outputs uniform on [0, 200] (mean 100): a running request holds E[X²] ÷ (2 E[X]) = (100² + 200²/12)
    # ÷ 200 = 66.67 of them, so the Decode lines show 100 + 66.67 per request with 100-token prompts:
    # CV² = 2 × 66.67 ÷ 100 − 1 = 1/3.
    obs = observe_lines([decode(1, 30, 5000), decode(2, 30, 5000)])
    got = infer_spread(obs, Inferred(100.0, "", "estimate"), Inferred(100.0, "", "estimate"))
    assert got.value == pytest.approx(1 / 3, abs=1e-3)
    # All as long (mean age half the length): 100 + 50 per request, CV² 0.
    obs = observe_lines([decode(1, 30, 4500)])
    got = infer_spread(obs, Inferred(100.0, "", "estimate"), Inferred(100.0, "", "estimate"))
    assert got.value == pytest.approx(0.0)


def test_the_prompts_spread_is_read_off_the_lines_that_admit_one_request() -> None:
    # 20 lines of one request each, prompts 100 and 300 in turn: mean 200, variance 100² = 10,000, CV²
    # 10,000 ÷ 200² = 0.25. A line of two requests says nothing of either; after a retraction a line may be
    # a re-admission (prompt and output again): the 1,000 is left out.
    alone = [prefill(1 + i, 1, 100 if i % 2 else 250, 0 if i % 2 else 50) for i in range(20)]
    lines = [*alone, prefill(30, 2, 2_000), decode(31, 20, 9_000), retract(32, 900, 0.098, 0.3),
             prefill(33, 1, 1_000)]  # fmt: skip
    got = infer_prompt_spread(observe_lines(lines))
    assert got.value == pytest.approx(0.25) and got.confidence == "estimate"
    assert "20 Prefill lines" in got.how and "before the first retraction" in got.how
    # 19 lines do not tell: every prompt as long as the mean, a guess.
    got = infer_prompt_spread(observe_lines(alone[:19]))
    assert (got.value, got.confidence) == (0.0, "guess")


def test_output_lengths_keep_their_mean_and_spread() -> None:
    same = OutputLengths(100.0, 0.0, 1000)
    assert same.spread(10, seed=1) == [100] * 10
    uniform = OutputLengths(100.0, 1 / 3, 1000)  # uniform on [0, 200]
    assert uniform.quantile(0.25) == 50 and uniform.p99() == 198
    lens = uniform.spread(1000, seed=1)
    assert sum(lens) / len(lens) == pytest.approx(100.0, rel=0.01)
    # Each block of 256 requests holds the quantiles evenly: its mean is the mean within a token (a shuffle
    # of all 1,000 gives the first 256 a mean off by 200 ÷ √12 ÷ √256 ≈ 3.6 tokens, one sd, by chance).
    for first in (0, 256, 512):
        assert sum(lens[first : first + 256]) / 256 == pytest.approx(100.0, abs=1.0)
    assert lens[:256] != sorted(lens[:256])  # shuffled within the block
    assert sum((x - 100) ** 2 for x in lens) / len(lens) / 100**2 == pytest.approx(1 / 3, rel=0.02)
    capped = OutputLengths(100.0, 1 / 3, 150)  # the cap at 150 cuts a quarter: the rest is scaled up
    lens = capped.spread(1000, seed=1)
    assert max(lens) == 150 and sum(lens) / len(lens) == pytest.approx(100.0, rel=0.01)
    wide = OutputLengths(100.0, 1.0, 100_000)  # exponential: p99 = 100 × ln 100
    assert wide.p99() == pytest.approx(460.5, abs=1)


def test_a_running_request_is_as_long_as_the_lengths_beyond_its_progress() -> None:
    uniform = OutputLengths(100.0, 1 / 3, 1000)  # uniform on [0, 200]
    # Caught at 150 tokens: its length is uniform on (150, 200], mean 175; caught at 0, any length.
    late = uniform.beyond([150] * 400, seed=3)
    assert min(late) > 150 and sum(late) / 400 == pytest.approx(175.0, abs=1.0)
    early = uniform.beyond([0] * 400, seed=3)
    assert sum(early) / 400 == pytest.approx(100.0, abs=1.0)
    # Past the longest length there is nothing beyond: one more token.
    assert uniform.beyond([250], seed=3) == [251]


def test_a_figure_the_log_shows_as_nothing_is_compared_in_its_own_units() -> None:
    # 37 against 40 is 3 ÷ 37 = 8% apart; 0.0 against 15.2 is no percentage at all (it printed 10^15%).
    assert _info_row("queue length (mean)", 37.0, 40.0).closeness == "8% apart"
    assert _info_row("queue length (mean)", 0.0, 15.2).closeness == "15.2 apart"


def test_the_running_requests_are_sent_as_long_before_the_window_as_their_steps_took() -> None:
    # 10 ms + 1 ms a request + 0.01 ms a token held. Progress 2 and 1, prompts 100: two steps before the
    # window only the first runs, holding its prompt (1 request, 100 tokens: 12.00 ms); one step before
    # both run (2 requests, 101 + 100 tokens: 14.01 ms). So the one with 1 token is sent 14.01 ms before
    # the window, the one with 2 tokens 26.01 ms, the one with none at it.
    decode = DecodeCost(base_ms=10.0, per_request_ms=1.0, per_kv_token_ms=0.01)
    got = warmup_seconds(decode, 100, [2, 1, 0])
    assert got == pytest.approx([0.02601, 0.01401, 0.0])


def test_a_what_if_whose_retractions_differ_from_today_by_chance_says_so() -> None:
    # 13 against 11 in the same window: |13 − 11| = 2 < 2 √24 ≈ 9.8, within chance; 40 against 10:
    # 30 > 2 √50 ≈ 14.1, a real change.
    def outcome(retracted: int) -> Outcome:
        return Outcome(Scenario("x", "user"), "retraction-storm", _stats(retracted), None, None, None, 0)

    today = outcome(13)
    assert _vs(outcome(11), today, "retractions_per_min") == "11 (-15%, within chance)"
    assert _vs(outcome(40), outcome(10), "retractions_per_min") == "40 (+300%)"
    assert not within_chance(5, 5)


def _stats(retracted: int, span_s: float = 60.0) -> Stats:
    return Stats(60.0 * retracted / span_s, None, None, None, [], [], [], retracted)


@pytest.mark.parametrize(
    ("log", "replay", "ok"),
    [(16, 26, True), (3, 9, True), (3, 0, True), (12, 0, False), (10, 40, False), (1, 0, True)],
)
def test_the_replay_check_allows_for_chance_in_few_retractions(log: int, replay: int, ok: bool) -> None:
    # Within a factor of 2, or |a − b| < 2 √(a + b): 3 against 9 differ by 6 < 6.93; 12 against 0 by
    # 12 > 6.93; 10 against 40 by 30 > 14.1 (× 4); 16 against 26 is × 1.63.
    assert _retraction_row(_stats(log), _stats(replay)).ok is ok
