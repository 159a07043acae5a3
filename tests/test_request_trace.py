"""The request trace's one definition (observe/request_trace.py): the rows `kvadmit serve` and `kvadmit
simulate` write, and the reader `kvadmit simulate --replay` uses, checked against hand-written lines."""

from __future__ import annotations

import json

import pytest

from kvadmit.observe.request_trace import TraceError, read_row, served_row, simulated_line


def test_a_served_row_in_its_field_order_with_milliseconds() -> None:
    row = served_row(
        seq=3, rid="abc", arrival=1.23456789, arrival_step=17, after_idle=True, http_s=0.0012345678,
        queued_s=0.25, input_ids=(5, 6, 7), max_new_tokens=16, ignore_eos=False, output_len=9, finish="stop",
        cached_tokens=2, retractions=1,
    )  # fmt: skip
    line = json.dumps(row, separators=(",", ":"))
    assert line == (
        '{"seq":3,"rid":"abc","arrival":1.234568,"arrival_step":17,"after_idle":true,"http_ms":1.235,'
        '"queued_ms":250.0,"prompt_len":3,"max_new_tokens":16,"ignore_eos":false,"output_len":9,'
        '"finish":"stop","cached_tokens":2,"retractions":1,"input_ids":[5,6,7]}'
    )


def test_a_simulated_line() -> None:
    line = simulated_line("req-4", 0.5000004, 100, 64, 12, 12, False, True, 0.0123456789, 0.5, "")
    assert line == (
        '{"rid": "req-4", "arrival": 0.5, "prompt_len": 100, "max_new_tokens": 64, "output_len": 12, '
        '"true_output_len": 12, "ignore_eos": false, "success": true, "ttft": 0.012346, "latency": 0.5, '
        '"error": ""}\n'
    )


def test_reading_a_served_line_back() -> None:
    row = json.loads(
        '{"seq":3,"rid":"abc","arrival":1.5,"arrival_step":17,"after_idle":true,"http_ms":1.2,'
        '"queued_ms":0.4,"prompt_len":3,"max_new_tokens":16,"ignore_eos":false,"output_len":9,'
        '"finish":"stop","cached_tokens":0,"retractions":0,"input_ids":[5,6,7]}'
    )
    got = read_row(row, "t:1", 1)
    assert (got.arrival, got.prompt_len, got.max_new_tokens, got.stop_at, got.ignore_eos) == (
        1.5,
        3,
        16,
        9,
        False,
    )
    assert (got.rid, got.input_ids, got.arrival_step, got.after_idle, got.seq) == (
        "abc",
        (5, 6, 7),
        17,
        True,
        3,
    )
    # A simulated line: no seq (the line number stands in), where it stops from true_output_len.
    sim = read_row(json.loads(simulated_line("req-0", 0.0, 4, 8, 3, 5, False, True, 0.1, 0.2, "")), "t:9", 9)
    assert (sim.stop_at, sim.seq, sim.arrival_step, sim.input_ids) == (5, 9, None, None)
    # An abort before its budget was set asks for one token.
    aborted = read_row({"arrival": 0, "prompt_len": 2, "finish": "abort"}, "t:2", 2)
    assert aborted.max_new_tokens == 1 and aborted.finish == "abort"
    with pytest.raises(TraceError, match="t:3: input_ids has 2 tokens but prompt_len is 3"):
        read_row({"arrival": 0, "prompt_len": 3, "max_new_tokens": 1, "input_ids": [1, 2]}, "t:3", 3)
