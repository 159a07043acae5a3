"""--enable-mixed-chunk (docs/sglang-rules.md A.5): a prefill batch carries the running requests' decode rows.
Expected values are the rules' arithmetic by hand."""

from __future__ import annotations

from kvadmit.bench.workload import WorkloadSpec
from kvadmit.config import ServerArgs
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.request import Req, SamplingLimits
from kvadmit.scheduler.scheduler import Scheduler
from kvadmit.sim.run import SimConfig, simulate

TEXT = 7


def _req(rid: str, prompt: int, max_new: int, first: int) -> Req:
    return Req(rid, list(range(first, first + prompt)), SamplingLimits(requested_max_new_tokens=max_new))


def _a_running_then_b(mixed: bool) -> tuple[Scheduler, Req, Req]:
    args = ServerArgs(max_total_tokens=1000, chunked_prefill_size=64, enable_mixed_chunk=mixed,
                      disable_overlap_schedule=True)  # fmt: skip
    sched = Scheduler(args)
    a, b = _req("a", 10, 50, 100), _req("b", 64, 5, 1000)
    sched.add_request(a)
    prefill = sched.next_batch()
    assert prefill is not None
    sched.on_batch_done(prefill, [TEXT])
    sched.add_request(b)
    return sched, a, b


def test_the_running_requests_decode_rows_ride_in_the_prefill_and_take_one_budget_token_each() -> None:
    # One running request: the chunk budget is 64 − 1 = 63, so b's 64-token prompt is cut at 63, and a's
    # decode row joins the batch with a slot of its own (10 + 1). The running batch is empty until the next
    # pass merges a back; no ratio decay (a mixed step is not a decode pass).
    sched, a, b = _a_running_then_b(mixed=True)
    ratio = sched.ratio.current
    batch = sched.next_batch()
    assert batch is not None and batch.kind == "prefill" and batch.reqs == [b, a] and batch.decoding == [a]
    assert b.extend_input_len == 63 and sched.chunked_req is b and len(a.kv) == 11
    assert sched.running.reqs == [] and sched.ratio.current == ratio
    sched.on_batch_done(batch, [TEXT, TEXT])
    assert a.output_ids == [TEXT, TEXT] and b.output_ids == []
    # The next pass: b's last token (64 − 63 = 1) and a's decode row again; a is back in the running batch
    # first (the merge), then leaves it for the batch.
    again = sched.next_batch()
    assert (
        again is not None and again.reqs == [b, a] and b.extend_input_len == 1 and sched.chunked_req is None
    )
    sched.on_batch_done(again, [TEXT, TEXT])
    assert b.output_ids == [TEXT] and a.output_ids == [TEXT] * 3
    decode = sched.next_batch()
    assert decode is not None and decode.kind == "decode" and decode.reqs == [b, a]  # the prefill's first
    sched.check_invariants()


def test_without_mixed_chunks_the_prefill_has_the_whole_budget_and_decode_waits() -> None:
    sched, a, b = _a_running_then_b(mixed=False)
    batch = sched.next_batch()
    assert batch is not None and batch.reqs == [b] and batch.decoding is None and b.extend_input_len == 64
    assert sched.running.reqs == [a]


def test_simulate_with_mixed_chunks_ends_every_request_at_its_length_under_both_loops() -> None:
    for overlap in (True, False):
        cfg = SimConfig(
            args=ServerArgs(max_total_tokens=6000, chunked_prefill_size=128, enable_mixed_chunk=True,
                            disable_overlap_schedule=not overlap),
            workload=WorkloadSpec(num_prompts=100, input_len=300, output_len=200, range_ratio=0.5,
                                  ignore_eos=False, seed=3),
            cost=CostModel.simple(decode_step_ms=10, prefill_tokens_per_s=20_000),
            max_concurrency=32,
        )  # fmt: skip
        result = simulate(cfg)
        result.scheduler.check_invariants()
        assert all(o.success for o in result.outcomes) and result.scheduler.is_fully_idle()
        assert all(len(o.itl) == o.output_len - 1 for o in result.outcomes), overlap


