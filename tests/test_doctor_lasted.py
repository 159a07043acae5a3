"""The doctor judges the state that lasted, not the fullest moment: logs written line by line in SGLang
0.5.22's format (docs/sglang-rules.md §4), several lines to a whole-second stamp as SGLang prints them.
Expected verdicts come from what each situation is, worked out by hand in the comments."""

from __future__ import annotations

from pathlib import Path

from kvadmit.doctor.diagnose import Inputs, diagnose
from kvadmit.doctor.model import Diagnosis
from kvadmit.observe import loglines

POOL = 600_000


def run(tmp_path: Path, lines: list[str]) -> Diagnosis:
    path = tmp_path / "server.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return diagnose(Inputs(log=str(path)))


def stamp(second: int) -> str:
    return f"[2026-09-13 16:{20 + second // 60:02d}:{second % 60:02d}] "


def decode(second: int, running: int, used: int, queued: int, tput: float = 2600.0, pool: int = POOL) -> str:
    return stamp(second) + loglines.DECODE.render(
        running_req=running,
        num_used_tokens=used,
        token_usage=used / pool,
        graph_label="cuda graph",
        graph=False,
        gen_throughput=tput,
        queue_req=queued,
    )


def prefill(
    second: int,
    new_seq: int,
    new_token: int,
    used: int,
    running: int,
    queued: int,
    tput: float,
    pool: int = POOL,
) -> str:
    return stamp(second) + loglines.PREFILL.render(
        new_seq=new_seq,
        new_token=new_token,
        cached_token=0,
        token_usage=used / pool,
        running_req=running,
        queue_req=queued,
        pending_token=1024 * queued,
        graph_label="cuda graph",
        graph=True,
        input_throughput=tput,
    )


STARTUP = (
    "[2026-09-13 16:19:50] max_total_num_tokens=600000, chunked_prefill_size=8192, max_prefill_tokens=16384, "
    "max_running_requests=512, context_len=32768, available_gpu_mem=9.50 GB"
)


