"""Replay by step: a server's --trace-requests file replayed with `simulate --replay-arrival step` makes
every scheduling decision the server made, step for step (the log lines of both, with
--decode-log-interval 1, compared field by field, times and throughputs left out), retractions included
— while requests reached the real server whenever its HTTP thread handed them over."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from kvadmit.observe.decisions import compare, decisions
from server_helpers import running_server, wait_idle, write_cost_model

# Replay by step follows the non-overlap loop's step numbering (docs/simulate.md); the server runs it too.
FLAGS = ["--max-total-tokens", "600", "--decode-log-interval", "1", "--disable-overlap-schedule"]


def serve_and_trace(
    tmp_path: Path,
    n: int,
    spread_s: float,
    flags: list[str] = FLAGS,
    prompt: Callable[[int], str] = lambda i: f"{i:04d}" * 10,
    waves: int = 1,
    abort_every: int = 0,
    trace_steps: Path | None = None,
) -> tuple[list[str], Path]:
    """Requests to `serve --simulate` (1 ms decode steps) at random moments within `spread_s`, in `waves`
    separated by an idle engine; with `abort_every` k, every k-th client asks for all 400 tokens
    (ignore_eos: 400 ms and more of steps) and gives up after 100 ms, so its request has reached the
    engine and not ended (a client that gave up after 20 ms was at times dropped before the hand-over)."""
    cost = write_cost_model(tmp_path / "cost.json", decode_ms=1.0)
    trace = tmp_path / "trace.jsonl"
    argv = ["--simulate", cost, *flags, "--trace-requests", str(trace)]
    if trace_steps is not None:
        argv += ["--trace-steps", str(trace_steps)]
    with running_server(argv) as srv:

        async def one(i: int, client: httpx.AsyncClient) -> None:
            await asyncio.sleep(random.Random(100 + i).uniform(0, spread_s))  # arrivals during steps
            # asks for 400 tokens, stops where the simulator's draw says: with a small pool, retractions
            body = {"prompt": prompt(i), "max_tokens": 400, "seed": i}
            if abort_every and i % abort_every == abort_every - 1:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(
                        client.post("/v1/completions", json={**body, "ignore_eos": True}), 0.1
                    )
                return
            r = await client.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text

        async def run(first: int, last: int) -> None:
            async with httpx.AsyncClient(base_url=srv.url, timeout=300) as client:
                await asyncio.gather(*(one(i, client) for i in range(first, last)))

        per_wave = n // waves
        for w in range(waves):
            asyncio.run(run(w * per_wave, n if w == waves - 1 else (w + 1) * per_wave))
            wait_idle(srv)
        lines = list(srv.log_lines)
    return lines, trace


def simulate_by_step(
    trace: Path, tmp_path: Path, flags: list[str] = FLAGS, extra: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvadmit", "simulate", "--replay", str(trace), "--replay-arrival", "step",
         "--cost-model", str(tmp_path / "cost.json"), "--context-length", "8192",
         "--log-file", str(tmp_path / "sim.log"), *flags, *extra],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def replay_by_step(trace: Path, tmp_path: Path, flags: list[str] = FLAGS) -> list[str]:
    run = simulate_by_step(trace, tmp_path, flags)
    assert run.returncode == 0, run.stderr
    return (tmp_path / "sim.log").read_text(encoding="utf-8").splitlines()


def test_a_server_trace_replayed_by_step_makes_the_same_decisions(tmp_path: Path) -> None:
    real_lines, trace = serve_and_trace(tmp_path, n=60, spread_s=0.5)
    rows = [json.loads(x) for x in trace.read_text().splitlines()]
    assert len(rows) == 60 and sorted(r["seq"] for r in rows) == list(range(60))
    assert all(len(r["input_ids"]) == r["prompt_len"] == 40 for r in rows)
    assert len({r["arrival_step"] for r in rows}) > 5  # arrivals spread over many steps
    real = decisions(real_lines)
    assert any(kind == "retract" for kind, _ in real), "the workload must retract"
    sim = decisions(replay_by_step(trace, tmp_path))
    result = compare(real, sim)
    assert result.identical, result.describe()
    assert sum(r["retractions"] for r in rows) == sum(v[0] for k, v in real if k == "retract")


STATE = ("kind", "batch_size", "new_tokens", "cached_tokens", "running", "queue", "used_tokens",
         "new_token_ratio")  # fmt: skip


def test_the_servers_step_trace_and_its_replays_compare_one_to_one(tmp_path: Path) -> None:
    """`serve --trace-steps` and `simulate --trace-steps` of its replay by step: the same steps, row for
    row (batch and state after it); the server's executor part is the cost model's time for that batch
    (the simulated executor in real time), and each served step took at least that long."""
    served = tmp_path / "served-steps.jsonl"
    _, trace = serve_and_trace(tmp_path, n=40, spread_s=0.4, trace_steps=served, waves=2)
    run = simulate_by_step(trace, tmp_path, extra=("--trace-steps", str(tmp_path / "sim-steps.jsonl")))
    assert run.returncode == 0, run.stderr
    real = [json.loads(x) for x in served.read_text().splitlines()]
    sim = [json.loads(x) for x in (tmp_path / "sim-steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in real] == list(range(1, len(real) + 1)) and len(real) > 40
    assert [r["step"] for r in sim] == [r["step"] for r in real]
    assert any(r["kind"] == "prefill" for r in real) and any(r["kind"] == "decode" for r in real)
    rows = [json.loads(x) for x in trace.read_text().splitlines()]
    assert sum(r["retractions"] for r in rows) > 0
    for a, b in zip(real, sim, strict=True):
        assert {k: a[k] for k in STATE} == {k: b[k] for k in STATE}, (a, b)
        assert a["forward_s"] == b["seconds"] and a["seconds"] >= a["forward_s"] > 0
    # A step's time is its own: it fits between the end of the step before and its own end (an idle wait
    # or the commands before it are not in it).
    assert real[0]["t"] >= real[0]["seconds"]
    assert all(b["t"] - a["t"] >= b["seconds"] for a, b in itertools.pairwise(real))
    # ... and it began once the requests it found had been received (the trace's times are on one clock,
    # rounded to the µs): a start taken before the engine's idle wait would precede the request that
    # ended the wait.
    assert any(r["after_idle"] and r["arrival_step"] > 0 for r in rows), "no request came after an idle wait"
    for r in rows:
        step = real[r["arrival_step"]]  # the step after the one it arrived during
        assert step["t"] - step["seconds"] >= r["arrival"] - 2e-6, (r["seq"], step)


def test_pages_chunks_shared_prefixes_and_idle_passes_replay_step_for_step(tmp_path: Path) -> None:
    """Page size 4, prefills cut into 48-token chunks, prompts that share a 70-byte prefix (cache hits),
    and two waves with the engine idle between them (an idle pass resets the new-token ratio)."""
    flags = ["--max-total-tokens", "700", "--decode-log-interval", "1", "--page-size", "4",
             "--chunked-prefill-size", "48", "--disable-overlap-schedule"]  # fmt: skip
    real_lines, trace = serve_and_trace(
        tmp_path, n=50, spread_s=0.4, flags=flags, prompt=lambda i: "shared-prefix-" * 5 + f"{i:04d}" * 5,
        waves=2,
    )  # fmt: skip
    rows = [json.loads(x) for x in trace.read_text().splitlines()]
    assert any(r["after_idle"] and r["arrival_step"] > 0 for r in rows), "no request came after an idle pass"
    steps = [r["arrival_step"] for r in rows]
    assert len(set(steps)) < len(steps), "no two requests came after the same step"
    assert sum(r["cached_tokens"] for r in rows) > 0
    real = decisions(real_lines)
    assert any(kind == "retract" for kind, _ in real)
    result = compare(real, decisions(replay_by_step(trace, tmp_path, flags)))
    assert result.identical, result.describe()


def test_a_trace_with_aborted_requests_is_refused_step_for_step_with_the_reason(tmp_path: Path) -> None:
    _, trace = serve_and_trace(tmp_path, n=20, spread_s=0.2, abort_every=5)
    rows = [json.loads(x) for x in trace.read_text().splitlines()]
    assert any(r["finish"] == "abort" for r in rows)
    run = simulate_by_step(trace, tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "was aborted" in run.stderr and "replay it by time instead" in run.stderr


def test_replay_by_time_of_the_same_trace_is_allowed_and_by_step_needs_steps(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"arrival": 0, "prompt_len": 8, "max_new_tokens": 4}) + "\n")
    run = subprocess.run(
        [sys.executable, "-m", "kvadmit", "simulate", "--replay", str(trace), "--replay-arrival", "step",
         "--max-total-tokens", "600", "--quiet"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 2
    assert "t.jsonl:1: no arrival_step" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"input_ids": [1, 2]}, "input_ids has 2 tokens but prompt_len is 8"),
        ({"input_ids": [1, -2, 3, 4, 5, 6, 7, 8]}, "input_ids must be a list of token ids"),
        ({"arrival_step": -1}, "arrival_step must be ≥ 0"),
        ({"after_idle": "false"}, "after_idle must be true or false, got 'false'"),
    ],
)
def test_bad_trace_fields_name_the_line_and_field(row: dict, message: str) -> None:
    from kvadmit.sim.replay import ReplayError, parse_replay

    base = {"arrival": 0, "prompt_len": 8, "max_new_tokens": 4}
    with pytest.raises(ReplayError, match=message):
        parse_replay([json.dumps({**base, **row})])
