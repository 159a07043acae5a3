"""--enable-metrics adds SGLang 0.5.22's time stats to /generate's meta_info: the scheduler's in every chunk
(storage waits 0, forward_entry_time, prefill_finished_time, queue_time), the tokenizer manager's at the end
(request_received_ts, first_token_latency, api_server_dispatch_finish_ts, response_sent_to_client_ts,
request_finished_ts, decode_throughput), in SGLang's order; queue_time sums the waits around a retraction."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from kvadmit.executor.base import StepResult
from kvadmit.scheduler.events import Retraction
from kvadmit.server.request_times import RequestTimes, api_side
from server_helpers import RunningServer, running_server, write_cost_model

BASE = ["id", "finish_reason", "prompt_tokens", "weight_version", "num_retractions"]
SCHEDULER = ["storage_prefetch_wait", "storage_staging_wait", "forward_entry_time", "prefill_finished_time",
             "queue_time"]  # fmt: skip
COUNTS = ["reasoning_tokens", "completion_tokens", "cached_tokens", "cached_tokens_details"]
API = ["request_received_ts", "first_token_latency", "api_server_dispatch_finish_ts"]
DECODE_MS = 20.0


def _batch(kind: str, reqs: list[Any], chunked: Any = None) -> Any:
    return SimpleNamespace(kind=kind, reqs=reqs, chunked=chunked)


def test_queue_time_sums_the_waits_and_the_entry_times_are_the_first() -> None:
    a, b = SimpleNamespace(rid="a"), SimpleNamespace(rid="b")
    times = RequestTimes()
    times.arrived("a", 10.0)
    times.arrived("b", 10.5)
    assert times.meta("a") == {"storage_prefetch_wait": 0.0, "storage_staging_wait": 0.0, "queue_time": 0.0}
    # a prefill from 11.0 to 11.5: a's prompt done, b's first chunk only
    times.on_step(_batch("prefill", [a, b], chunked=b), StepResult([], 0.5), 11.5)
    assert times.meta("a") == {
        "storage_prefetch_wait": 0.0,
        "storage_staging_wait": 0.0,
        "forward_entry_time": 11.0,
        "prefill_finished_time": 11.5,
        "queue_time": 1.0,
    }
    times.on_step(_batch("prefill", [b]), StepResult([], 0.25), 12.0)  # b's last chunk, 11.75 to 12.0
    assert times.meta("b") == {
        "storage_prefetch_wait": 0.0,
        "storage_staging_wait": 0.0,
        "forward_entry_time": 11.0,
        "prefill_finished_time": 12.0,
        "queue_time": 0.5,
    }
    times.on_step(_batch("decode", [a, b]), StepResult([], 0.1), 12.1)  # decodes change nothing
    times.on_event(Retraction(("a",), 0, 0.5, 0.6, False, 0, 0), 13.0)  # a waits again from 13.0 …
    times.on_step(_batch("prefill", [a]), StepResult([], 0.5), 15.0)  # … to 14.5: 1.0 + 1.5
    assert times.meta("a") == {
        "storage_prefetch_wait": 0.0,
        "storage_staging_wait": 0.0,
        "forward_entry_time": 11.0,
        "prefill_finished_time": 11.5,
        "queue_time": 2.5,
    }
    times.forget("a")
    assert times.meta("a") is None  # fmt: skip


def test_api_side_fields() -> None:
    # received 100, handed over 100.5, first output 101, first chunk sent 101.25, ended 103, 5 tokens:
    # 4 tokens after the first in 2 s
    assert api_side(100.0, 100.5, 101.0, 101.25, 103.0, 5) == {
        "request_received_ts": 100.0, "first_token_latency": 1.0, "api_server_dispatch_finish_ts": 100.5,
        "response_sent_to_client_ts": 101.25, "request_finished_ts": 103.0, "decode_throughput": 2.0,
    }  # fmt: skip
    # one token: no decode throughput; not yet sent: no response_sent_to_client_ts
    assert api_side(100.0, 100.5, 101.0, None, 101.0, 1) == {
        "request_received_ts": 100.0, "first_token_latency": 1.0, "api_server_dispatch_finish_ts": 100.5,
        "request_finished_ts": 101.0,
    }  # fmt: skip


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    cost = write_cost_model(tmp_path_factory.mktemp("times") / "cost.json", decode_ms=DECODE_MS)
    with running_server(["--simulate", cost, "--enable-metrics", "--max-running-requests", "1"]) as s:
        yield s


def _generate(url: str, text: str, n: int) -> dict[str, Any]:
    body = {"text": text, "sampling_params": {"max_new_tokens": n, "ignore_eos": True}}
    r = httpx.post(f"{url}/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]


def test_a_request_carries_the_time_stats_in_sglang_order(srv: RunningServer) -> None:
    meta = _generate(srv.url, "time me", 11)
    assert list(meta) == [*BASE, *SCHEDULER, *COUNTS, "e2e_latency", *API, "request_finished_ts",
                          "decode_throughput", "response_sent_to_client_ts"]  # fmt: skip
    assert meta["storage_prefetch_wait"] == 0.0 and meta["storage_staging_wait"] == 0.0
    order = ["request_received_ts", "api_server_dispatch_finish_ts", "forward_entry_time",
             "prefill_finished_time", "request_finished_ts", "response_sent_to_client_ts"]  # fmt: skip
    stamps = [meta[k] for k in order]
    assert stamps == sorted(stamps), dict(zip(order, stamps, strict=True))
    assert 0 <= meta["queue_time"] < 0.5  # an idle server: straight into a batch
    assert 0 < meta["first_token_latency"] <= meta["e2e_latency"]
    # 10 decode steps of 20 ms after the first token: about 50 tokens/s (the server's own work slows it)
    assert 30 < meta["decode_throughput"] <= 1000 / DECODE_MS * 1.02


def test_the_second_of_two_waits_for_the_first(srv: RunningServer) -> None:
    async def both() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:

            async def one(text: str) -> dict[str, Any]:
                body = {"text": text, "sampling_params": {"max_new_tokens": 20, "ignore_eos": True}}
                return (await client.post("/generate", json=body)).json()["meta_info"]

            first = asyncio.create_task(one("first one"))
            await asyncio.sleep(0.05)
            second = asyncio.create_task(one("second one"))  # sent while the first runs
            return [await first, await second]

    first, second = asyncio.run(both())
    # --max-running-requests 1: the second waits while the first decodes 19 steps of 20 ms (0.38 s)
    assert first["queue_time"] < 0.2
    assert second["queue_time"] > 0.25
    assert second["forward_entry_time"] >= first["request_finished_ts"] - 0.05


def test_a_stream_has_the_scheduler_stats_in_every_chunk(srv: RunningServer) -> None:
    body = {"text": "stream me", "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}, "stream": True}
    chunks = []
    with httpx.stream("POST", f"{srv.url}/generate", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:])["meta_info"])
    assert len(chunks) == 4  # one per token, the last with the end (as SGLang sends them)
    assert list(chunks[0]) == [*BASE, *SCHEDULER, *COUNTS, "response_sent_to_client_ts"]
    assert all(list(c) == [*BASE, *SCHEDULER, *COUNTS] for c in chunks[1:-1])
    # the last: the first chunk's send time now among the end's fields
    assert list(chunks[-1]) == [*BASE, *SCHEDULER, *COUNTS, "e2e_latency", *API, "response_sent_to_client_ts",
                                "request_finished_ts", "decode_throughput"]  # fmt: skip
    assert chunks[-1]["response_sent_to_client_ts"] == chunks[0]["response_sent_to_client_ts"]
    assert len({c["forward_entry_time"] for c in chunks}) == 1


def test_without_enable_metrics_there_are_no_time_stats(tmp_path: Path) -> None:
    cost = write_cost_model(tmp_path / "cost.json")
    with running_server(["--simulate", cost]) as s:
        meta = _generate(s.url, "plain", 3)
    assert list(meta) == [*BASE, *COUNTS, "e2e_latency", "response_sent_to_client_ts"]
