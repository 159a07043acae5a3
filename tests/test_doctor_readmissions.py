"""The Prefill lines that may re-admit a retracted request, told from the fcfs queue's order
(doctor/readmissions.py), and what that changes in the prompt and output means, from lines of our own."""

from __future__ import annotations

import pytest

from kvadmit.doctor.inferred import Inferred
from kvadmit.doctor.observed import observe_lines
from kvadmit.doctor.readmissions import track_readmissions
from kvadmit.doctor.reconstruct_workload import (
    infer_lengths,
    infer_prompt,
    infer_prompt_spread,
    unfreed_by_retraction,
)


def prefill(t: int, seqs: int, new: int, queue: int) -> str:
    return (
        f"[2026-09-13 16:06:{t:02d}] Prefill batch, #new-seq: {seqs}, #new-token: {new}, #cached-token: 0, "
        f"token usage: 0.50, #running-req: 3, #queue-req: {queue}"
    )


def decode(t: int, running: int, tokens: int, queue: int) -> str:
    return (
        f"[2026-09-13 16:06:{t:02d}] Decode batch, #running-req: {running}, #token: {tokens}, token usage: "
        f"0.90, cuda graph: False, gen throughput (token/s): 2000.00, #queue-req: {queue}"
    )


def retract(t: int, gained: int, count: int = 1) -> str:
    return (
        f"[2026-09-13 16:06:{t:02d}] KV cache pool is full. Retract requests. #retracted_reqs: {count}, "
        f"#new_tokens_gained: {gained}, #new_token_ratio: 0.0980 -> 0.4000"
    )


# Queue positions, counted from the first Prefill line (p: the positions a line admits):
#   1  2 admitted (100 + 100), 3 left: 5 had entered, p 0–1
#   2  a retraction (the victim held its 100-token prompt and 50 outputs; the cache kept the prompt, so
#      #new_tokens_gained is 50)
#   3  1 admitted (120), 4 left: 5 were waiting before it, 3 known, so 1 arrival and the retracted one
#      entered, at 5 or 6 (the arrival may have come first): the range [5, 7); p 2
#   4  2 admitted (130 + 130), 2 left: no arrival; p 3–4
#   5  1 admitted (150: the victim's prompt and outputs again), 1 left; p 5, in the range
#   6  1 admitted (90), 0 left; p 6, in the range too
# Lines 1, 3, 4 admit no retracted request: (200 + 120 + 260) ÷ 5 = 116. Lines 5 and 6 may: 240 tokens,
# 2 requests, one of them the retracted one.
STORMY = [
    prefill(1, 2, 200, 3), retract(2, 50), prefill(3, 1, 120, 4), decode(3, 5, 2_000, 9),
    prefill(4, 2, 260, 2), prefill(5, 1, 150, 1), prefill(6, 1, 90, 0),
]  # fmt: skip


def test_the_lines_after_a_retraction_split_by_queue_position() -> None:
    got = track_readmissions(observe_lines(STORMY))
    assert got is not None
    assert (got.clean_tokens, got.clean_seqs, got.clean_alone) == (580, 5, (120,))
    assert (got.suspect_tokens, got.suspect_seqs, got.readmitted) == (240, 2, 1)
    assert got.prompt_mean == 116.0
    # The re-admission prefilled 240 less one first-time prompt: 240 − 116 × (2 − 1) = 124 (its true 150
    # less the 90-token prompt's 26 short of the mean).
    assert got.readmitted_tokens(116.0) == 124.0


def test_the_prompt_leaves_out_the_lines_that_may_re_admit() -> None:
    obs = observe_lines(STORMY)
    got = infer_prompt(obs, track_readmissions(obs))
    assert got is not None and got.value == 116.0 and got.confidence == "estimate"
    assert "2 of 7 admissions may be re-admissions" in got.how and "(5 requests)" in got.how
    # Without the queue's order: (820 − 50) ÷ (7 − 1) = 128.33, the kept prompt counted as a prompt.
    old = infer_prompt(obs)
    assert old is not None and old.value == pytest.approx(770 / 6)
    # What the retracted request released from #token beyond #new_tokens_gained: 124 − 50 = 74.
    assert unfreed_by_retraction(obs, track_readmissions(obs), 116.0) == 74.0
    assert unfreed_by_retraction(obs, None, 116.0) == 0.0


