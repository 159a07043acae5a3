"""`kvadmit bench` sends each request in a session of its own, as SGLang 0.5.22's bench_serving does
(`async with _create_bench_client_session()` inside every `async_request_*`): its own connection, never
one kept alive from an earlier request (which a server may be closing just as the next request goes out),
a 6-hour total timeout and a 10 MB read buffer."""

from __future__ import annotations

import asyncio
import json

import numpy as np
from aiohttp import web

from kvadmit.bench.backends import PayloadOptions
from kvadmit.bench.client import Traffic, new_request_session, send_all
from kvadmit.bench.datasets import DatasetRow


async def _serve_and_send(rows: int, concurrency: int) -> tuple[list[bool], list[object]]:
    peers: list[object] = []  # the client's (host, port) of each request's connection

    async def completions(request: web.Request) -> web.Response:
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername"))
        body = {
            "choices": [{"text": "ok", "index": 0}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2},
        }
        return web.Response(text=json.dumps(body), content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app, keepalive_timeout=75.0)  # the server would keep a connection open
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        results = await send_all(
            f"http://127.0.0.1:{port}/v1/completions", "completions",
            [DatasetRow(prompt="hi there", prompt_len=3, output_len=2) for _ in range(rows)],
            PayloadOptions(model="m", stream=False), Traffic(max_concurrency=concurrency),
            np.random.RandomState(0), lambda _: None, asyncio.Event(),
        )  # fmt: skip
    finally:
        await runner.cleanup()
    return [r is not None and r.outcome.success for r in results], peers


def test_each_request_has_a_connection_of_its_own_even_one_after_another() -> None:
    # one at a time: a shared keep-alive session would send all five on one connection
    ok, peers = asyncio.run(_serve_and_send(rows=5, concurrency=1))
    assert ok == [True] * 5
    assert len(peers) == 5 and len(set(peers)) == 5


def test_a_request_session_has_bench_servings_timeout_and_read_buffer() -> None:
    async def settings() -> tuple[float | None, int]:
        async with new_request_session() as s:
            return s.timeout.total, s._read_bufsize  # (aiohttp keeps the buffer size private)

    assert asyncio.run(settings()) == (6 * 60 * 60, 10 * 1024 * 1024)
