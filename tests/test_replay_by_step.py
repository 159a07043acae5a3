"""Replay by step: a server's --trace-requests file replayed with `simulate --replay-arrival step` makes
every scheduling decision the server made, step for step (the log lines of both, with
--decode-log-interval 1, compared field by field, times and throughputs left out), retractions included
— while requests reached the real server whenever its HTTP thread handed them over."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kvadmit.observe.decisions import compare, decisions
from server_helpers import running_server, wait_idle, write_cost_model

FLAGS = ["--max-total-tokens", "600", "--decode-log-interval", "1"]


def serve_and_trace(tmp_path: Path, n: int, spread_s: float) -> tuple[list[str], Path]:
    cost = write_cost_model(tmp_path / "cost.json", decode_ms=1.0)
    trace = tmp_path / "trace.jsonl"
    argv = ["--simulate", cost, *FLAGS, "--trace-requests", str(trace)]
    with running_server(argv) as srv:

        async def one(i: int, client: httpx.AsyncClient) -> None:
            await asyncio.sleep(random.Random(100 + i).uniform(0, spread_s))  # arrivals during steps
            # 40-byte prompt; asks for 400 tokens, stops where the simulator's draw says: retractions
            body = {"prompt": f"{i:04d}" * 10, "max_tokens": 400, "seed": i}
            r = await client.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text

        async def run() -> None:
            async with httpx.AsyncClient(base_url=srv.url, timeout=300) as client:
                await asyncio.gather(*(one(i, client) for i in range(n)))

        asyncio.run(run())
        wait_idle(srv)
        lines = list(srv.log_lines)
    return lines, trace


def replay_by_step(trace: Path, tmp_path: Path, cost: str) -> list[str]:
    log = tmp_path / "sim.log"
    run = subprocess.run(
        [sys.executable, "-m", "kvadmit", "simulate", "--replay", str(trace), "--replay-arrival", "step",
         "--cost-model", cost, "--context-length", "8192", "--log-file", str(log), *FLAGS],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return log.read_text(encoding="utf-8").splitlines()


def test_a_server_trace_replayed_by_step_makes_the_same_decisions(tmp_path: Path) -> None:
    real_lines, trace = serve_and_trace(tmp_path, n=60, spread_s=0.5)
    rows = [json.loads(x) for x in trace.read_text().splitlines()]
    assert len(rows) == 60 and sorted(r["seq"] for r in rows) == list(range(60))
    assert all(len(r["input_ids"]) == r["prompt_len"] == 40 for r in rows)
    assert len({r["arrival_step"] for r in rows}) > 5  # arrivals spread over many steps
    real = decisions(real_lines)
    assert any(kind == "retract" for kind, _ in real), "the workload must retract"
    sim = decisions(replay_by_step(trace, tmp_path, str(tmp_path / "cost.json")))
    result = compare(real, sim)
    assert result.identical, result.describe()
    assert sum(r["retractions"] for r in rows) == sum(v[0] for k, v in real if k == "retract")


def test_replay_by_time_of_the_same_trace_is_allowed_and_by_step_needs_steps(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"arrival": 0, "prompt_len": 8, "max_new_tokens": 4}) + "\n")
    run = subprocess.run(
        [sys.executable, "-m", "kvadmit", "simulate", "--replay", str(trace), "--replay-arrival", "step",
         "--max-total-tokens", "600", "--quiet"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 2
    assert "needs arrival_step on every line" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"input_ids": [1, 2]}, "input_ids has 2 tokens but prompt_len is 8"),
        ({"input_ids": [1, -2, 3, 4, 5, 6, 7, 8]}, "input_ids must be a list of token ids"),
        ({"arrival_step": -1}, "arrival_step must be ≥ 0"),
    ],
)
def test_bad_trace_fields_name_the_line_and_field(row: dict, message: str) -> None:
    from kvadmit.sim.replay import ReplayError, parse_replay

    base = {"arrival": 0, "prompt_len": 8, "max_new_tokens": 4}
    with pytest.raises(ReplayError, match=message):
        parse_replay([json.dumps({**base, **row})])
