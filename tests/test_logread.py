"""Batch lines as real logs print them (logs/README.md's format notes), read into loglines' field names."""

from __future__ import annotations

from datetime import datetime

from kvadmit.observe.logread import parse_batch_line, read_batch_lines

DECODE = (
    "Decode batch, #running-req: 5, #token: 1517, token usage: 0.37, cuda graph: False, "
    "gen throughput (token/s): 170.33, #queue-req: 11"
)


def test_the_current_format_with_its_timestamp() -> None:
    line = parse_batch_line("[2026-10-16 14:08:14] " + DECODE)
    assert line is not None and line.kind == "decode"
    assert line.time == datetime(2026, 10, 16, 14, 8, 14) and line.stream == ""
    assert line.fields == {"running_req": 5, "num_used_tokens": 1517, "token_usage": 0.37, "graph": False,
                           "gen_throughput": 170.33, "queue_req": 11}  # fmt: skip


def test_older_and_hand_copied_variants() -> None:
    # A period after "batch", a TP rank in the brackets, no #pending-token and no graph field (log 09).
    old = parse_batch_line(
        "[2025-06-12 11:41:56 TP0] Prefill batch. #new-seq: 8, #new-token: 16384, #cached-token: 0, "
        "token usage: 0.19, #running-req: 370, #queue-req: 646"
    )
    assert old is not None and old.kind == "prefill" and old.stream == "TP0"
    assert old.fields["new_token"] == 16384 and "pending_token" not in old.fields
    # The leading bracket lost, and an extra percentage field (log 17).
    lost = parse_batch_line(
        "2025-02-19 11:45:37 TP0] Prefill batch. #new-seq: 1, #new-token: 1, #cached-token: 0, "
        "cache hit rate: 0.00%, token usage: 0.00, #running-req: 0, #queue-req: 0"
    )
    assert lost is not None and lost.time == datetime(2025, 2, 19, 11, 45, 37)
    assert lost.fields["cache_hit_rate"] == 0.0
    # A logging-framework prefix with DP/TP/EP ranks and PD-decode fields (log 20).
    pd = parse_batch_line(
        "2025-10-20 03:02:22 INFO 31223 [DP3 TP3 EP3 scheduler_metrics_mixin.py:222] Decode batch. "
        "#running-req: 32, #token: 157952, token usage: 0.21, accept len: 1.93, pre-allocated usage: 0.00, "
        "#retracted-req: 0, cuda graph: True, gen throughput (token/s): 693.45, #queue-req: 0"
    )
    assert pd is not None and pd.stream == "DP3 TP3 EP3"
    assert pd.fields["accept_len"] == 1.93 and pd.fields["gen_throughput"] == 693.45
    # No prefix at all (docs), a cpu graph label, and a trailing ", ".
    bare = parse_batch_line(DECODE.replace("cuda graph", "cpu graph") + ", ")
    assert bare is not None and bare.time is None and bare.fields["graph"] is False


def test_an_ellipsis_line_starts_a_new_excerpt_segment() -> None:
    lines = read_batch_lines(["[2026-10-16 14:08:14] " + DECODE, "…", DECODE, "not a batch line"])
    assert [(b.segment, b.line_no) for b in lines] == [(0, 1), (1, 3)]


def test_rank_tags_and_timestamps_the_doctor_always_read() -> None:
    """Where this reader and the doctor's disagreed, both now take the more lenient reading: a context-
    parallel tag among the ranks, a comma and milliseconds after the seconds, a date without a year."""
    cp = parse_batch_line(
        "[2025-11-03 08:15:42 DP1 CP0 TP1 EP1] Decode batch. #running-req: 3, #token: 100, "
        "token usage: 0.10, cuda graph: True, gen throughput (token/s): 10.00, #queue-req: 0"
    )
    assert cp is not None and cp.stream == "DP1 CP0 TP1 EP1"
    ms = parse_batch_line(
        "2025-11-03 08:15:42,517 ATTN_DP2 MOE_EP2 Prefill batch, #new-seq: 1, #new-token: 64, "
        "#cached-token: 0, token usage: 0.02, #running-req: 4, #queue-req: 0"
    )
    assert ms is not None and ms.stream == "ATTN_DP2 MOE_EP2"
    assert ms.time == datetime(2025, 11, 3, 8, 15, 42)  # whole seconds, as before
    yearless = parse_batch_line(
        "INFO 11-03 08:15:42 TP0] Decode batch, #running-req: 3, #token: 100, token usage: 0.10, "
        "gen throughput (token/s): 10.00, #queue-req: 0"
    )
    assert yearless is not None and yearless.time == datetime(2000, 11, 3, 8, 15, 42)


def test_fields_take_the_names_and_types_of_every_release_s_template() -> None:
    hybrid = parse_batch_line(
        "[2025-11-03 08:15:42 TP0] Decode batch, #running-req: 3, #full token: 900, full token usage: 0.10, "
        "#swa token: 400, swa token usage: 0.20, pre-allocated usage: 0.00, cuda graph: True, "
        "gen throughput (token/s): 10.00, #queue-req: 0"
    )
    assert hybrid is not None
    assert hybrid.fields["full_num_used_tokens"] == 900 and hybrid.fields["swa_num_used_tokens"] == 400
    assert hybrid.fields["prealloc_usage"] == 0.0
    nan = parse_batch_line("Decode batch, #running-req: 3, gen throughput (token/s): nan, mfu: 0.31")
    assert nan is not None and "gen_throughput" not in nan.fields and nan.fields["mfu"] == 0.31
