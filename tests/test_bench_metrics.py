"""bench_serving's timing rules and metric definitions (docs/sglang-rules.md §7) on hand-made timestamps;
every expected value is worked out by hand from the definitions in the comments."""

from __future__ import annotations

import json

import pytest

from kvadmit.bench.backends import StreamError, StreamReader
from kvadmit.bench.metrics import RequestOutcome, calculate_metrics
from kvadmit.bench.summary import render_summary


def native(text: str, completion: int) -> str:
    return "data: " + json.dumps(
        {"text": text, "meta_info": {"completion_tokens": completion, "prompt_tokens": 7}}
    )


def completion(text: str) -> str:
    return "data: " + json.dumps({"choices": [{"index": 0, "text": text}]})


def chat(content: str | None, role: bool = False) -> str:
    delta = {"role": "assistant", "content": ""} if role else {"content": content}
    return "data: " + json.dumps({"choices": [{"index": 0, "delta": delta}]})


def usage(completion_tokens: int) -> str:
    counts = {"prompt_tokens": 7, "completion_tokens": completion_tokens}
    details = {"prompt_tokens_details": {"cached_tokens": 3}}
    return "data: " + json.dumps({"choices": [], "usage": {**counts, **details}})


def test_native_spreads_each_chunk_gap_over_its_new_tokens_and_skips_chunks_without_one() -> None:
    r = StreamReader("native", sent=10.0, asked_output_len=99)
    r.line(native("", 0), 10.05)  # empty text: not the first token
    r.line(native("a", 1), 10.1)  # TTFT = 0.1
    r.line(native("abc", 3), 10.3)  # 2 new tokens over 0.2 s: two gaps of 0.1
    r.line(native("abc", 3), 10.35)  # no new token: skipped, the previous time stays 10.3
    r.line(native("abcd", 4), 10.6)  # 1 new token, 0.3 s after 10.3
    r.line("", 10.65)  # SSE's blank separator lines do not count
    r.line("data: [DONE]", 10.7)  # the latency ends at the last line
    assert r.ttft == pytest.approx(0.1)
    assert r.itl == pytest.approx([0.1, 0.1, 0.3])
    assert r.latency == pytest.approx(0.7)
    assert r.completion_tokens == 4
    assert r.text == "abcd"
    assert r.prompt_tokens == 7


def test_native_counts_the_servers_tokens_even_when_they_decode_to_no_text() -> None:
    r = StreamReader("native", sent=0.0, asked_output_len=12)
    r.line(native("", 1), 0.1)  # only the end-of-sequence token: no text, so no TTFT either
    r.line("data: [DONE]", 0.2)
    assert (r.completion_tokens, r.ttft, r.itl) == (1, None, [])


def test_openai_completions_count_one_gap_per_chunk_and_take_the_usage_count() -> None:
    r = StreamReader("completions", sent=0.0, asked_output_len=99)
    r.line(completion("Hel"), 0.2)  # TTFT 0.2 (however many tokens the chunk holds)
    r.line(completion(""), 0.25)  # empty: ignored
    r.line(completion("lo, wor"), 0.5)  # one gap of 0.3
    r.line(completion("ld"), 0.6)  # one gap of 0.1
    r.line(usage(5), 0.61)
    r.line("data: [DONE]", 0.62)
    assert r.ttft == pytest.approx(0.2)
    assert r.itl == pytest.approx([0.3, 0.1])
    assert r.latency == pytest.approx(0.62)
    assert r.completion_tokens == 5
    assert r.text == "Hello, world"
    assert (r.prompt_tokens, r.cached_tokens) == (7, 3)


def test_chat_skips_the_role_chunk_and_without_usage_counts_the_asked_length() -> None:
    r = StreamReader("chat", sent=1.0, asked_output_len=12)
    r.line(chat(None, role=True), 1.1)
    r.line(chat("x"), 1.4)
    r.line(chat("y"), 1.5)
    r.line("data: [DONE]", 1.5)
    assert r.ttft == pytest.approx(0.4)
    assert r.itl == pytest.approx([0.1])
    assert r.completion_tokens == 12  # bench_serving's fallback: the requested output length


