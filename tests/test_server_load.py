"""Load on a real server: 1,000 requests at concurrency 128 across every endpoint (tiny model), a storm of
200 streams cut midway (--simulate), and SIGTERM. Every request completes or gets a clear error, no 5xx,
none is answered twice, and afterwards the whole pool is free."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from server_helpers import pool_is_whole, running_server, wait_idle, write_cost_model, write_tiny_model


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-load"), max_position_embeddings=512)


def _request(i: int, rng: random.Random) -> tuple[str, dict[str, Any], bool]:
    """A mix: native and OpenAI endpoints, streaming and not, greedy and sampled, some invalid."""
    n = rng.randint(1, 8)
    stream = rng.random() < 0.5
    kind = i % 4
    if i % 25 == 0:  # a client mistake: must be a 400, never a 5xx
        return "/v1/completions", {"prompt": "the", "max_tokens": 0}, False
    if kind == 0:
        sp = {"max_new_tokens": n, "temperature": rng.choice([0.0, 0.8]), "ignore_eos": True}
        text = "the quick " * rng.randint(1, 20)
        return "/generate", {"text": text, "sampling_params": sp, "stream": stream}, stream
    if kind == 1:
        return "/v1/completions", {"prompt": "over the lazy dog " * rng.randint(1, 10), "max_tokens": n,
                                   "stream": stream, "seed": i}, stream  # fmt: skip
    if kind == 2:
        msgs = [{"role": "user", "content": "fox " * rng.randint(1, 30)}]
        return "/v1/chat/completions", {"messages": msgs, "max_tokens": n, "stream": stream}, stream
    return "/v1/completions", {"prompt": [rng.randrange(1, 290) for _ in range(rng.randint(1, 64))],
                               "max_tokens": n, "ignore_eos": True, "stream": stream}, stream  # fmt: skip


async def _one(client: httpx.AsyncClient, path: str, body: dict[str, Any], stream: bool) -> tuple[int, int]:
    """(status, terminal events seen): a stream must end with exactly one [DONE]."""
    try:
        return await _one_inner(client, path, body, stream)
    except httpx.TransportError as e:
        raise AssertionError(f"transport error on {path}: {type(e).__name__}: {e}") from e


async def _one_inner(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], stream: bool
) -> tuple[int, int]:
    if not stream:
        r = await client.post(path, json=body)
        if r.status_code == 200:
            json.loads(r.text)
        return r.status_code, 1
    async with client.stream("POST", path, json=body) as r:
        done = 0
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done += 1
            elif line.startswith("data: "):
                assert done == 0, "data after [DONE]"
                json.loads(line[6:])
        return r.status_code, done if r.status_code == 200 else 1


def test_thousand_requests_at_concurrency_128(tiny_model: Path) -> None:
    argv = ["--model-path", str(tiny_model), "--max-total-tokens", "6000", "--dtype", "float32",
            "--enable-metrics"]  # fmt: skip
    rng = random.Random(1)
    requests = [_request(i, rng) for i in range(1000)]
    with running_server(argv) as srv:

        async def run() -> list[tuple[int, int]]:
            sem = asyncio.Semaphore(128)
            # The server closes a connection idle for 5 s (uvicorn's and SGLang's keep-alive); httpx's
            # own expiry is also 5 s, so a request sent on a connection the server is closing at that
            # instant fails with ReadError before the server sees it. A shorter client expiry is the
            # usual cure: the client always drops an idle connection first.
            limits = httpx.Limits(max_connections=128, keepalive_expiry=2.0)
            async with httpx.AsyncClient(base_url=srv.url, timeout=300, limits=limits) as client:

                async def bounded(req: tuple[str, dict[str, Any], bool]) -> tuple[int, int]:
                    async with sem:
                        return await _one(client, *req)

                return await asyncio.gather(*(bounded(r) for r in requests))

        results = asyncio.run(run())
        statuses = [s for s, _ in results]
        assert not [s for s in statuses if s >= 500], [
            (r, s) for r, s in zip(requests, statuses, strict=True) if s >= 500][:3]  # fmt: skip
        assert statuses.count(400) == 40  # the 40 invalid ones, and only those
        assert statuses.count(200) == 960
        assert all(done == 1 for _, done in results)
        wait_idle(srv)
        runner = srv.runner
        assert runner.call(lambda: (runner.submitted, runner.answered)).result(10) == (960, 960)
        free, size = pool_is_whole(srv)
        assert free == size == 6000


def test_disconnect_storm_frees_everything(tmp_path: Path) -> None:
    cost = write_cost_model(tmp_path / "cost.json", decode_ms=5.0)
    with running_server(["--simulate", cost, "--max-total-tokens", "200000", "--enable-metrics"]) as srv:

        async def cut(i: int, client: httpx.AsyncClient) -> int:
            body = {"prompt": f"request {i} " * 5, "max_tokens": 500, "ignore_eos": True, "stream": True}
            async with client.stream("POST", "/v1/completions", json=body) as r:
                chunks = 0
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        chunks += 1
                        if chunks == 3:
                            return chunks  # leaving the block closes the connection midway
            return chunks

        async def storm() -> list[int]:
            limits = httpx.Limits(max_connections=200)
            async with httpx.AsyncClient(base_url=srv.url, timeout=60, limits=limits) as client:
                return await asyncio.gather(*(cut(i, client) for i in range(200)))

        assert asyncio.run(storm()) == [3] * 200
        wait_idle(srv, timeout=30)
        runner = srv.runner
        assert runner.call(lambda: (runner.submitted, runner.answered)).result(10) == (200, 200)
        free, size = pool_is_whole(srv)
        assert free == size
        text = httpx.get(f"{srv.url}/metrics").text
        aborted = [ln for ln in text.splitlines() if ln.startswith("sglang:num_aborted_requests_total")]
        assert aborted and float(aborted[0].split()[-1]) == 200
        # Aborted, not run to their 500 tokens (how soon: the next test, one stream at a time).
        decoded = [ln for ln in text.splitlines() if ln.startswith("sglang:realtime_tokens_total")
                   and 'mode="decode"' in ln]  # fmt: skip
        assert decoded and float(decoded[0].split()[-1]) < 200 * 500 / 2


def test_a_cut_stream_is_aborted_within_a_step_or_two(tmp_path: Path) -> None:
    cost = write_cost_model(tmp_path / "cost.json", decode_ms=30.0)
    with running_server(["--simulate", cost, "--max-total-tokens", "4096", "--enable-metrics"]) as srv:
        body = {"prompt": "cut me", "max_tokens": 500, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{srv.url}/v1/completions", json=body, timeout=30) as r:
            chunks = 0
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunks += 1
                    if chunks == 3:
                        break
        wait_idle(srv, timeout=10)
        text = httpx.get(f"{srv.url}/metrics").text
        decoded = [ln for ln in text.splitlines() if ln.startswith("sglang:realtime_tokens_total")
                   and 'mode="decode"' in ln]  # fmt: skip
        # 1 token from the prefill + 2 decode steps seen by the client; the abort lands at the next
        # step's result (one more step may already be running when it arrives), and under the overlap loop
        # the step after it was scheduled before that result: SGLang counts its rows too (its batch size)
        assert 2 <= float(decoded[0].split()[-1]) <= 2 + 3


def test_sigterm_stops_admission_aborts_in_flight_with_a_reason_and_exits_0(tmp_path: Path) -> None:
    cost = write_cost_model(tmp_path / "slow.json", decode_ms=50.0)
    port = 30000 + os.getpid() % 1000 + 500
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvadmit.cli", "serve", "--simulate", cost, "--port", str(port),
         "--max-total-tokens", "10000", "--graceful-shutdown-timeout", "1", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "server did not start"
            time.sleep(0.1)
        lines: list[str] = []
        started = threading.Event()

        def long_stream() -> None:
            body = {"prompt": "x", "max_tokens": 2000, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as r:
                for line in r.iter_lines():
                    if line:
                        lines.append(line)
                        started.set()

        t = threading.Thread(target=long_stream)
        t.start()
        assert started.wait(10)
        proc.send_signal(signal.SIGTERM)
        t.join(30)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert lines[-1] == "data: [DONE]"
        error = json.loads(lines[-2][6:])
        assert error["error"]["message"] == "The server is shutting down."
    finally:
        if proc.poll() is None:
            proc.kill()
