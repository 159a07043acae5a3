"""The doctor's line parser: every shape of every line it knows, rank de-duplication, unknown lines, and
streaming in bounded memory."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator

import pytest

from kvadmit.doctor import parse
from kvadmit.doctor.collect import Collector
from kvadmit.doctor.parse import LineParser
from kvadmit.doctor.timeline import CAPACITY
from kvadmit.observe import loglines

DECODE_VALUES = dict(
    running_req=5,
    num_used_tokens=1517,
    token_usage=0.37,
    graph_label="cuda graph",
    graph=False,
    gen_throughput=170.33,
    queue_req=11,
)


def parsed(line: str) -> parse.Parsed:
    rec = LineParser().parse(line)
    assert rec is not None, line
    return rec


@pytest.mark.parametrize(
    "prefix",
    [
        "",
        "[2026-10-16 14:08:14] ",
        "[2026-10-16 14:08:14 TP0] ",
        "2026-10-16 14:08:14 TP0] ",
        "2026-10-16 14:08:14 INFO 31223 [DP3 TP3 EP3 scheduler_metrics_mixin.py:222] ",
        "[14:08:14] ",
    ],
)
def test_a_decode_line_behind_any_prefix(prefix: str) -> None:
    rec = parsed(prefix + loglines.DECODE.render(**DECODE_VALUES))
    assert rec.kind == parse.DECODE
    assert (rec.fields["running_req"], rec.fields["queue_req"], rec.fields["token_usage"]) == (5, 11, 0.37)
    assert rec.fields["num_used_tokens"] == 1517 and rec.fields["gen_throughput"] == 170.33
    if "14:08:14" in prefix:
        assert rec.t is not None and rec.ts.endswith("14:08:14")
    assert rec.rank == ("TP0" if "TP0" in prefix else "DP3 TP3 EP3" if "DP3" in prefix else "")
    assert rec.scheduler == ("DP3" if "DP3" in prefix else "")


def test_rank_tags_after_the_first_bracket() -> None:
    """A wrapper's bracket before the rank tags: the calibrate reader always read these; now the doctor
    does too (it used to stop at the first `]`)."""
    rec = parsed("[2025-11-03 08:15:42] [DP1 TP1] " + loglines.DECODE.render(**DECODE_VALUES))
    assert rec.rank == "DP1 TP1" and rec.scheduler == "DP1" and rec.ts == "2025-11-03 08:15:42"
    access = parsed('[2025-11-03 08:15:42] INFO:     127.0.0.1:53420 - "POST /generate HTTP/1.1" 200 OK')
    assert access.kind == parse.HTTP and access.rank == ""


@pytest.mark.parametrize(
    ("fmt", "values"),
    [
        (
            loglines.PREFILL,
            dict(
                new_seq=4,
                new_token=896,
                cached_token=0,
                token_usage=0.28,
                running_req=1,
                queue_req=11,
                pending_token=2808,
                graph_label="cpu graph",
                graph=True,
                input_throughput=3889.6,
            ),
        ),
        (
            loglines.PREFILL_CLASSIC,
            dict(
                new_seq=4,
                new_token=896,
                cached_token=0,
                token_usage=0.28,
                running_req=1,
                queue_req=11,
                graph_label="npu graph",
                graph=False,
                input_throughput=3889.6,
            ),
        ),
        (
            loglines.PREFILL_V04,
            dict(
                new_seq=4,
                new_token=896,
                cached_token=0,
                cache_hit_rate=0.0,
                token_usage=0.28,
                running_req=1,
                queue_req=11,
            ),
        ),
        (
            loglines.PREFILL_HYBRID_SWA,
            dict(
                new_seq=4,
                new_token=896,
                cached_token=0,
                full_token_usage=0.28,
                swa_token_usage=0.1,
                running_req=1,
                queue_req=11,
                pending_token=0,
                graph_label="cuda graph",
                graph=False,
                input_throughput=1.0,
            ),
        ),
        (
            loglines.PREFILL_PD,
            dict(
                new_seq=4,
                new_token=896,
                cached_token=0,
                token_usage=0.28,
                running_req=1,
                queue_req=11,
                prealloc_req=2,
                inflight_req=3,
                input_throughput=1.0,
            ),
        ),
    ],
)
def test_every_prefill_shape(fmt: loglines.LineFormat, values: dict[str, object]) -> None:
    rec = parsed("[2026-10-16 14:08:02] " + fmt.render(**values))
    assert rec.kind == parse.PREFILL
    for name in ("new_seq", "new_token", "cached_token", "running_req", "queue_req"):
        assert rec.fields[name] == values[name]
    usage = values.get("token_usage", values.get("full_token_usage"))
    assert rec.fields.get("token_usage", rec.fields.get("full_token_usage")) == usage


@pytest.mark.parametrize(
    ("fmt", "extra"),
    [
        (loglines.DECODE_V04, {}),
        (loglines.DECODE_SPEC, {"accept_len": 1.93, "accept_rate": 0.71}),
        (
            loglines.DECODE_PD,
            {"prealloc_usage": 0.0, "prealloc_req": 0, "transfer_req": 1, "retracted_req": 0},
        ),
    ],
)
def test_every_decode_shape(fmt: loglines.LineFormat, extra: dict[str, object]) -> None:
    values = {**DECODE_VALUES, **extra}
    rec = parsed("[2025-01-06 02:58:11 TP0] " + fmt.render(**values))
    assert rec.kind == parse.DECODE
    for name in ("running_req", "num_used_tokens", "token_usage", "queue_req", *extra):
        assert rec.fields[name] == values[name]


def test_the_hybrid_decode_line_gives_both_pools() -> None:
    line = loglines.DECODE_HYBRID_SWA.render(
        running_req=3,
        full_num_used_tokens=900,
        full_token_usage=0.45,
        swa_num_used_tokens=100,
        swa_token_usage=0.91,
        graph_label="cuda graph",
        graph=True,
        gen_throughput=12.5,
        queue_req=7,
    )
    rec = parsed(line)
    assert (rec.fields["full_token_usage"], rec.fields["swa_token_usage"]) == (0.45, 0.91)


def test_unknown_fields_and_a_trailing_comma_do_not_break_a_line() -> None:
    rec = parsed(
        "Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.50, "
        "#running-req: 2, #queue-req: 3, #brand-new-field: 42, mfu: 0.3, "
    )
    assert rec.kind == parse.PREFILL and rec.fields["queue_req"] == 3 and rec.fields["token_usage"] == 0.5


@pytest.mark.parametrize(
    ("line", "expect"),
    [
        (
            "Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.0980 -> 0.9446",
            {"num_retracted": 1, "old_ratio": 0.098, "new_ratio": 0.9446},
        ),
        (
            "KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_token_ratio: 0.9998 -> 1.0000",
            {"num_retracted": 1, "old_ratio": 0.9998, "new_ratio": 1.0},
        ),
        (
            loglines.RETRACT.render(
                num_retracted=2, new_tokens_gained=646, old_ratio=0.098, new_ratio=0.3487
            ),
            {"num_retracted": 2, "new_tokens_gained": 646, "new_ratio": 0.3487},
        ),
        (
            loglines.RETRACT_MAMBA.render(
                num_retracted=1, new_tokens_gained=5, mamba_num_gained=2, old_ratio=0.1, new_ratio=0.2
            ),
            {"mamba_num_gained": 2, "new_ratio": 0.2},
        ),
        (loglines.TEST_RETRACT.render(num_retracted=1, new_tokens_gained=310), {"forced": True}),
    ],
)
def test_three_generations_of_retraction_wording(line: str, expect: dict[str, object]) -> None:
    rec = parsed("[2026-09-13 16:06:07] " + line)
    assert rec.kind == parse.RETRACT
    for k, v in expect.items():
        assert rec.fields[k] == v


@pytest.mark.parametrize(
    ("line", "release", "graceful"),
    [
        (
            "AssertionError: No space left for only one request, "
            "self.token_to_kv_pool_allocator.available_size()=0",
            "<=0.5.6",
            False,
        ),
        (
            "ValueError: Out of memory even after retracting all other requests in the decode batch.",
            "0.5.7-0.5.9",
            False,
        ),
        (
            "Out of memory even after retracting all other requests in the decode batch. Aborting the last "
            "request.",
            ">=0.5.10",
            True,
        ),
        ("retract_decode: aborted last request 8c1f2e due to OOM", ">=0.5.10", True),
    ],
)
def test_every_release_s_last_request_failure(line: str, release: str, graceful: bool) -> None:
    rec = parsed("[2026-03-04 10:00:00 TP0] " + line)
    assert rec.kind == parse.LAST_REQUEST
    assert rec.fields["release"] == release and rec.fields["graceful"] is graceful


def test_startup_lines_old_and_new() -> None:
    new = parsed(
        "[2025-08-11 17:17:03] max_total_num_tokens=665690, chunked_prefill_size=8192, "
        "max_prefill_tokens=16384, max_running_requests=4096, context_len=65536, "
        "available_gpu_mem=13.50 GB"
    )
    assert new.kind == parse.STARTUP and new.fields["max_total_num_tokens"] == 665690
    assert new.fields["max_running_requests"] == 4096 and new.fields["available_mem"] == 13.5
    old = parsed(
        "max_total_num_tokens=307481, max_prefill_tokens=16384, max_running_requests=2, context_len=163840"
    )
    assert old.fields["max_total_num_tokens"] == 307481 and old.fields["context_len"] == 163840


def test_health_checks_http_and_failures() -> None:
    ok = parsed('[2025-02-19 11:45:37] INFO:     172.17.0.109:43128 - "GET /health_generate HTTP/1.1" 200 OK')
    assert ok.kind == parse.HTTP and ok.fields["path"] == "/health_generate"
    bad = parsed(
        '[2025-02-19 12:25:37] INFO:     172.17.0.109:43128 - "GET /health HTTP/1.1" 503 Service Unavailable'
    )
    assert bad.kind == parse.HEALTH_FAIL
    assert (
        parsed("[2025-02-19 12:25:37] Health check failed. Server couldn't get a response").kind
        == parse.HEALTH_FAIL
    )
    assert parsed("[2025-02-19 11:45:46] Abort request a96186a3d0f8424eb67e822d7cc66c57").kind == parse.ABORT


def test_vllm_status_lines_v0_and_v1_and_preemption() -> None:
    v0 = parsed(
        "INFO 06-16 21:24:15 metrics.py:341] Avg prompt throughput: 2706.1 tokens/s, Avg generation "
        "throughput: 13395.4 tokens/s, Running: 34 reqs, Swapped: 100 reqs, Pending: 9832 reqs, GPU KV cache "
        "usage: 99.2%, CPU KV cache usage: 70.4%."
    )
    assert v0.kind == parse.VLLM_STATUS and v0.ts == "06-16 21:24:15"
    assert (v0.fields["running_req"], v0.fields["swapped_req"], v0.fields["queue_req"]) == (34, 100, 9832)
    assert v0.fields["gpu_usage_pct"] == 99.2
    v1 = parsed(
        "INFO 07-01 10:00:00 [loggers.py:118] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
        "Avg generation throughput: 52.1 tokens/s, Running: 4 reqs, Waiting: 9 reqs, GPU KV cache usage: "
        "31.0%, Prefix cache hit rate: 12.5%"
    )
    assert (v1.fields["running_req"], v1.fields["queue_req"], v1.fields["gpu_usage_pct"]) == (4, 9, 31.0)
    pre = parsed(
        "WARNING 06-16 21:24:15 scheduler.py:1089] Sequence group 165 is preempted by PreemptionMode.SWAP "
        "mode because there is not enough KV cache space. This can affect the end-to-end performance. "
        "Increase gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. "
        "total_num_cumulative_preemption=151"
    )
    assert pre.kind == parse.VLLM_PREEMPT and pre.fields["cumulative"] == 151 and pre.fields["mode"] == "SWAP"


def test_lines_it_does_not_know_are_none() -> None:
    p = LineParser()
    for line in ("", "Load weight end. type=Qwen3ForCausalLM", "batch size 8", "hello HTTP/2 world"):
        assert p.parse(line) is None


def _collect(lines: list[str]) -> Collector:
    col = Collector()
    p = LineParser()
    for i, line in enumerate(lines, 1):
        rec = p.parse(line)
        if rec is None:
            col.add_unknown(i, line)
        else:
            col.add(i, rec, line)
    return col


def test_the_same_event_printed_by_every_rank_counts_once() -> None:
    body = "Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.0980 -> 0.9446"
    ranks = [f"[2025-01-06 02:58:44 TP{r}] {body}" for r in (0, 5, 7, 2, 6)]
    col = _collect(ranks)
    assert col.c.retract.events == 1 and col.c.retract.duplicate_lines == 4
    # One rank printing it twice is two events; the other ranks' copies still count once.
    twice = _collect([ranks[0], ranks[1], ranks[0], ranks[1]])
    assert twice.c.retract.events == 2
    # Without rank tags nothing is merged: the same scheduler retracted twice in one second.
    plain = _collect([f"[2025-01-06 02:58:44] {body}"] * 2)
    assert plain.c.retract.events == 2
    # Data-parallel ranks are schedulers of their own: the same text from two of them is two events.
    dp = _collect([f"[2025-01-06 02:58:44 DP{r} TP{r}] {body}" for r in (0, 1)])
    assert dp.c.retract.events == 2
    # A second later it is a new event.
    later = _collect([ranks[0], ranks[1], ranks[0].replace("02:58:44", "02:58:45")])
    assert later.c.retract.events == 2


def test_unknown_lines_are_counted_with_a_few_examples() -> None:
    lines = [f"noise {i}" for i in range(100)] + [
        "[2026-09-13 16:06:07] " + loglines.DECODE.render(**DECODE_VALUES)
    ]
    col = _collect(lines)
    assert col.c.unknown == 100 and len(col.c.unknown_examples) == 5 and col.c.recognised == 1


def _synthetic(n: int) -> Iterator[str]:
    for i in range(n):
        stamp = f"[2026-09-13 {10 + i // 3_600_00 % 10:02d}:{i // 6000 % 60:02d}:{i // 100 % 60:02d}] "
        if i % 50 == 0:
            yield stamp + loglines.RETRACT.render(
                num_retracted=1, new_tokens_gained=9, old_ratio=0.098, new_ratio=0.3
            )
        elif i % 3:
            yield stamp + loglines.DECODE.render(**{**DECODE_VALUES, "queue_req": i % 97})
        else:
            yield stamp + f"something else {i}"


def test_memory_does_not_grow_with_the_log() -> None:
    def peak(n: int) -> int:
        tracemalloc.start()
        col = Collector()
        p = LineParser()
        for i, line in enumerate(_synthetic(n), 1):
            rec = p.parse(line)
            if rec is None:
                col.add_unknown(i, line)
            else:
                col.add(i, rec, line)
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        series = col.c.timeline.series[""]
        assert len(series.points) <= CAPACITY and len(col.c.timeline.markers) <= CAPACITY
        assert len(col.c.unknown_examples) <= 5
        return top

    small, big = peak(6_000), peak(24_000)
    assert big < small * 1.5, (small, big)  # four times the lines, about the same memory


@pytest.mark.parametrize(
    "line",
    [
        "[2026-10-16 14:08:14] " + loglines.DECODE.render(**DECODE_VALUES),
        "[2026-10-16 14:08:02] "
        + loglines.PREFILL.render(
            new_seq=4,
            new_token=896,
            cached_token=0,
            token_usage=0.28,
            running_req=1,
            queue_req=11,
            pending_token=2808,
            graph_label="cuda graph",
            graph=False,
            input_throughput=3889.6,
        ),
        "[2026-10-16 14:08:02] "
        + loglines.PREFILL_CLASSIC.render(
            new_seq=4,
            new_token=896,
            cached_token=0,
            token_usage=0.28,
            running_req=1,
            queue_req=11,
            graph_label="cuda graph",
            graph=False,
            input_throughput=3889.6,
        ),
    ],
)
def test_the_fast_path_reads_what_the_general_parser_reads(line: str) -> None:
    fast = LineParser().fast_batch(line)
    general = parsed(line)
    assert fast is not None
    assert fast == (general.kind, general.ts, general.t, general.values)


def test_the_fast_path_leaves_other_lines_to_the_parser() -> None:
    p = LineParser()
    for line in (
        "[2026-10-16 14:08:14 TP0] " + loglines.DECODE.render(**DECODE_VALUES),  # rank tags
        loglines.DECODE.render(**DECODE_VALUES),  # no stamp
        "[2026-10-16 14:08:14] " + loglines.DECODE_V04.render(**DECODE_VALUES),  # another release
        "[2026-10-16 14:08:14] Decode something else",
        "[2026-10-16 14:08:14] Prefill",
    ):
        assert p.fast_batch(line) is None
