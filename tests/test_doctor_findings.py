"""The findings on situations the shared logs do not show, built line by line from the incidents the
mission document describes and SGLang's own wording: what each number means decides the verdict."""

from __future__ import annotations

from pathlib import Path

from kvadmit.doctor.diagnose import Inputs, diagnose
from kvadmit.doctor.model import Diagnosis
from kvadmit.observe import loglines


def run(tmp_path: Path, lines: list[str]) -> Diagnosis:
    path = tmp_path / "server.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return diagnose(Inputs(log=str(path)))


def decode(stamp: str, running: int, used: int, usage: float, tput: float, queued: int) -> str:
    return f"[{stamp}] " + loglines.DECODE.render(
        running_req=running,
        num_used_tokens=used,
        token_usage=usage,
        graph_label="cuda graph",
        graph=True,
        gen_throughput=tput,
        queue_req=queued,
    )


def retract(stamp: str, old: float, new: float) -> str:
    return f"[{stamp}] " + loglines.RETRACT.render(
        num_retracted=1, new_tokens_gained=500, old_ratio=old, new_ratio=new
    )


def test_retraction_on_every_rank_again_and_again_then_failing_health_checks_is_a_storm(
    tmp_path: Path,
) -> None:
    # The DeepSeek-R1 incident: the line on all eight ranks, every two seconds, then health checks fail.
    body = loglines.RETRACT_NO_GAINED.render(num_retracted=1, old_ratio=0.4, new_ratio=0.41)
    lines = [f"[2025-03-10 10:00:{s:02d} TP{r}] {body}" for s in range(0, 60, 2) for r in range(8)]
    lines.append(
        '[2025-03-10 10:01:05] INFO:     10.0.0.1:5000 - "GET /health HTTP/1.1" 503 Service Unavailable'
    )
    d = run(tmp_path, lines)
    assert d.verdict == "retraction-storm"
    assert d.lead.numbers["events"] == 30 and d.lead.numbers["lines"] == 240  # 8 ranks, counted once
    assert any("Health checks failed" in line for line in d.lead.explanation)


def test_throughput_per_request_that_falls_tenfold_after_a_retraction_and_stays_is_a_collapse(
    tmp_path: Path,
) -> None:
    # The mission's second incident: about 429 tokens/s, then 20–38 after a retraction, and it stays.
    before = [decode(f"2025-04-01 12:00:{i:02d}", 10, 20_000 + 400 * i, 0.95, 429.0, 0) for i in range(8)]
    after = [decode(f"2025-04-01 12:01:{i:02d}", 9, 20_000 + 40 * i, 0.9, 20.0 + 2 * i, 1) for i in range(8)]
    d = run(tmp_path, [*before, retract("2025-04-01 12:00:30", 0.098, 0.5), *after])
    assert d.verdict == "throughput-collapse"
    assert d.lead.numbers["per_request_before"] == 429.0 / 10


def test_fewer_running_requests_after_a_retraction_is_not_a_collapse(tmp_path: Path) -> None:
    # Total throughput falls, but per running request it holds: the batch shrank, nothing slowed down.
    before = [decode(f"2025-04-01 12:00:{i:02d}", 10, 20_000, 0.95, 429.0, 0) for i in range(8)]
    after = [decode(f"2025-04-01 12:01:{i:02d}", 1, 2_000, 0.1, 40.0, 0) for i in range(8)]
    d = run(tmp_path, [*before, retract("2025-04-01 12:00:30", 0.098, 0.5), *after])
    assert d.verdict == "retraction-occasional"


def test_running_flat_at_the_cap_beside_a_queue_and_an_empty_pool_is_an_idle_pool_from_the_cap(
    tmp_path: Path,
) -> None:
    start = (
        "[2025-06-01 09:00:00] max_total_num_tokens=500000, chunked_prefill_size=8192, "
        "max_prefill_tokens=16384, max_running_requests=256, context_len=32768, available_gpu_mem=20.00 GB"
    )
    lines = [start] + [
        decode(f"2025-06-01 09:0{i // 60}:{i % 60:02d}", 256, 150_000, 0.3, 5000.0, 400) for i in range(30)
    ]
    d = run(tmp_path, lines)
    assert d.verdict == "idle-pool-with-queue"
    assert d.lead.numbers["cause"] == "max-running-requests"
    assert any("--max-running-requests" in a for a in d.lead.advice)