def _with_a_decoding(tokens: int, page_size: int, chunk: int, a_prompt: int) -> tuple[Scheduler, Req]:
    """Mixed chunks, radix cache off, the non-overlap loop: request a prefilled, so it decodes next."""
    args = ServerArgs(
        max_total_tokens=tokens, page_size=page_size, chunked_prefill_size=chunk,
        enable_mixed_chunk=True, disable_radix_cache=True, disable_overlap_schedule=True,
    )  # fmt: skip
    sched = Scheduler(args)
    a = _req("a", a_prompt, 50, 100)
    sched.add_request(a)
    prefill = sched.next_batch()
    assert prefill is not None
    sched.on_batch_done(prefill, [TEXT])
    return sched, a


def _paged_mixed_with_b(prompt: int, ignore_eos: bool) -> tuple[Scheduler, Req, Req]:
    # Page 16, chunks of 32, radix cache off; a runs, so its decode row leaves 32 − 1 = 31 of the chunk.
    sched, a = _with_a_decoding(1024, page_size=16, chunk=32, a_prompt=10)
    limits = SamplingLimits(requested_max_new_tokens=5, ignore_eos=ignore_eos)
    b = Req("b", list(range(1000, 1000 + prompt)), limits)
    sched.add_request(b)
    return sched, a, b


def test_ignore_eos_without_cache_fits_the_raw_prompt_into_an_unaligned_chunk_budget() -> None:
    # docs/sglang-rules.md §1.6 step 3: the ignore_eos path compares the raw prompt with what is left of
    # the chunk (28 ≤ 31: whole) ...
    sched, a, b = _paged_mixed_with_b(28, ignore_eos=True)
    batch = sched.next_batch()
    assert batch is not None and batch.reqs == [b, a]
    assert b.extend_input_len == 28 and sched.chunked_req is None


def test_ignore_eos_without_cache_cuts_its_first_chunk_at_the_whole_unaligned_budget() -> None:
    # ... and a longer prompt (40 > 31) takes all 31 tokens, not 31 // 16 × 16 = 16.
    sched, _, b = _paged_mixed_with_b(40, ignore_eos=True)
    batch = sched.next_batch()
    assert batch is not None and b.extend_input_len == 31 and sched.chunked_req is b


def test_the_normal_path_page_aligns_what_the_decode_rows_leave_of_the_chunk() -> None:
    # §1.4: the page-ceiled prompt (28 → 32) does not fit 31, so it is chunked to 31 // 16 × 16 = 16 tokens.
    sched, _, b = _paged_mixed_with_b(28, ignore_eos=False)
    batch = sched.next_batch()
    assert batch is not None and b.extend_input_len == 16 and sched.chunked_req is b


def test_a_chunk_off_the_page_grid_lets_an_ignore_eos_request_take_the_rest_as_a_second_chunk() -> None:
    # SGLang's corner (docs/sglang-rules.md §1.6): page 2, chunks of 8, one decode row, so 7 left. A
    # normal 7-token prompt (ceiled 8 > 7) is cut to 6, leaving 1; the ignore_eos prompt without a cache
    # after it (4 > 1) takes that 1 token as a first chunk and becomes the chunked request. b is no longer
    # tracked: it runs on as if its prefill were done, its last prompt token never computed.
    sched, a = _with_a_decoding(1000, page_size=2, chunk=8, a_prompt=3)
    b = _req("b", 7, 5, 1000)
    c = Req("c", list(range(2000, 2004)), SamplingLimits(requested_max_new_tokens=5, ignore_eos=True))
    sched.add_request(b)
    sched.add_request(c)
    batch = sched.next_batch()
    assert batch is not None and batch.reqs == [b, c, a]
    assert b.extend_input_len == 6 and c.extend_input_len == 1 and sched.chunked_req is c
    sched.on_batch_done(batch, [TEXT, TEXT, TEXT])
    assert b.output_ids == [TEXT] and len(b.kv) == 6  # sampled as prefilled; prompt token 7 has no KV