def test_a_finish_frees_less_by_what_the_retracted_requests_held_beyond_the_gain() -> None:
    # 8 running at 2,000 tokens; one retracted (gained 50); 4 running at 990 after 40 steps. #token grew by
    # 40 × (8 + 4) ÷ 2 = 240 less the 50 gained, and fell by 1,010: 1,200 freed by the 8 − 4 − 1 = 3
    # finishes, 400 each.
    lines = [decode(1, 8, 2_000, 0), retract(2, 50), decode(3, 4, 990, 1)]
    prompt = Inferred(100.0, "", "estimate")
    _, output = infer_lengths(observe_lines(lines), 40, prompt)
    assert output.value == 300.0  # 400 − 100
    # Had the retracted request held 150 more than it gained (its prompt kept in the cache), the finishes
    # freed (1,200 − 150) ÷ 3 = 350 each: output 250.
    _, output = infer_lengths(observe_lines(lines), 40, prompt, unfreed=150.0)
    assert output.value == 250.0 and "less 150 tokens that retracted requests held" in output.how


def test_a_queue_it_cannot_follow_gives_no_split() -> None:
    # 3 waiting, the retracted one joins them, 2 admitted, 2 left: it follows (the retracted one at p 4,
    # never admitted; the 3 first-time prompts are 100 each).
    got = track_readmissions(observe_lines([prefill(1, 1, 100, 3), retract(2, 50), prefill(3, 2, 200, 2)]))
    assert got is not None and (got.clean_seqs, got.suspect_seqs, got.readmitted) == (3, 0, 0)
    assert got.prompt_mean == 100.0
    # The queue shrank by more than the line admitted (an abort, or a line missing): 3 waiting and the
    # retracted one, 1 admitted, 0 left.
    shrank = [prefill(1, 1, 100, 3), retract(2, 50), prefill(3, 1, 100, 0)]
    assert track_readmissions(observe_lines(shrank)) is None
    # No retraction: nothing to split.
    assert track_readmissions(observe_lines([prefill(1, 1, 100, 3), prefill(2, 1, 100, 2)])) is None
    # A policy other than fcfs serves the queue out of order.
    args = "[2026-09-13 16:06:00] server_args=ServerArgs(schedule_policy='lpm', decode_log_interval=40)"
    assert track_readmissions(observe_lines([args, *STORMY])) is None


def test_a_retraction_before_the_first_prefill_may_sit_anywhere_in_its_queue() -> None:
    # Retracted before the first Prefill line, which admits 1 of 3 (p 0) and leaves 2: the victim is one
    # of p 0–2, so all three lines are suspect and nothing is clean: no split.
    lines = [retract(1, 50), prefill(2, 1, 150, 2), prefill(3, 1, 100, 1), prefill(4, 1, 100, 0)]
    assert track_readmissions(observe_lines(lines)) is None
    # The first line admits p 0 of 4 (the retracted one is one of p 0–3), the second p 1–3 with one
    # arrival (p 4), the third p 4: that one is clean, 110.
    lines = [retract(1, 50), prefill(2, 1, 150, 3), prefill(3, 3, 300, 1), prefill(4, 1, 110, 0)]
    got = track_readmissions(observe_lines(lines))
    assert got is not None and (got.clean_tokens, got.clean_seqs, got.readmitted) == (110, 1, 1)


def test_retracted_requests_still_waiting_at_the_end_were_not_re_admitted() -> None:
    # Two retracted after the first line (2 of 4 admitted, 2 left); one arrival; they sit in [4, 7). The
    # next line admits p 2–3 (clean) and the last p 4 (suspect): of the range's 3 positions, 5 and 6
    # are never admitted, so at most min(2, 7 − 5) = 2 still wait: none re-admitted.
    lines = [prefill(1, 2, 200, 2), retract(2, 300, count=2), prefill(3, 2, 200, 3), prefill(4, 1, 100, 2)]
    got = track_readmissions(observe_lines(lines))
    assert got is not None and got.clean_seqs == 4 and got.suspect_seqs == 1 and got.readmitted == 0


def test_the_prompts_spread_reads_the_lines_after_a_retraction_that_admit_no_retracted_one() -> None:
    # 10 lines of one request each (prompts 100 and 300 in turn), a retraction, its re-admission (1,000:
    # the one queued request, the range [10, 11)), then 10 more of one first-time request each. Before the
    # first retraction only 10 lines show a prompt (20 tell): a guess of 0. In queue order 20 do: mean 200,
    # variance 100² = 10,000, CV² 10,000 ÷ 200² = 0.25; the 1,000 is left out.
    before = [prefill(1 + i, 1, 300 if i % 2 else 100, 0) for i in range(10)]
    after = [prefill(13 + i, 1, 300 if i % 2 else 100, 0) for i in range(10)]
    obs = observe_lines([*before, retract(11, 900), prefill(12, 1, 1_000, 0), *after])
    assert infer_prompt_spread(obs).value == 0.0
    got = infer_prompt_spread(obs, track_readmissions(obs))
    assert got.value == pytest.approx(0.25) and got.confidence == "estimate"
    assert "20 Prefill lines that admit one request and no retracted one" in got.how
