"""Where a decode step's tokens may stop a request (results.py's _stop_positions): every position whose
token is a stop id of some request; with the executor's filler hint (a token id, the positions whose token
is not it: the simulated executor's decode steps), only the hinted positions are looked at, unless the
filler itself is a stop id."""

from __future__ import annotations

from kvadmit.config import ServerArgs
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.executor.simulated import EOS_TOKEN_ID, TEXT_TOKEN_ID, SimulatedExecutor
from kvadmit.request import Req
from kvadmit.scheduler.scheduler import Scheduler
from kvadmit.scheduler.types import ScheduledBatch

TOKENS = [5, 2, 5, 7, 2]


def _scheduler(stop_ids: frozenset[int]) -> Scheduler:
    s = Scheduler(ServerArgs(max_total_tokens=1_000))
    s._stop_token_union = stop_ids
    return s


def test_without_a_hint_every_stop_token_is_found() -> None:
    assert sorted(_scheduler(frozenset({2, 7}))._stop_positions(TOKENS)) == [1, 3, 4]


def test_with_a_hint_only_the_hinted_positions_are_looked_at() -> None:
    s = _scheduler(frozenset({2, 7}))
    assert sorted(s._stop_positions(TOKENS, (5, [4, 1, 3]))) == [1, 3, 4]
    assert s._stop_positions(TOKENS, (5, [3])) == [3]  # trusted: the others are the filler
    assert s._stop_positions(TOKENS, (5, [])) == []


def test_a_filler_that_is_a_stop_id_means_a_full_scan() -> None:
    assert sorted(_scheduler(frozenset({2, 7}))._stop_positions(TOKENS, (2, [0]))) == [1, 3, 4]


def test_the_simulated_executor_names_its_eos_positions() -> None:
    reqs = [Req(rid=f"r{i}", origin_input_ids=[1, 2]) for i in range(4)]
    executor = SimulatedExecutor(CostModel.simple(decode_step_ms=20.0, prefill_tokens_per_s=1e4), {})
    executor._due[0] = [(reqs[2], 0), (reqs[0], 0)]  # EOS due in the first decode step for r2 and r0
    result = executor.run(ScheduledBatch(kind="decode", reqs=reqs))
    assert result.next_token_ids == [EOS_TOKEN_ID, TEXT_TOKEN_ID, EOS_TOKEN_ID, TEXT_TOKEN_ID]
    assert result.filler == (TEXT_TOKEN_ID, [2, 0])