def test_a_queue_beside_a_low_pool_after_the_ratio_jumped_blames_the_ratio(tmp_path: Path) -> None:
    lines = [retract("2025-06-01 09:00:00", 0.098, 0.95)]
    lines += [decode(f"2025-06-01 09:00:{i + 1:02d}", 20 + i, 30_000, 0.35, 900.0, 120) for i in range(10)]
    d = run(tmp_path, lines)
    assert d.verdict == "idle-pool-with-queue" and d.lead.numbers["cause"] == "ratio-after-retraction"


def test_an_abort_of_the_last_request_is_an_oom_abort_in_the_new_wording(tmp_path: Path) -> None:
    lines = [
        decode("2026-03-05 10:00:00", 1, 65_000, 1.0, 30.0, 0),
        "[2026-03-05 10:00:01] retract_decode: aborted last request 5f3e due to OOM",
    ]
    d = run(tmp_path, lines)
    assert d.verdict == "oom-abort" and d.lead.numbers["graceful_aborts"] == 1
    assert any("≥ 0.5.10" in line for line in d.lead.explanation)


def test_failing_health_checks_with_an_idle_pool_are_not_the_kv_pool(tmp_path: Path) -> None:
    lines = [decode(f"2025-02-19 11:4{i}:00", 0, 0, 0.0, 0.0, 0) for i in range(5)]
    lines += [
        '[2025-02-19 11:46:00] INFO:     10.0.0.2:1 - "GET /health_generate HTTP/1.1" 503 Service Unavailable'
    ] * 3
    d = run(tmp_path, lines)
    assert d.verdict == "other" and "admission is not the cause" in d.lead.title
    assert d.lead.numbers["health_fail"] == 3


def test_vllm_preemption_warnings_count_fifty_each_between_timestamps(tmp_path: Path) -> None:
    warn = (
        "WARNING 06-16 21:{m:02d}:{s:02d} scheduler.py:1089] Sequence group {g} is preempted by "
        "PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. This can affect the "
        "end-to-end performance. Increase gpu_memory_utilization or tensor_parallel_size to provide more "
        "KV cache memory. total_num_cumulative_preemption={c}"
    )
    lines = [
        warn.format(m=24, s=15, g=1, c=1),
        warn.format(m=24, s=45, g=9, c=51),
        warn.format(m=25, s=15, g=20, c=101),
    ]
    d = run(tmp_path, lines)
    assert d.verdict == "retraction-storm"
    assert d.lead.numbers["preemptions"] == 100 and d.lead.numbers["seconds"] == 60.0


def test_a_single_rare_retraction_in_a_long_log_is_occasional(tmp_path: Path) -> None:
    lines = [
        decode(f"2025-01-01 0{h}:{m:02d}:00", 30, 60_000, 0.8, 1500.0, 0) for h in range(3) for m in range(60)
    ]
    lines.insert(100, retract("2025-01-01 01:40:30", 0.098, 0.7))
    d = run(tmp_path, lines)
    assert d.verdict == "retraction-occasional"
    assert d.lead.numbers["per_minute"] < 0.01


def test_many_retractions_among_few_decode_lines_without_timestamps_is_a_storm(tmp_path: Path) -> None:
    # No time stamps, but a decode line every 40 decode steps: 6 retractions among 12 decode lines is one
    # per 80 steps, far more than one a minute at any realistic step time.
    body = loglines.RETRACT_NO_GAINED.render(num_retracted=1, old_ratio=0.2, new_ratio=0.5)
    dec = loglines.DECODE_V04.render(
        running_req=50, num_used_tokens=9000, token_usage=0.99, gen_throughput=900.0, queue_req=30
    )
    d = run(tmp_path, [dec, dec, body] * 6)
    assert d.verdict == "retraction-storm" and d.lead.numbers["span_s"] is None


def test_a_chunked_prefill_at_its_budget_is_named(tmp_path: Path) -> None:
    start = (
        "[2025-06-01 09:00:00] max_total_num_tokens=900000, chunked_prefill_size=8192, "
        "max_prefill_tokens=16384, max_running_requests=4096, context_len=131072, available_gpu_mem=9.00 GB"
    )
    prefill = "[2025-06-01 09:00:01] " + loglines.PREFILL.render(
        new_seq=1,
        new_token=8192,
        cached_token=0,
        token_usage=0.2,
        running_req=3,
        queue_req=40,
        pending_token=9,
        graph_label="cuda graph",
        graph=False,
        input_throughput=8000.0,
    )
    d = run(tmp_path, [start, prefill])
    assert d.verdict == "idle-pool-with-queue"
    assert any("--chunked-prefill-size (8,192)" in line for line in d.lead.explanation)
