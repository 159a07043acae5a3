"""`serve --trace-requests` and `--trace-steps`: a trace that cannot be written (a full disk) stops
itself, with one log line; it never raises into the engine loop (which would leave requests unanswered)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kvadmit.server.traces import TraceFile


def test_a_full_disk_stops_the_trace_not_the_engine(caplog: pytest.LogCaptureFixture) -> None:
    if not Path("/dev/full").exists():
        pytest.fail("this test needs Linux's /dev/full")
    trace = TraceFile("/dev/full", "--trace-requests")
    with caplog.at_level(logging.ERROR, logger="kvadmit.server"):
        trace.write({"seq": 0})  # ENOSPC: logged, the trace stops
        trace.write({"seq": 1})  # nothing more happens
    errors = [r for r in caplog.records if "--trace-requests" in r.getMessage()]
    assert len(errors) == 1 and "the trace stops here" in errors[0].getMessage()
    trace.close()


def test_rows_are_one_json_line_each(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    trace = TraceFile(str(path), "--trace-steps")
    trace.write({"seq": 0, "rid": "a"})
    trace.write({"seq": 1, "rid": "b"})  # readable before close: line buffered
    assert path.read_text().splitlines() == ['{"seq":0,"rid":"a"}', '{"seq":1,"rid":"b"}']
    trace.close()