def test_a_whole_answer_has_its_latency_as_ttft_and_no_gaps() -> None:
    r = StreamReader("native", sent=2.0, asked_output_len=5)
    r.body(json.dumps({"text": "abc", "meta_info": {"completion_tokens": 3}}), 2.5)
    assert (r.ttft, r.latency, r.itl, r.completion_tokens) == (pytest.approx(0.5), pytest.approx(0.5), [], 3)


def test_an_error_event_in_the_stream_fails_the_request() -> None:
    r = StreamReader("native", sent=0.0, asked_output_len=5)
    r.line(native("a", 1), 0.1)
    with pytest.raises(StreamError, match="aborted by the server"):
        r.line("data: " + json.dumps({"object": "error", "error": {"message": "aborted by the server"}}), 0.2)


def two_requests_and_a_failure() -> list[RequestOutcome]:
    return [
        # A: sent at 0, tokens at 0.5, 0.75, 0.9; done at 1.0.
        RequestOutcome(prompt_len=10, success=True, output_len=3, start_time=0.0, ttft=0.5, latency=1.0,
                       itl=[0.25, 0.15]),
        # B: sent at 0.5, tokens at 1.5, 2.0; done at 2.5.
        RequestOutcome(prompt_len=20, success=True, output_len=2, start_time=0.5, ttft=1.0, latency=2.0,
                       itl=[0.5]),
        RequestOutcome(prompt_len=40, success=False, start_time=0.1, latency=0.2, error="HTTP 400: too long"),
    ]  # fmt: skip


def test_metrics_follow_bench_serving_definitions() -> None:
    m = calculate_metrics(two_requests_and_a_failure(), duration_s=2.5)
    assert m.completed == 2
    assert (m.total_input, m.total_output) == (30, 5)  # the failed request counts nowhere
    assert m.request_throughput == pytest.approx(2 / 2.5)
    assert m.input_throughput == pytest.approx(30 / 2.5)
    assert m.output_throughput == pytest.approx(5 / 2.5)
    assert m.total_throughput == pytest.approx(35 / 2.5)
    assert m.concurrency == pytest.approx((1.0 + 2.0) / 2.5)  # Σ e2e / duration = 1.2
    assert m.e2e_ms["mean"] == pytest.approx(1500.0)
    assert m.e2e_ms["std"] == pytest.approx(500.0)  # population std of 1 s and 2 s
    assert m.ttft_ms["mean"] == pytest.approx(750.0)
    # TPOT: A (1.0 − 0.5)/(3 − 1) = 0.25 s; B (2.0 − 1.0)/(2 − 1) = 1.0 s.
    assert m.tpot_ms["mean"] == pytest.approx(625.0)
    assert m.tpot_ms["median"] == pytest.approx(625.0)
    # ITL over all gaps [0.15, 0.25, 0.5]: P90 at rank 0.9 × 2 = 1.8 → 0.25 + 0.8 × 0.25 = 0.45 s.
    assert m.itl_ms["mean"] == pytest.approx(300.0)
    assert m.itl_ms["median"] == pytest.approx(250.0)
    assert m.itl_ms["p90"] == pytest.approx(450.0)
    assert m.itl_ms["max"] == pytest.approx(500.0)
    # One-second buckets from the first send: A's three tokens all land in second 0, B's in 1 and 2;
    # A is open in seconds 0–1, B in 0–2.
    assert m.max_output_tokens_per_s == 3.0
    assert m.max_concurrent_requests == 2


def test_a_run_where_everything_failed_reports_zeros() -> None:
    m = calculate_metrics([RequestOutcome(prompt_len=5, error="boom")], duration_s=1.0)
    assert (m.completed, m.total_input, m.total_output, m.concurrency) == (0, 0, 0, 0.0)
    assert m.ttft_ms["mean"] == 0.0 and m.max_output_tokens_per_s == 0.0


def test_the_summary_prints_a_finite_rate_as_bench_serving_does() -> None:
    m = calculate_metrics(two_requests_and_a_failure(), duration_s=2.5)
    text = render_summary(m, backend="sglang-oai", request_rate=2.5, max_concurrency=4, duration_s=2.5)
    lines = text.splitlines()
    assert lines[3] == "Traffic request rate:                    2.5       "  # `{:<10}` of a float
    assert lines[4] == "Max request concurrency:                 4         "
    assert "Concurrency:                             1.20      " in lines
