"""SGLang's log lines: rendered exactly, and parsed back by the same definitions (docs/sglang-rules.md §3.3,
§4)."""

from __future__ import annotations

from datetime import datetime

from kvadmit.observe import loglines
from kvadmit.observe.sglang_log import SGLangLogWriter
from kvadmit.scheduler.events import DecodeBatchStats, PrefillBatchStats, Retraction, StartupInfo

MISSION_DECODE = (
    "Decode batch, #running-req: 5, #token: 1517, token usage: 0.37, cuda graph: False, "
    "gen throughput (token/s): 170.33, #queue-req: 11"
)
MISSION_PREFILL = (
    "Prefill batch, #new-seq: 4, #new-token: 896, #cached-token: 0, token usage: 0.28, #running-req: 1, "
    "#queue-req: 11, #pending-token: 2808, cuda graph: False, input throughput (token/s): 3889.60"
)


def test_the_mission_lines_render_exactly() -> None:
    assert (
        loglines.DECODE.render(
            running_req=5,
            num_used_tokens=1517,
            token_usage=0.3704,
            graph_label="cuda graph",
            graph=False,
            gen_throughput=170.333,
            queue_req=11,
        )
        == MISSION_DECODE
    )
    assert (
        loglines.PREFILL.render(
            new_seq=4,
            new_token=896,
            cached_token=0,
            token_usage=0.28125,
            running_req=1,
            queue_req=11,
            pending_token=2808,
            graph_label="cuda graph",
            graph=False,
            input_throughput=3889.6,
        )
        == MISSION_PREFILL
    )


def test_lines_parse_back_into_their_fields() -> None:
    assert loglines.DECODE.parse("[2026-10-16 14:08:14] " + MISSION_DECODE) == {
        "running_req": 5,
        "num_used_tokens": 1517,
        "token_usage": 0.37,
        "graph_label": "cuda graph",
        "graph": False,
        "gen_throughput": 170.33,
        "queue_req": 11,
    }
    fields = loglines.PREFILL.parse(MISSION_PREFILL)
    assert fields is not None and fields["pending_token"] == 2808
    assert loglines.PREFILL_CLASSIC.parse(MISSION_PREFILL) is None


def test_the_retraction_line_has_four_decimals_of_ratio() -> None:
    line = loglines.RETRACT.render(
        num_retracted=1, new_tokens_gained=310, old_ratio=0.098, new_ratio=220 / 1601
    )
    assert line == (
        "KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_tokens_gained: 310, "
        "#new_token_ratio: 0.0980 -> 0.1374"
    )
    assert loglines.RETRACT.parse(line) == {
        "num_retracted": 1,
        "new_tokens_gained": 310,
        "old_ratio": 0.098,
        "new_ratio": 0.1374,
    }


def test_the_writer_timestamps_lines_and_computes_throughput_from_its_clock() -> None:
    lines: list[str] = []
    start = datetime(2026, 10, 16, 14, 8, 0).timestamp()
    writer = SGLangLogWriter(lines.append, start_time=start)
    writer.handle(StartupInfo(4096, 8192, 16384, 2048, 8192, 13.5), start)
    stats = DecodeBatchStats(
        running_req=5, num_used_tokens=1517, token_usage=1517 / 4096, queue_req=11, generated_tokens=200
    )
    writer.handle(stats, start + 2.0)
    writer.handle(Retraction(("a",), 310, 0.098, 220 / 1601, True, 100, 10), start + 3.0)
    writer.handle(PrefillBatchStats(1, 1, 255, 256, 0.0625, 0, 15, 0, 0.7, 0, 1), start + 4.0)
    assert lines[0] == (
        "[2026-10-16 14:08:00] max_total_num_tokens=4096, chunked_prefill_size=8192, "
        "max_prefill_tokens=16384, max_running_requests=2048, context_len=8192, available_gpu_mem=13.50 GB"
    )
    assert lines[1].startswith("[2026-10-16 14:08:02] Decode batch, #running-req: 5, #token: 1517")
    assert "gen throughput (token/s): 100.00" in lines[1]
    assert lines[2] == "[2026-10-16 14:08:03] Testing retraction. #retracted_reqs: 1, #new_tokens_gained: 310"
    assert "input throughput (token/s): 0.25" in lines[3]