def test_a_burst_prefilled_at_the_chunk_budget_is_a_healthy_queue_not_an_idle_pool(tmp_path: Path) -> None:
    # 190 requests of 1,024 prompt tokens arrive at once into an empty server. Every prefill pass takes
    # 8,192 new tokens (--chunked-prefill-size): 8 requests. Eight passes admit 64, 0.12 of the pool fills
    # (64 × 1,024 / 600,000 = 0.109 plus the decoded tokens): requests wait for prefill, not for room.
    lines = [STARTUP]
    for k in range(8):  # five passes in the first second, three in the next
        used = 8192 * k + 8192
        lines.append(prefill(k // 5, 8, 8192, used, 8 * k, 182 - 8 * k, 55_000.0))
        if k == 5:
            lines.append(decode(1, 48, used + 48, 142))
    lines.append(decode(1, 64, 8192 * 8 + 5000, 126))
    d = run(tmp_path, lines)
    assert d.verdict == "healthy-queue", d.lead.title
    assert not any(f.verdict == "idle-pool-with-queue" for f in d.findings)
    assert d.lead.kind == "prefill-bound-burst"
    assert "every prefill at the 8,192-token chunk budget" in d.lead.title
    assert "queue 182 → 126" in d.lead.title and "usage rising 0.01 → 0.12" in d.lead.title
    assert d.lead.numbers["prefills_at_budget"] == 8
    assert any("--chunked-prefill-size" in a for a in d.lead.advice)
    assert any("#new-token: 8192" in q.text for q in d.lead.evidence)


def test_a_burst_whose_prefills_are_not_at_a_budget_stays_an_idle_pool(tmp_path: Path) -> None:
    # The same shape, but each pass admits only 3,000 tokens although 8,192 were allowed: admission, not
    # prefill's budget, holds the queue back, and the pool is idle beside it.
    lines = [STARTUP]
    for k in range(8):
        lines.append(prefill(k // 5, 3, 3000, 3000 * k + 3000, 3 * k, 182 - 3 * k, 20_000.0))
    lines.append(decode(1, 24, 3000 * 8 + 2000, 158))
    d = run(tmp_path, lines)
    assert d.verdict == "idle-pool-with-queue"


def stall_lines(with_retraction: bool) -> list[str]:
    # Pool 87,552 (a 4090's). The excerpt opens just after a retraction: 66 running at 0.94, 59 waiting.
    # For 7 s no prefill runs while 14 requests finish (66 → 52) and usage falls to 0.77; then one request
    # of 351 tokens is admitted, 351 / 16.25 s since the last prefill = 21.6 tokens/s.
    pool = 87_552
    lines = []
    if with_retraction:
        retract = loglines.RETRACT.render(
            num_retracted=1, new_tokens_gained=812, old_ratio=0.0980, new_ratio=0.6512
        )
        lines.append(stamp(0) + retract)
    usage = [0.94, 0.92, 0.89, 0.87, 0.84, 0.82, 0.79, 0.77]
    for s in range(8):
        lines.append(decode(s, 66 - 2 * s, round(usage[s] * pool), 59 + s // 3, 2500.0 - 40 * s, pool))
    lines.append(prefill(7, 1, 351, round(0.77 * pool), 52, 60, 21.6, pool))
    lines.append(decode(8, 53, round(0.78 * pool), 60, 2000.0, pool))
    return lines


def test_an_admission_stall_after_a_retraction_outside_the_excerpt_is_called_one(tmp_path: Path) -> None:
    d = run(tmp_path, stall_lines(with_retraction=False))
    assert d.verdict == "retraction-occasional", d.lead.title
    assert d.lead.kind == "admission-stall"
    # No prefill from 16:20:00 to the prefill at 16:20:07; then one request of the 14 that finished is
    # admitted and at 16:20:08 usage is still 0.78 with 60 waiting: stalled until 16:20:08, 8 s of the
    # excerpt's 9 (16:20:00–16:20:08, whole-second stamps).
    assert "no prefill for 7.0 s" in d.lead.title
    assert "for 8.0 s of the 9.0 s excerpt" in d.lead.title
    assert "0.94 → 0.77" in d.lead.title
    assert d.lead.numbers["retraction_seen"] is False
    assert not any(f.verdict == "healthy-queue" for f in d.findings)  # not "nothing is stuck" beside it
    assert any("No retraction line is in this excerpt" in line for line in d.lead.explanation)
    quoted = "\n".join(q.text for q in d.lead.evidence)
    assert "token usage: 0.94" in quoted and "token usage: 0.77" in quoted
    assert "input throughput (token/s): 21.60" in quoted
    advice = " ".join(d.lead.advice)
    assert "--schedule-conservativeness" in advice and "--max-running-requests" in advice


def test_the_same_stall_with_its_retraction_line_leads_with_the_ratio(tmp_path: Path) -> None:
    d = run(tmp_path, stall_lines(with_retraction=True))
    assert d.verdict == "retraction-occasional" and d.lead.kind == "admission-stall", d.lead.title
    assert any("0.0980 -> 0.6512" in q.text for q in d.lead.evidence)
    assert any("0.6512" in line for line in d.lead.explanation)


def test_a_full_pool_that_admits_nobody_while_nothing_finishes_is_not_a_stall(tmp_path: Path) -> None:
    # The forecast at work: 40 running requests grow (usage 0.86 → 0.93), none finish, 30 wait for 8 s.
    pool = 87_552
    lines = [decode(s, 40, round((0.86 + 0.01 * s) * pool), 30, 1600.0, pool) for s in range(8)]
    lines.append(prefill(8, 2, 702, round(0.9 * pool), 38, 28, 44.0, pool))
    d = run(tmp_path, lines)
    assert d.verdict == "healthy-queue", d.lead.title
    assert not any(f.kind == "admission-stall" for f in d.findings)


def steady(seconds: range, usage: float, queued: int, pool: int = POOL) -> list[str]:
    """A decode line a second, and every other second a prefill admitting the two that finished."""
    lines = []
    for s in seconds:
        lines.append(decode(s, 100, round(usage * pool), queued, 3000.0, pool))
        if s % 2:
            lines.append(prefill(s, 2, 2048, round(usage * pool), 98, queued - 2, 1000.0, pool))
    return lines


def spike(seconds: range, queued: int) -> list[str]:
    """Two seconds at 0.99, printed densely (eight lines a second)."""
    return [decode(s, 100, round(0.99 * POOL), queued, 3000.0) for s in seconds for _ in range(8)]


def test_an_idle_pool_for_a_minute_with_a_two_second_spike_to_full_is_an_idle_pool(tmp_path: Path) -> None:
    # 60 s at usage 0.30 with 200 waiting, then 2 s at 0.99. By samples the spike is 16 of 106 waiting
    # lines (15%, so the 98th percentile is 0.99); by time it is 2 of 62 s (3%): the pool was idle.
    lines = steady(range(0, 30), 0.30, 200) + spike(range(30, 32), 200) + steady(range(32, 62), 0.30, 200)
    d = run(tmp_path, lines)
    assert d.verdict == "idle-pool-with-queue", d.lead.title
    assert d.lead.numbers["usage_peak_waiting"] == 0.30
    assert any("for 60.0 s of the 62.0 s" in line for line in d.lead.explanation)


def test_a_healthy_queue_for_a_minute_with_a_two_second_spike_says_the_usage_that_lasted(
    tmp_path: Path,
) -> None:
    # 60 s at usage 0.88 with 150 waiting and 2 s at 0.99: a healthy queue at 0.88, not at 0.99.
    lines = steady(range(0, 30), 0.88, 150) + spike(range(30, 32), 150) + steady(range(32, 62), 0.88, 150)
    d = run(tmp_path, lines)
    assert d.verdict == "healthy-queue", d.lead.title
    assert "token usage 0.88 while they wait, for 62.0 s of the 62.0 s excerpt" in d.lead.title
    assert d.lead.numbers["usage_lasting"] == [0.88, 0.88]


def test_a_stall_of_a_few_seconds_in_a_healthy_minute_does_not_decide(tmp_path: Path) -> None:
    # 60 s of healthy queue, and 4 s in which nobody is admitted while 10 requests finish: a moment.
    lines = steady(range(0, 30), 0.88, 150)
    for k in range(4):  # 100 → 91 running, usage 0.88 → 0.82, no prefill
        lines.append(decode(30 + k, 100 - 3 * k, round((0.88 - 0.02 * k) * POOL), 150))
    lines += steady(range(34, 64), 0.88, 150)
    d = run(tmp_path, lines)
    assert d.verdict == "healthy-queue", d.lead.title
    assert not any(f.kind == "admission-stall" for f in d.findings)


def test_the_stall_goes_on_through_a_trickle_of_admission(tmp_path: Path) -> None:
    # The stall above, then ten more seconds in which one request is admitted every third second: with
    # the one at 16:20:07, 5 of the 14 that finished are replaced; usage stays at 0.78–0.79, 60 waiting.
    # No prefill for 7 s is only 7 of the 19 s; the stall, trickle included, lasts from 16:20:00 to the
    # last line at 16:20:18.
    pool = 87_552
    lines = stall_lines(with_retraction=False)
    for s in range(9, 19):
        lines.append(decode(s, 53 + (s - 7) // 3, round(0.78 * pool) + 40 * s, 60, 2000.0, pool))
        if s % 3 == 0:
            lines.append(prefill(s, 1, 351, round(0.79 * pool), 53 + (s - 7) // 3, 60, 117.0, pool))
    d = run(tmp_path, lines)
    assert d.verdict == "retraction-occasional" and d.lead.kind == "admission-stall", d.lead.title
    assert "for 18.0 s of the 19.0 s excerpt" in d.lead.title
    assert d.lead.numbers["prefills_after"] == 5 and d.lead.numbers["admitted_after"] == 5


def test_a_burst_at_a_default_chunk_size_without_the_startup_line_is_a_healthy_queue(tmp_path: Path) -> None:
    # The excerpt lacks the start-up line: 8,192 is one of the chunk sizes SGLang picks by GPU memory.
    lines = [prefill(k // 5, 8, 8192, 8192 * k + 8192, 8 * k, 182 - 8 * k, 55_000.0) for k in range(8)]
    d = run(tmp_path, lines)
    assert d.verdict == "healthy-queue" and d.lead.kind == "prefill-bound-burst", d.lead.title
    assert "queue 182 → 126" in d.lead.title


def test_a_queue_for_two_seconds_of_a_quiet_minute_is_not_an_idle_pool(tmp_path: Path) -> None:
    # 62 s at usage 0.30 with nobody waiting, except 2 s in which 40 arrivals queue (40 ≥ a tenth of the
    # 100 running) and are then admitted: requests waited for 2 of the 62 s, a moment.
    lines = []
    for s in range(62):
        queued = 40 if s in (30, 31) else 0
        lines.append(decode(s, 100, round(0.30 * POOL), queued, 3000.0))
    lines.insert(33, prefill(31, 40, 40 * 512, round(0.32 * POOL), 100, 0, 20_000.0))
    d = run(tmp_path, lines)
    assert d.verdict == "healthy-queue", d.lead.title
    assert "requests waited only for 2.0 s of the 62.0 s excerpt" in d.lead.title


def test_an_idle_pool_that_stalled_blames_a_retraction_before_the_excerpt(tmp_path: Path) -> None:
    # Usage 0.60 → 0.46 over 8 s while 80 wait and 40 → 26 run, no prefill: the pool is idle (under 0.7
    # all the time) and the stall says why: a raised ratio, not oversized max_new_tokens.
    lines = [decode(s, 40 - 2 * s, round((0.60 - 0.02 * s) * POOL), 80) for s in range(8)]
    lines.append(prefill(8, 1, 1024, round(0.45 * POOL), 26, 80, 128.0))
    d = run(tmp_path, lines)
    assert d.verdict == "idle-pool-with-queue", d.lead.title
    assert d.lead.numbers["cause"] == "ratio-after-retraction"
    assert any("No retraction line is in this log" in line for line in d.lead.explanation)


def test_a_log_without_any_prefill_line_cannot_show_a_stall(tmp_path: Path) -> None:
    # A PD decode worker prints no Prefill lines (its requests arrive by KV transfer): the same fall of
    # usage and running beside a queue says nothing about admission there.
    lines = [line for line in stall_lines(with_retraction=False) if "Prefill batch" not in line]
    d = run(tmp_path, lines)
    assert not any(f.kind == "admission-stall" for f in d.findings), d.lead.title
