"""The third batch of real logs the doctor had not seen (tests/data/logs 54–62), with the numbers a reader
works out by hand from their lines, and the rules they taught, on lines of our own (batches 1 and 2:
test_doctor_unseen_logs.py).

Expected values are hand arithmetic on the quoted lines, not read back from the doctor."""

from __future__ import annotations

from pathlib import Path

from doctor_helpers import run, run_lines
from kvadmit.doctor.parse import GPU_OOM, KV_ALLOC, KV_ALLOC_DETAIL, RETRACT, LineParser
from kvadmit.scheduler.errors import out_of_memory_message

# -- the logs ------------------------------------------------------------------------------------------


def test_54_a_queue_beside_a_two_thirds_full_pool_is_an_idle_pool() -> None:
    d = run("54")
    n = d.lead.numbers
    assert d.verdict == "idle-pool-with-queue" and n["cause"] == "max-new-tokens"
    # Waiting: the prefill's 2 queued beside 16 running (at least a tenth) and the decodes' 3 and 4 beside 23
    # and 22; not the decode's 2 beside 24 (under a tenth: arrivals between passes).
    assert (n["waiting_samples"], n["max_queue"], n["usage_peak_waiting"]) == (3, 4, 0.66)


def test_55_a_collectors_stamp_before_sglangs_reads_through() -> None:
    d = run("55")
    assert d.verdict == "healthy-queue" and d.inputs[0].unknown == 0  # the /metrics access line included
    assert d.inputs[0].span_s == 10  # 16:44:27 to the end of 16:44:36 (01:44:27 to 01:44:36 the same)


def test_56_a_compose_prefix_and_whole_prompts_up_to_the_default_prefill_budget() -> None:
    n = run("56").lead.numbers
    # 3 prompts of 5,000: a fourth would make 20,000, at least the default 16,384 --max-prefill-tokens.
    assert (n["budget"], n["prefills_at_budget"], n["queue_first"], n["queue_last"]) == (16384, 2, 40, 56)


def test_57_the_first_decode_line_after_an_idle_gap_is_no_collapse() -> None:
    d = run("57")
    # 84.20 then 3.17 tokens/s with one request running: the line after a 12 s pause averages over it, and
    # the next one is back at 81.97.
    assert d.verdict == "healthy-queue"
    assert not any(f.verdict == "throughput-collapse" for f in d.findings)
    assert d.inputs[0].span_s == 24  # 18:33:18 to the end of 18:33:41


def test_58_lines_with_no_prefix_at_all_are_one_long_prompt_in_chunks() -> None:
    d = run("58")
    n = d.lead.numbers
    assert d.lead.kind == "prefill-bound-burst" and n["budget"] == 2048
    assert (n["prefills_at_budget"], n["queue_first"], n["queue_last"]) == (3, 2, 2)
    # 3 prefill lines and 4 access lines read; the 4 `Receive: obj=` request dumps are not.
    assert (d.inputs[0].recognised, d.inputs[0].unknown) == (7, 4)


def test_59_a_trailing_field_of_a_port_reads_through() -> None:
    d = run("59")
    assert d.verdict == "healthy-queue" and (d.inputs[0].recognised, d.inputs[0].unknown) == (9, 0)


def test_60_a_full_pool_in_lines_cut_before_the_queue_is_healthy_and_says_the_queue_is_unknown() -> None:
    d = run("60")
    n = d.lead.numbers
    assert d.verdict == "healthy-queue" and n["queue_known"] is False
    assert (n["usage_min"], n["usage_max"]) == (0.96, 0.96)
    assert "no queue size" in d.lead.title


def test_61_the_old_decode_allocation_failure_is_an_oom_abort_with_its_numbers() -> None:
    d = run("61")
    n = d.lead.numbers
    assert d.verdict == "oom-abort" and n["kv_alloc_failures"] == 1
    assert (n["kv_alloc_asked"], n["kv_alloc_free"]) == (148, 2048)
    # 148 ≤ 2,048 free: only pages (or draft slots) the check did not count explain the failure.
    assert any("148 ≤ 2,048" in line for line in d.lead.explanation)


def test_62_start_up_lines_alone_are_not_enough_but_are_quoted() -> None:
    d = run("62")
    assert d.verdict == "other" and "5 start-up lines" in d.lead.title
    assert [q.line for q in d.lead.evidence] == [7]  # the first max_total_num_tokens line (TP4)
    assert any("201,681" in line for line in d.lead.explanation)


