"""`kvadmit simulate --replay`: requests sent at their own times with their own lengths."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvadmit.bench.workload import WorkloadSpec
from kvadmit.config import ServerArgs
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.sim.replay import ReplayError, parse_replay
from kvadmit.sim.run import SimConfig, simulate


def test_replaying_a_runs_own_request_trace_reproduces_it_request_by_request() -> None:
    base = SimConfig(
        args=ServerArgs(max_total_tokens=8192, disable_overlap_schedule=True),  # a run that retracts
        workload=WorkloadSpec(num_prompts=200, input_len=128, output_len=512, range_ratio=0.5,
                              ignore_eos=False),
        cost=CostModel.simple(decode_step_ms=20, prefill_tokens_per_s=10_000),
        request_rate=8.0,
    )  # fmt: skip
    first = io.StringIO()
    original = simulate(base, request_trace=first)
    assert original.retractions > 0  # the replay must also retract the same requests at the same steps
    replay = parse_replay(first.getvalue().splitlines())
    again = io.StringIO()
    replayed = simulate(SimConfig(**{**{f: getattr(base, f) for f in base.__slots__}, "replay": replay,
                                     "request_rate": float("inf")}), request_trace=again)  # fmt: skip
    a = [json.loads(line) for line in first.getvalue().splitlines()]
    b = [json.loads(line) for line in again.getvalue().splitlines()]
    assert [r["output_len"] for r in a] == [r["output_len"] for r in b]
    assert [r["ttft"] for r in a] == pytest.approx([r["ttft"] for r in b], abs=2e-6)
    assert replayed.retractions == original.retractions


def test_lengths_come_from_the_trace() -> None:
    replay = parse_replay([
        '{"arrival": 0.5, "prompt_len": 10, "max_new_tokens": 50, "output_len": 7}',
        '{"arrival": 0.0, "prompt_len": 20, "max_new_tokens": 50, "true_output_len": 9, "output_len": 3}',
        '{"arrival": 1.0, "prompt_len": 30, "max_new_tokens": 40, "ignore_eos": true, "output_len": 5}',
        '{"arrival": 2.0, "prompt_len": 40, "max_new_tokens": 60}',
    ])  # fmt: skip
    # Sorted by arrival; true_output_len is preferred; ignore_eos runs to max_new_tokens; no length
    # known: it stops by length.
    assert replay.arrivals == (0.0, 0.5, 1.0, 2.0)
    assert [(r.prompt_len, r.max_new_tokens, r.true_output_len, r.ignore_eos) for r in replay.requests] == [
        (20, 50, 9, False), (10, 50, 7, False), (30, 40, None, True), (40, 60, 60, False)]  # fmt: skip
    assert replay.rids == ("line-2", "line-1", "line-3", "line-4")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "trace:1: not JSON"),
        ('{"prompt_len": 5, "max_new_tokens": 5}', "trace:1: arrival must be a number"),
        ('{"arrival": 0, "prompt_len": 0, "max_new_tokens": 5}', "trace:1: prompt_len must be ≥ 1"),
        (
            '{"arrival": 0, "prompt_len": 5, "max_new_tokens": 2.5}',
            "trace:1: max_new_tokens must be an integer",
        ),
    ],
)
def test_a_bad_line_is_named(line: str, message: str) -> None:
    with pytest.raises(ReplayError, match=message):
        parse_replay([line])


def test_the_cli_replays_a_trace_and_names_a_bad_one(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(
        json.dumps({"rid": f"x{i}", "arrival": i * 0.25, "prompt_len": 64, "max_new_tokens": 32,
                    "output_len": 8 + i, "ignore_eos": False}) + "\n" for i in range(6)))  # fmt: skip
    out = tmp_path / "out.jsonl"
    run = subprocess.run(
        [sys.executable, "-m", "kvadmit", "simulate", "--max-total-tokens", "4096", "--replay", str(trace),
         "--trace-requests", str(out), "--quiet", "--warmup-requests", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["output_len"] for r in rows] == [8, 9, 10, 11, 12, 13]
    assert [r["arrival"] for r in rows] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25]
    trace.write_text('{"arrival": -1, "prompt_len": 5, "max_new_tokens": 5}\n')
    bad = subprocess.run(
        [sys.executable, "-m", "kvadmit", "simulate", "--max-total-tokens", "4096", "--replay", str(trace)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "t.jsonl:1: arrival must be a number of seconds ≥ 0" in bad.stderr


def test_a_bench_run_replays_with_its_arrivals_and_its_concurrency_limit() -> None:
    run = {"max_concurrency": 2, "start_times": [0.0, 0.1, 2.0], "arrival_times": [0.0, 0.0, 0.0],
           "input_lens": [10, 20, 30], "output_lens": [5, 0, 7], "max_new_tokens": [8, 8, 7],
           "ignore_eos": [False, False, True], "errors": ["", "HTTP 500: boom", ""]}  # fmt: skip
    replay = parse_replay([json.dumps(run)])
    # The failed request is left out; the others arrive when the client made them and wait for one of
    # the two slots, as the client did.
    assert replay.arrivals == (0.0, 0.0) and replay.max_concurrency == 2
    assert [(r.prompt_len, r.max_new_tokens, r.true_output_len, r.ignore_eos) for r in replay.requests] == [
        (10, 8, 5, False), (30, 7, None, True)]  # fmt: skip
    older = {k: v for k, v in run.items() if k not in ("arrival_times", "max_new_tokens", "ignore_eos")}
    replay = parse_replay([json.dumps(older)])
    # Without arrival times: sent when they were really sent, no limit; the output length is the budget.
    assert replay.arrivals == (0.0, 2.0) and replay.max_concurrency is None
    assert [(r.max_new_tokens, r.true_output_len) for r in replay.requests] == [(5, 5), (7, 7)]
    with pytest.raises(ReplayError, match="more than one bench run"):
        parse_replay([json.dumps(run), json.dumps(run)])
    with pytest.raises(ReplayError, match="input_lens has 2 entries, not 3"):
        parse_replay([json.dumps({**run, "input_lens": [1, 2]})])


def test_a_request_latency_delays_when_the_scheduler_sees_a_request() -> None:
    # One 100-token request alone: a 10 ms prefill at 10,000 tokens/s gives its first token.
    replay = parse_replay(['{"arrival": 0, "prompt_len": 100, "max_new_tokens": 3, "output_len": 3}'])
    base = SimConfig(args=ServerArgs(max_total_tokens=4096), workload=WorkloadSpec(),
                     cost=CostModel.simple(decode_step_ms=20, prefill_tokens_per_s=10_000),
                     warmup_requests=0, replay=replay)  # fmt: skip
    assert simulate(base).outcomes[0].ttft == pytest.approx(0.010)
    late = SimConfig(**{**{f: getattr(base, f) for f in base.__slots__}, "request_latency_s": 0.004})
    # Seen 4 ms after it was sent: the TTFT, counted from the send, grows by as much.
    assert simulate(late).outcomes[0].ttft == pytest.approx(0.014)
