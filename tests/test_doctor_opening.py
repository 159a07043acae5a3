"""The requests running when the window opens are all running in the replay (doctor/opening.py), sent as
long before it as their decode steps and the prefills between them took (resimulate.warmup_seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvadmit.costmodel.costmodel import DecodeCost, PrefillCost
from kvadmit.doctor import opening
from kvadmit.doctor.observed import read_observed
from kvadmit.doctor.reconstruct import reconstruct
from kvadmit.doctor.reservation import judge_reservation
from kvadmit.doctor.resimulate import run, running_progress, warmup_seconds

LOG_04 = Path(__file__).parent / "data" / "logs" / "04-sglang-q2-qwen3-4b-retraction-burst.log"


def test_the_progress_spreads_evenly_around_the_mean_from_its_floor() -> None:
    # 4 requests holding 100 on average: from nothing, 25, 75, 125, 175; from a floor of 0.25, over
    # [25, 175]: 25 + 37.5 × (k + ½) = 43.75, 81.25, 118.75, 156.25, rounded; the mean is 100 either way.
    assert running_progress(4, 100.0, 1_000) == [25, 75, 125, 175]
    assert running_progress(4, 100.0, 1_000, 0.25) == [44, 81, 119, 156]
    assert running_progress(4, 100.0, 150, 0.25) == [44, 81, 119, 149]  # under the budget of 150


def test_the_warm_up_counts_the_prefill_of_each_request_admitted_since() -> None:
    # 10 ms + 1 ms a request + 0.01 ms a token held a decode step; a prefill 2 ms + 100 tokens at 100,000
    # tokens/s = 3 ms. Progress 2, 1, 0, prompts 100: two steps before the window the first is admitted
    # (3 ms) and decodes alone (12.00 ms); one step before the second is admitted (3 ms) and both decode
    # (2 requests, 101 + 100 tokens: 14.01 ms). So 17.01 ms for the one with 1 token, 32.01 ms for the one
    # with 2 (without the prefills 14.01 and 26.01).
    decode = DecodeCost(base_ms=10.0, per_request_ms=1.0, per_kv_token_ms=0.01)
    prefill = PrefillCost(base_ms=2.0, tokens_per_s=100_000.0)
    assert warmup_seconds(decode, 100, [2, 1, 0], prefill) == pytest.approx([0.03201, 0.01701, 0.0])
    assert warmup_seconds(decode, 100, [2, 1, 0]) == pytest.approx([0.02601, 0.01401, 0.0])


def test_the_floor_is_the_lowest_with_which_none_of_them_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    class Start:
        running = 5

    class Rec:
        start = Start()

    waiting = {0.0: 3, 0.125: 1, 0.25: 0, 0.375: 0, 0.5: 0}
    monkeypatch.setattr(opening, "waiting_at_opening", lambda rec, floor: waiting[floor])
    assert opening.opening_floor(Rec()) == 0.25  # type: ignore[arg-type]
    monkeypatch.setattr(opening, "waiting_at_opening", lambda rec, floor: 2)
    assert opening.opening_floor(Rec()) == 0.0  # type: ignore[arg-type]  (none admits all: as before)
    Start.running = 1
    assert opening.opening_floor(Rec()) == 0.0  # type: ignore[arg-type]


def test_log_04s_replay_opens_with_the_67_running_and_9_waiting_the_log_shows() -> None:
    # The log's first line: "#running-req: 67, #token: 81316, token usage: 0.93, ... #queue-req: 9".
    obs = read_observed(str(LOG_04))
    rec = reconstruct(obs)
    judge_reservation(rec, obs, False)
    rec.progress_floor = opening.opening_floor(rec)
    first = run(rec, "today", {}).observed.decodes[0]
    assert (first.running, first.queue) == (67, 9)
    assert first.tokens == pytest.approx(81_316, rel=0.02)