# -- the parser ----------------------------------------------------------------------------------------


def test_every_release_wording_of_the_kv_allocation_failure_is_read() -> None:
    p = LineParser()
    for line, phase in (
        ("RuntimeError: Decode out of memory. Try to lower your batch size.", "decode"),
        ("[2025-01-01 10:00:00 TP0] Prefill out of memory. Try to lower your batch size.", "prefill"),
        ("RuntimeError: Out of memory. Try to lower your batch size.", ""),
    ):
        rec = p.parse(line)
        assert rec is not None and rec.kind == KV_ALLOC and rec.fields["phase"] == phase, line
    asked = p.parse("Try to allocate 148 tokens.")
    free_04 = p.parse("Avaliable tokens: 2048")  # sic, as 0.4 printed it
    free_05 = p.parse("Available full tokens: 64 (full_available_size=60 + full_evictable_size_=4)")
    assert asked is not None and asked.kind == KV_ALLOC_DETAIL and asked.fields["asked"] == 148
    assert free_04 is not None and free_04.fields["free"] == 2048
    assert free_05 is not None and free_05.fields["free"] == 64


def test_retraction_and_gpu_out_of_memory_keep_their_own_kinds() -> None:
    p = LineParser()
    retract = p.parse(
        "[2025-03-07 21:49:33 TP13] Decode out of memory happened. #retracted_reqs: 1, "
        "#new_token_ratio: 0.1474 -> 0.1845"
    )
    gpu = p.parse("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.86 GiB.")
    assert retract is not None and retract.kind == RETRACT
    assert gpu is not None and gpu.kind == GPU_OOM


# -- the rules, on lines of our own --------------------------------------------------------------------


def _decode(sec: int, running: int, usage: float, queued: int | None = 0) -> str:
    queue = "" if queued is None else f", #queue-req: {queued}"
    return (
        f"[2026-01-01 10:00:{sec:02d}] Decode batch, #running-req: {running}, #token: {int(usage * 10000)}, "
        f"token usage: {usage:.2f}, gen throughput (token/s): 400.00{queue}"
    )


def test_the_simulators_own_allocation_crash_is_an_oom_abort(tmp_path: Path) -> None:
    # SGLang 0.5.22's words, as kvadmit's scheduler raises them: 300 tokens asked for, 40 + 20 free.
    crash = out_of_memory_message(300, 40, 20, 1).split("\n")
    d = run_lines(tmp_path, [_decode(0, 8, 0.95), _decode(1, 8, 0.99), *crash])
    n = d.lead.numbers
    assert d.verdict == "oom-abort" and (n["kv_alloc_asked"], n["kv_alloc_free"]) == (300, 60)
    # More asked for than was free: a plain shortfall, no page arithmetic to blame.
    assert not any("≤" in line for line in d.lead.explanation)


def test_a_pool_full_on_every_line_without_a_queue_field_is_healthy(tmp_path: Path) -> None:
    d = run_lines(tmp_path, [_decode(i, 30, u, None) for i, u in enumerate((0.93, 0.95, 0.97))])
    assert d.verdict == "healthy-queue" and (d.lead.numbers["usage_min"], d.lead.numbers["usage_max"]) == (
        0.93,
        0.97,
    )


def test_a_pool_not_full_on_every_line_without_a_queue_field_is_not_enough(tmp_path: Path) -> None:
    # 0.60 on one line: requests could be held back beside an idle pool, and no line says whether they are.
    d = run_lines(tmp_path, [_decode(i, 30, u, None) for i, u in enumerate((0.95, 0.60, 0.97))])
    assert d.verdict == "other" and "no queue size" in d.lead.title


def test_a_full_pool_without_a_queue_field_that_retracts_is_judged_by_its_retractions(tmp_path: Path) -> None:
    lines = [_decode(i, 30, 0.98, None) for i in range(3)]
    lines.append(
        "[2026-01-01 10:00:03] KV cache pool is full. Retract requests. #retracted_reqs: 1, "
        "#new_token_ratio: 0.0980 -> 0.3000"
    )
    d = run_lines(tmp_path, lines)
    assert d.verdict == "retraction-occasional"
    assert not any("no queue size" in f.title and f.verdict == "healthy-queue" for f in d.findings)
