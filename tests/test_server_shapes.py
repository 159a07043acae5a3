"""/generate and OpenAI answers in SGLang 0.5.22's shapes, on `serve --simulate` (a byte-level tokenizer:
a prompt of n ASCII characters is n tokens): meta_info's fields in every chunk, cached tokens known from
the first chunk, a stream aborted by a full queue ending with an abort chunk, batches of prompts with
their rids and sampling params, num_retractions, continuous usage on OpenAI chunks, and return_logprob
refused where there is no model."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from server_helpers import RunningServer, running_server, until_load, wait_idle, write_cost_model

META_KEYS = ["id", "finish_reason", "prompt_tokens", "weight_version", "num_retractions", "reasoning_tokens",
             "completion_tokens", "cached_tokens", "cached_tokens_details"]  # fmt: skip


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    cost = write_cost_model(tmp_path_factory.mktemp("shapes") / "cost.json", decode_ms=1.0)
    with running_server(["--simulate", cost]) as s:
        yield s


def stream_chunks(url: str, path: str, body: dict[str, Any]) -> tuple[int, list[Any]]:
    """(status, the JSON events); the stream must end with [DONE]."""
    events: list[str] = []
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if line:
                assert line.startswith("data: ")
                events.append(line[6:])
        status = r.status_code
    assert events[-1] == "[DONE]"
    return status, [json.loads(e) for e in events[:-1]]


def test_stream_meta_info_has_sglang_fields_and_cached_tokens_from_first_chunk(srv: RunningServer) -> None:
    prompt = "the quick brown fox jumps"  # 25 bytes: 25 tokens
    sp = {"max_new_tokens": 5, "ignore_eos": True}
    first = httpx.post(f"{srv.url}/generate", json={"text": prompt, "sampling_params": sp}, timeout=60).json()
    meta = first["meta_info"]
    # SGLang stamps the first answer it sends (without --enable-metrics too)
    assert list(meta) == [*META_KEYS, "e2e_latency", "response_sent_to_client_ts"]
    assert meta["prompt_tokens"] == 25 and meta["completion_tokens"] == 5
    assert meta["weight_version"] == "default" and meta["num_retractions"] == 0
    assert meta["reasoning_tokens"] == 0
    # a fresh prompt: nothing cached, no details
    assert meta["cached_tokens"] == 0 and meta["cached_tokens_details"] is None
    # The same prompt again: its first 24 tokens come from the radix cache (a match stops one short of
    # the whole prompt, which must be computed to sample from), and every chunk says so.
    again = {"text": prompt, "sampling_params": sp, "rid": "again"}
    status, chunks = stream_chunks(srv.url, "/generate", again)
    assert status == 200
    assert [c["meta_info"]["completion_tokens"] for c in chunks][-1] == 5
    for c in chunks:
        m = c["meta_info"]
        assert m["id"] == "again" and m["prompt_tokens"] == 25 and m["num_retractions"] == 0
        assert m["cached_tokens"] == 24 and m["cached_tokens_details"] == {"device": 24, "host": 0}
    # the first chunk is stamped when it is sent; the others are not, nor is the last
    assert list(chunks[0]["meta_info"]) == [*META_KEYS, "response_sent_to_client_ts"]
    assert all(list(c["meta_info"]) == META_KEYS for c in chunks[1:-1])
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert list(chunks[-1]["meta_info"]) == [*META_KEYS, "e2e_latency"]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}


def test_batch_of_prompts_answers_in_order_with_rids_and_own_sampling_params(srv: RunningServer) -> None:
    sps = [{"max_new_tokens": n, "ignore_eos": True} for n in (1, 2, 3)]
    body = {"text": ["a", "bb", "ccc"], "rid": ["r1", "r2", "r3"], "sampling_params": sps}
    r = httpx.post(f"{srv.url}/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert [o["meta_info"]["id"] for o in out] == ["r1", "r2", "r3"]
    assert [o["meta_info"]["prompt_tokens"] for o in out] == [1, 2, 3]
    assert [o["meta_info"]["completion_tokens"] for o in out] == [1, 2, 3]
    assert [len(o["output_ids"]) for o in out] == [1, 2, 3]
    # token ids, one sampling_params for all, one rid string: prompt i is `{rid}_{i}`
    body = {"input_ids": [[65, 66], [67]], "rid": "batch", "sampling_params": {"max_new_tokens": 4,
                                                                            "ignore_eos": True}}  # fmt: skip
    out = httpx.post(f"{srv.url}/generate", json=body, timeout=60).json()
    assert [o["meta_info"]["id"] for o in out] == ["batch_0", "batch_1"]
    assert [o["meta_info"]["prompt_tokens"] for o in out] == [2, 1]
    assert [o["meta_info"]["completion_tokens"] for o in out] == [4, 4]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params", "1 entries for 2 prompt(s)"),
        ({"text": ["a", "b"], "rid": ["x"]}, "rid", "1 entries for 2 prompt(s)"),
        ({"text": ["a", "b"], "rid": ["x", "x"]}, "rid", "its own rid"),
        ({"text": [], "stream": True}, "text", "no prompt"),
        ({"text": []}, "text", "no prompt"),
        ({"input_ids": [], "stream": True}, "input_ids", "no prompt"),
    ],
)
def test_batch_that_does_not_add_up_is_a_400(srv: RunningServer, body: dict, param: str, words: str) -> None:
    r = httpx.post(f"{srv.url}/generate", json=body, timeout=60)
    assert r.status_code == 400
    assert r.json()["param"] == param and words in r.json()["message"]


def test_return_logprob_on_a_simulated_server_is_a_clear_400(srv: RunningServer) -> None:
    one, batch = {"text": "a", "return_logprob": True}, {"text": ["a", "b"], "return_logprob": [False, True]}
    for body in (one, batch):
        r = httpx.post(f"{srv.url}/generate", json=body, timeout=60)
        assert r.status_code == 400
        assert r.json()["param"] == "return_logprob" and "no model" in r.json()["message"]


def test_openai_continuous_usage_stats_puts_the_usage_so_far_on_every_chunk(srv: RunningServer) -> None:
    body = {"prompt": "hello", "max_tokens": 4, "ignore_eos": True,
            "stream_options": {"continuous_usage_stats": True}}  # fmt: skip
    status, chunks = stream_chunks(srv.url, "/v1/completions", body)
    assert status == 200
    assert chunks and all("usage" in c for c in chunks)
    done = [c["usage"]["completion_tokens"] for c in chunks]
    assert done == sorted(done) and done[-1] == 4 and done[0] >= 1
    assert all(c["usage"]["prompt_tokens"] == 5 for c in chunks)
    assert all(c["usage"]["total_tokens"] == 5 + c["usage"]["completion_tokens"] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    # without it: no usage on content chunks; include_usage alone adds one last usage chunk
    body["stream_options"] = {"include_usage": True}
    _, chunks = stream_chunks(srv.url, "/v1/completions", body)
    assert ["usage" in c for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4


def test_stream_aborted_by_a_full_queue_ends_with_an_abort_chunk(tmp_path: Path) -> None:
    cost = write_cost_model(tmp_path / "cost.json", decode_ms=5.0)
    argv = ["--simulate", cost, "--max-running-requests", "1", "--max-queued-requests", "1"]
    with running_server(argv) as srv:

        async def run() -> tuple[int, list[Any]]:
            long = {"sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
                running = asyncio.create_task(client.post("/generate", json={"text": "a", **long}))
                await until_load(client, running=1, waiting=0)  # the first runs (400 steps of 5 ms)
                waiting = asyncio.create_task(client.post("/generate", json={"text": "b", **long}))
                await until_load(client, running=1, waiting=1)  # the second waits: the queue is full
                result = await asyncio.to_thread(
                    stream_chunks, srv.url, "/generate", {"text": "c", "rid": "third"}
                )
                for t in (running, waiting):
                    assert (await t).status_code == 200
                return result

        status, chunks = asyncio.run(run())
    assert status == 200  # SGLang's stream has begun before the scheduler turns it away
    assert len(chunks) == 1
    meta = chunks[0]["meta_info"]
    assert meta["id"] == "third"
    assert meta["finish_reason"] == {"type": "abort", "message": "The request queue is full.",
                                     "status_code": 503}  # fmt: skip
    assert chunks[0]["output_ids"] == [] and meta["completion_tokens"] == 0


RETRACT = re.compile(r"KV cache pool is full\. Retract requests\. #retracted_reqs: (\d+)")


def test_num_retractions_counts_each_requests_retractions(tmp_path: Path) -> None:
    cost = write_cost_model(tmp_path / "cost.json", decode_ms=0.2)
    with running_server(["--simulate", cost, "--max-total-tokens", "600"]) as srv:

        async def run() -> list[dict]:
            async with httpx.AsyncClient(base_url=srv.url, timeout=300) as client:
                bodies = [{"text": f"{i:04d}" * 10, "sampling_params": {"max_new_tokens": 400,
                           "sampling_seed": i}} for i in range(60)]  # fmt: skip
                rs = await asyncio.gather(*(client.post("/generate", json=b) for b in bodies))
                return [r.json() for r in rs]

        answers = asyncio.run(run())
        retracted = sum(int(m.group(1)) for ln in srv.log_lines if (m := RETRACT.search(ln)))
    assert retracted > 0, "no retraction happened"
    counts = [a["meta_info"]["num_retractions"] for a in answers]
    assert sum(counts) == retracted  # every retraction the scheduler logged lands on its request
    assert max(counts) >= 1


def test_a_streamed_batch_interleaves_its_prompts_each_with_its_index(srv: RunningServer) -> None:
    sps = [{"max_new_tokens": n, "ignore_eos": True} for n in (3, 1, 2)]
    body = {"text": ["one", "two!", "three"], "rid": ["s0", "s1", "s2"], "sampling_params": sps}
    status, chunks = stream_chunks(srv.url, "/generate", body)  # ends with one [DONE]
    assert status == 200
    assert all(list(c)[-1] == "index" for c in chunks)  # SGLang adds it last
    by_index: dict[int, list[Any]] = {0: [], 1: [], 2: []}
    for c in chunks:
        by_index[c["index"]].append(c)
    for i, n in enumerate((3, 1, 2)):
        own = by_index[i]
        assert len(own) == n  # a chunk per token, the last one with the end (as SGLang sends them)
        assert {c["meta_info"]["id"] for c in own} == {f"s{i}"}
        assert [len(c["output_ids"]) for c in own] == [*range(1, n + 1)]
        assert [len(c["text"]) for c in own] == [*range(1, n + 1)]  # cumulative, one byte a token
        assert all(c["meta_info"]["finish_reason"] is None for c in own[:-1])
        assert own[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": n}
        assert own[-1]["meta_info"]["prompt_tokens"] == len(body["text"][i])


def test_leaving_a_streamed_batch_aborts_every_prompt(srv: RunningServer) -> None:
    body = {"text": ["long a", "long b"], "sampling_params": {"max_new_tokens": 30000, "ignore_eos": True},
            "stream": True}  # fmt: skip
    with httpx.stream("POST", f"{srv.url}/generate", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # one event, then the client goes away
    wait_idle(srv, timeout=10)  # both ended long before their 30,000 tokens (30 s at 1 ms a step)
