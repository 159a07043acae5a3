"""Sending the requests: bench_serving's sessions, arrival process and concurrency limit.

Requests go out in dataset order. With an infinite --request-rate all are created at once; otherwise
each waits an exponential gap (a Poisson process) after the one before. --max-concurrency is an asyncio
semaphore around each request, so a request may be created on time but sent later. A request's clock
starts when it is sent (after the semaphore), as bench_serving's does.

aiohttp, as bench_serving uses: its C parser costs about half of httpx's CPU per streamed chunk
(60 vs 120 µs measured here), and a client that competes for the cores slows the server it measures.
Each request opens a session of its own, as 0.5.22's request functions do (`async with
_create_bench_client_session()` in each `async_request_*` of `sglang/benchmark/serving.py`): its own
connection, closed when it ends, so no request is sent on a kept-alive connection the server is just
closing.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp
import numpy as np

from kvadmit.bench.backends import (
    Api,
    PayloadOptions,
    StreamError,
    StreamReader,
    asked_limits,
    build_payload,
)
from kvadmit.bench.datasets import DatasetRow
from kvadmit.bench.metrics import RequestOutcome

ERROR_BODY_CHARS = 300


@dataclass(slots=True)
class Exchange:
    """One request as the client saw it."""

    outcome: RequestOutcome
    text: str = ""
    server_prompt_tokens: int | None = None


READ_BUFFER_BYTES = 10 * 2**20  # a long answer's chunk (cumulative text) fits in one read
REQUEST_TIMEOUT_S = 6 * 60 * 60  # bench_serving's BENCH_AIOHTTP_TIMEOUT_SECONDS: 6 hours per request


def new_http_client() -> aiohttp.ClientSession:
    """The session of the bench's own calls (readiness, model info, cache flush, server info)."""
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=60.0),
        connector=aiohttp.TCPConnector(limit=0),
        read_bufsize=READ_BUFFER_BYTES,
    )


def new_request_session() -> aiohttp.ClientSession:
    """One request's own session, as bench_serving's `_create_bench_client_session`: a 6-hour total
    timeout and a 10 MB read buffer (aiohttp's default connector otherwise)."""
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S), read_bufsize=READ_BUFFER_BYTES
    )


def describe(e: BaseException) -> str:
    """An exception as one line: its type and first line."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def error_message(body: str) -> str:
    """The message of an error body in OpenAI's or FastAPI's shape, else the body itself."""
    try:
        obj = json.loads(body)
    except ValueError:
        return body
    if isinstance(obj, dict):
        inner = obj.get("error")
        for msg in (obj.get("message"), inner.get("message") if isinstance(inner, dict) else inner,
                    obj.get("detail")):  # fmt: skip
            if isinstance(msg, str) and msg:
                return msg
    return body


async def send_one(url: str, api: Api, row: DatasetRow, output_len: int, opts: PayloadOptions) -> Exchange:
    payload = build_payload(api, row.prompt, output_len, opts)
    out = RequestOutcome(prompt_len=row.prompt_len)
    out.max_new_tokens, out.ignore_eos = asked_limits(payload)
    if row.priority is not None:
        payload["priority"] = out.priority = row.priority
    sent = time.perf_counter()
    out.start_time = sent
    reader = StreamReader(api, sent, output_len)
    try:
        async with new_request_session() as http, http.post(url, json=payload) as resp:
            if resp.status != 200:
                body = (await resp.read()).decode("utf-8", "replace").strip()
                out.error = f"HTTP {resp.status}: {error_message(body)[:ERROR_BODY_CHARS]}"
                out.latency = time.perf_counter() - sent
                return Exchange(out)
            if opts.stream:
                async for line in resp.content:
                    reader.line(line.decode("utf-8"), time.perf_counter())
            else:
                body = (await resp.read()).decode("utf-8")
                reader.body(body, time.perf_counter())
    except (aiohttp.ClientError, asyncio.TimeoutError, StreamError, ValueError, KeyError, TypeError,
            AttributeError) as e:  # fmt: skip
        # ValueError: a chunk that is not JSON; the others: JSON of an unexpected shape
        out.error = str(e) if isinstance(e, StreamError) else describe(e)
        out.latency = time.perf_counter() - sent
        return Exchange(out)
    out.success = True
    out.latency = reader.latency
    out.ttft = reader.ttft or 0.0
    out.itl = reader.itl
    out.output_len = reader.completion_tokens
    out.cached_tokens = reader.cached_tokens or 0
    return Exchange(out, reader.text, reader.prompt_tokens)


@dataclass(frozen=True, slots=True)
class Traffic:
    request_rate: float = float("inf")
    max_concurrency: int | None = None


async def send_all(
    url: str,
    api: Api,
    rows: Sequence[DatasetRow],
    opts: PayloadOptions,
    traffic: Traffic,
    rng: np.random.RandomState,
    on_done: Callable[[Exchange], None],
    stop: asyncio.Event,
) -> list[Exchange | None]:
    """Every row's exchange in dataset order; None for those not finished when `stop` was set (their
    requests are cancelled, which closes their connections)."""
    limit = asyncio.Semaphore(traffic.max_concurrency) if traffic.max_concurrency else None
    tasks: list[asyncio.Task[Exchange]] = []

    async def one(row: DatasetRow) -> Exchange:
        made = time.perf_counter()
        ex = await limited(row)
        ex.outcome.arrival_time = made
        on_done(ex)
        return ex

    async def limited(row: DatasetRow) -> Exchange:
        if limit is None:
            ex = await send_one(url, api, row, row.output_len, opts)
        else:
            async with limit:
                ex = await send_one(url, api, row, row.output_len, opts)
        return ex

    async def create_all() -> None:
        for row in rows:
            tasks.append(asyncio.create_task(one(row)))
            if traffic.request_rate != float("inf"):
                await asyncio.sleep(float(rng.exponential(1.0 / traffic.request_rate)))
        await asyncio.gather(*tasks)

    everything = asyncio.create_task(create_all())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({everything, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if not everything.done():
        everything.cancel()
        for t in tasks:
            t.cancel()
        await asyncio.gather(everything, *tasks, return_exceptions=True)
    stopped.cancel()
    if everything.done() and not everything.cancelled() and everything.exception() is not None:
        raise everything.exception()  # type: ignore[misc]  # a bug, not a failed request
    results: list[Exchange | None] = [t.result() if t.done() and not t.cancelled() else None for t in tasks]
    results.extend([None] * (len(rows) - len(tasks)))
    return results
