"""`serve --trace-requests` and `--trace-steps`: a trace that cannot be written (a full disk) stops
itself, with one log line; it never raises into the engine loop (which would leave requests unanswered).
Before anything starts, serve refuses one file for both traces, or a file it cannot open, naming the flag.
The request trace records each request's output budget as the scheduler granted it."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kvadmit.server.traces import TraceFile
from server_helpers import running_server, wait_idle, write_cost_model


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


def _serve(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    cost = tmp_path / "cost.json"
    cost.write_text('{"decode": {"base_ms": 1}}')
    return subprocess.run(
        [sys.executable, "-m", "kvadmit", "serve", "--simulate", str(cost), "--port", "0", *flags],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_one_file_for_both_traces_is_refused_before_anything_starts(tmp_path: Path) -> None:
    path = str(tmp_path / "t.jsonl")
    run = _serve(tmp_path, "--trace-requests", path, "--trace-steps", path)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert f"--trace-requests and --trace-steps both name {path!r}: give each its own file" in run.stderr
    assert not Path(path).exists()


def test_a_trace_that_cannot_be_opened_names_its_flag(tmp_path: Path) -> None:
    run = _serve(tmp_path, "--trace-steps", str(tmp_path / "missing" / "steps.jsonl"))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "--trace-steps: cannot write" in run.stderr and "No such file or directory" in run.stderr


def test_the_request_trace_records_the_budget_as_granted(tmp_path: Path) -> None:
    """max_new_tokens in --trace-requests is what the scheduler granted, not what the client asked; a
    request that asked for none and was turned away before the grant records null."""
    cost = write_cost_model(tmp_path / "cost.json", decode_ms=0.1)
    trace = tmp_path / "trace.jsonl"
    argv = ["--simulate", cost, "--max-total-tokens", "600", "--context-length", "8192",
            "--trace-requests", str(trace)]  # fmt: skip
    asks = {"explicit": (40, 5), "unset": (40, None), "too-long": (700, None)}
    with running_server(argv) as srv:
        with httpx.Client(base_url=srv.url, timeout=60) as client:
            for rid, (prompt_len, max_new) in asks.items():
                body = {"rid": rid, "input_ids": list(range(1, prompt_len + 1)),
                        "sampling_params": {"max_new_tokens": max_new}}  # fmt: skip
                r = client.post("/generate", json=body)
                assert r.status_code == (400 if rid == "too-long" else 200), r.text
        wait_idle(srv)
    rows = {row["rid"]: row for row in map(json.loads, trace.read_text().splitlines())}
    assert rows["explicit"]["max_new_tokens"] == 5
    # max_req_len = min(8192 − 1, 600 − 1) = 599: 599 − 40 − 1 = 558; the pool: 600 − 40 − 1 − 1 = 558
    assert rows["unset"]["max_new_tokens"] == 558
    # a 700-token prompt passes the context check (8192) but not max_req_len (599): refused before the grant
    assert rows["too-long"]["max_new_tokens"] is None
