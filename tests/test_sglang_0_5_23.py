"""SGLang 0.5.23's three scheduling changes (docs/sglang-rules.md A.2), each against 0.5.22 on the same
state. Expected values are the rules' arithmetic by hand."""

from __future__ import annotations

from kvadmit.config import ServerArgs
from kvadmit.request import Req, SamplingLimits
from kvadmit.scheduler.scheduler import Scheduler

TEXT, EOS = 7, 2


def _req(rid: str, prompt: int, max_new: int, first: int = 100) -> Req:
    return Req(rid, list(range(first, first + prompt)), SamplingLimits(requested_max_new_tokens=max_new))


def _two_running_then_one_stops(version: str) -> tuple[Scheduler, Req]:
    """Request cap 2: a and b run; a stops on EOS in a decode step; c waits."""
    sched = Scheduler(ServerArgs(max_total_tokens=1000, max_running_requests=2, sglang_version=version,
                                 disable_overlap_schedule=True), eos_token_ids=frozenset({EOS}))  # fmt: skip
    a, b, c = _req("a", 10, 50, 100), _req("b", 10, 50, 200), _req("c", 10, 50, 300)
    for r in (a, b):
        sched.add_request(r)
    prefill = sched.next_batch()
    assert prefill is not None and prefill.reqs == [a, b]
    sched.on_batch_done(prefill, [TEXT, TEXT])
    decode = sched.next_batch()
    assert decode is not None and decode.kind == "decode"
    sched.add_request(c)
    sched.on_batch_done(decode, [EOS, TEXT])  # a ends
    return sched, c


def test_0_5_22_keeps_a_finished_request_in_the_running_count_until_the_next_decode_pass() -> None:
    # running_bs is still 2 (a finished, not yet dropped): min(2 − 2, rows) = 0 allocatable, so the pass
    # decodes b (dropping a) and c waits one more step.
    sched, c = _two_running_then_one_stops("0.5.22")
    batch = sched.next_batch()
    assert batch is not None and batch.kind == "decode" and [r.rid for r in batch.reqs] == ["b"]
    assert c in sched.waiting


def test_0_5_23_drops_it_at_the_start_of_every_pass_so_the_next_request_is_admitted_at_once() -> None:
    sched, c = _two_running_then_one_stops("0.5.23")
    batch = sched.next_batch()
    assert batch is not None and batch.kind == "prefill" and batch.reqs == [c]


def _chunk_in_progress(version: str, chunk: int, max_running: int, priority: bool = False) -> Scheduler:
    """A 100-token prompt in chunks of `chunk` tokens has had its first chunk; two short requests wait."""
    args = ServerArgs(max_total_tokens=2000, chunked_prefill_size=chunk, max_running_requests=max_running,
                      sglang_version=version, disable_overlap_schedule=True,
                      enable_priority_scheduling=priority)  # fmt: skip
    sched = Scheduler(args)
    sched.add_request(_req("long", 100, 5, 100))
    first = sched.next_batch()
    assert first is not None and first.chunked is not None
    sched.on_batch_done(first, [TEXT])
    for i, rid in enumerate(("w1", "w2")):
        sched.add_request(_req(rid, 8, 5, 1000 + 100 * i))
    return sched


def test_0_5_22_looks_at_the_next_candidate_after_a_chunk_spent_the_pass_budget() -> None:
    # Chunks of 32: the second chunk takes all 32 of the pass's chunk budget; 0.5.22 still prepares w1 and
    # asks add_one_req, which answers OTHER (no chunk budget left).
    sched = _chunk_in_progress("0.5.22", chunk=32, max_running=8)
    record = sched.run_admission()
    assert [r.rid for r in record.looked_at] == ["w1"] and record.stop_cause == "verdict"


def test_0_5_23_stops_before_the_first_candidate_when_the_chunk_spent_the_pass_budget() -> None:
    # The same state: the second chunk of 32 spends the 32-token chunk budget: nobody is looked at.
    sched = _chunk_in_progress("0.5.23", chunk=32, max_running=8)
    record = sched.run_admission()
    assert record.looked_at == [] and record.stop_cause == "budget_spent"


def test_0_5_23_counts_the_row_the_continuing_chunk_holds() -> None:
    # Request cap 2, chunks of 64: the final chunk (36 tokens) leaves 28 of the chunk budget. The chunk
    # holds a request row, so 1 row is free. 0.5.22: allocatable min(2 − 0, 1) = 1, and the chunk in the
    # batch reaches it: w1 waits. 0.5.23: min(2 − 0, 1 + 1) = 2: w1 joins the final chunk.
    old = _chunk_in_progress("0.5.22", chunk=64, max_running=2).run_admission()
    new = _chunk_in_progress("0.5.23", chunk=64, max_running=2).run_admission()
    assert old.adder is not None and new.adder is not None
    assert [r.rid for r in old.adder.can_run_list] == ["long"] and old.stop_cause == "request_cap"
    assert [r.rid for r in new.adder.can_run_list] == ["long", "w1"] and new.stop_cause == "request_cap"


def test_0_5_23_counts_the_chunks_row_under_priority_preemption_too() -> None:
    # The same pass with priority scheduling (preemption on): the cap is read again for each candidate,
    # with the same credit, min(2 − 0, 1 + 1) = 2, so w1 joins the final chunk here too; 0.5.22: 1.
    old = _chunk_in_progress("0.5.22", chunk=64, max_running=2, priority=True).run_admission()
    new = _chunk_in_progress("0.5.23", chunk=64, max_running=2, priority=True).run_admission()
    assert old.adder is not None and new.adder is not None
    assert [r.rid for r in old.adder.can_run_list] == ["long"] and old.stop_cause == "request_cap"
    assert [r.rid for r in new.adder.can_run_list] == ["long", "w1"] and new.stop_cause == "request_cap"
