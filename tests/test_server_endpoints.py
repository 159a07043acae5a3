"""The endpoints SGLang's routers read, in SGLang 0.5.22's shapes, on a `serve --simulate` server: the loads
(`/get_load`, `/v1/loads`), `/server_info`, `/v1/models`, HEAD, the profiler switches. The numbers come from
the requests the tests send: 5 requests of 40 tokens each with room for 3 running make 3 running and 2
waiting."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from server_helpers import RunningServer, running_server, until_load, write_cost_model

POOL = 4000
CONTEXT = 2048
PROMPT = 40  # tokens per request
MAX_NEW = 1000
DECODE_MS = 300.0  # each decode step sleeps this long: the state barely moves while the tests read it
CORE_KEYS = [
    "timestamp", "dp_rank", "num_running_reqs", "num_waiting_reqs", "num_waiting_uncached_tokens",
    "num_used_tokens", "num_total_tokens", "num_active_tokens", "num_prealloc_ready_tokens",
    "max_total_num_tokens", "max_running_requests", "token_usage", "gen_throughput", "cache_hit_rate",
    "utilization", "total_prefill_uncached_tokens", "total_prefill_busy_us", "decode_moments",
]  # fmt: skip
LEGACY_KEYS = ["rid", "http_worker_ipc", "dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens", "ts_tic"]


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[RunningServer]:
    cost = write_cost_model(tmp_path / "cost.json", decode_ms=DECODE_MS)
    argv = ["--simulate", cost, "--max-total-tokens", str(POOL), "--context-length", str(CONTEXT),
            "--max-running-requests", "3", "--served-model-name", "my-model", "--enable-metrics"]  # fmt: skip
    with running_server(argv) as s:
        yield s


def test_loads_of_an_idle_server(srv: RunningServer) -> None:
    rows = httpx.get(f"{srv.url}/get_load").json()
    assert len(rows) == 1 and list(rows[0]) == LEGACY_KEYS
    assert {k: v for k, v in rows[0].items() if k != "ts_tic"} == {
        "rid": None, "http_worker_ipc": None, "dp_rank": None, "num_reqs": 0, "num_waiting_reqs": 0,
        "num_tokens": 0,
    }  # fmt: skip
    body = httpx.get(f"{srv.url}/v1/loads").json()
    assert list(body) == ["timestamp", "version", "accelerator", "num_accelerators", "loads"]
    assert body["version"] == "0.5.22" and body["accelerator"] is None and body["num_accelerators"] == 1
    (load,) = body["loads"]
    assert list(load) == [*CORE_KEYS, "disaggregation", "queues"]
    assert load["dp_rank"] == 0 and load["max_total_num_tokens"] == POOL and load["max_running_requests"] == 3
    zero = ("num_running_reqs", "num_waiting_reqs", "num_used_tokens", "num_total_tokens", "token_usage",
            "total_prefill_uncached_tokens", "total_prefill_busy_us")  # fmt: skip
    assert all(load[k] == 0 for k in zero) and load["decode_moments"] is None
    assert load["disaggregation"]["mode"] == "null"
    assert load["queues"] == {"waiting": 0, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0}


def _prompt(i: int) -> list[int]:
    return [10 + i] * PROMPT  # no two requests share a prefix: nothing is served from the cache


async def _loaded(srv: RunningServer) -> dict[str, httpx.Response]:
    """Send 5 long requests, wait until 3 run and 2 wait, read the endpoints at once, then abort all."""
    async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
        sampling = {"max_new_tokens": MAX_NEW, "ignore_eos": True}
        bodies = [{"input_ids": _prompt(i), "sampling_params": sampling} for i in range(5)]
        sent = [asyncio.create_task(client.post("/generate", json=body)) for body in bodies]
        await until_load(client, running=3, waiting=2)
        await asyncio.sleep(2 * DECODE_MS / 1000)  # a decode step or more has run
        paths = ["/get_load", "/v1/loads", "/v1/loads?include=core", "/v1/loads?include=core,queues",
                 "/v1/loads?format=prometheus", "/v1/loads?dp_rank=1", "/v1/loads?include=bogus",
                 "/server_info"]  # fmt: skip
        answers = await asyncio.gather(*(client.get(p) for p in paths))
        await client.post("/abort_request", json={"abort_all": True})
        await asyncio.gather(*sent)
        return dict(zip(paths, answers, strict=True))


def test_loads_count_running_and_waiting_requests(srv: RunningServer) -> None:
    got = asyncio.run(_loaded(srv))
    row = got["/get_load"].json()[0]
    assert (row["num_reqs"], row["num_waiting_reqs"]) == (5, 2)
    # the 3 running hold their prompts and outputs so far; the 2 waiting count their prompts
    assert 3 * PROMPT + 2 * PROMPT <= row["num_tokens"] <= 3 * (PROMPT + MAX_NEW) + 2 * PROMPT

    (load,) = got["/v1/loads"].json()["loads"]
    assert (load["num_running_reqs"], load["num_waiting_reqs"], load["queues"]["waiting"]) == (3, 2, 2)
    used = load["num_used_tokens"]
    assert 3 * PROMPT < used <= 3 * (PROMPT + MAX_NEW)  # a decode step has run: more than the prompts
    assert load["num_total_tokens"] == load["num_active_tokens"] == used + 2 * PROMPT
    assert load["token_usage"] == round(used / POOL, 4)
    assert load["num_waiting_uncached_tokens"] == 2 * PROMPT  # nothing was a cache hit
    assert load["total_prefill_uncached_tokens"] == 3 * PROMPT  # only the running ones were prefilled
    steps, batch_sum, step_us, batch_sq, batch_x_us, generated = load["decode_moments"]
    assert steps >= 1 and batch_sum <= 3 * steps and generated == batch_sum
    assert step_us == steps * DECODE_MS * 1000  # the cost model's decode step, 300 ms whatever the batch
    assert batch_x_us == batch_sum * DECODE_MS * 1000 and batch_sq <= 3 * batch_sum

    assert list(got["/v1/loads?include=core"].json()["loads"][0]) == CORE_KEYS
    assert list(got["/v1/loads?include=core,queues"].json()["loads"][0]) == [*CORE_KEYS, "queues"]
    assert got["/v1/loads?dp_rank=1"].json()["loads"] == []
    bad = got["/v1/loads?include=bogus"]
    assert bad.status_code == 400 and "Invalid include sections: {'bogus'}" in bad.json()["message"]
    text = got["/v1/loads?format=prometheus"].text
    assert got["/v1/loads?format=prometheus"].headers["content-type"].startswith("text/plain")
    for line in ('# TYPE sglang_num_running_reqs gauge', 'sglang_num_running_reqs{dp_rank="0"} 3',
                 'sglang_num_waiting_reqs{dp_rank="0"} 2', 'sglang_queues_waiting{dp_rank="0"} 2',
                 f'sglang_max_total_num_tokens{{dp_rank="0"}} {POOL}',
                 'sglang_disagg_kv_transfer_speed_gb_s{dp_rank="0"} 0.0'):  # fmt: skip
        assert line in text.splitlines()
    assert "decode_moments" not in text  # a list is no gauge

    internal = got["/server_info"].json()["internal_states"][0]
    assert (internal["num_running_reqs"], internal["num_queue_reqs"]) == (3, 2)


def test_server_info_in_sglang_shape(srv: RunningServer) -> None:
    info = httpx.get(f"{srv.url}/server_info").json()
    assert httpx.get(f"{srv.url}/get_server_info").json().keys() == info.keys()
    assert info["model_path"] == "my-model"  # serve --simulate: the served name, never a file to fetch
    assert info["served_model_name"] == "my-model"
    assert (info["tp_size"], info["dp_size"], info["pp_size"]) == (1, 1, 1)
    assert info["version"] == "0.5.22" and info["frontend"] == "python"
    assert info["status"] == "ready" and info["max_total_num_tokens"] == POOL
    assert info["max_req_input_len"] == min(CONTEXT - 1, POOL - 1) - 5
    assert isinstance(info["launch_command"], str) and info["kv_events"] is None
    assert set(info["startup_time"]) == {"load_weight", "kv_cache_allocation", "scheduler_e2e", "cuda_graph"}
    (internal,) = info["internal_states"]
    assert internal["dp_size"] == 1 and internal["world_size"] == 1
    assert internal["effective_max_running_requests_per_dp"] == 3 and internal["max_total_num_tokens"] == POOL
    assert httpx.get(f"{srv.url}/model_info").json()["model_path"] == "my-model"


def test_launch_command_hides_the_api_key() -> None:
    from kvadmit.server.main import launch_command

    argv = ["kvadmit", "serve", "--api-key", "s3cret", "--port", "1", "--api-key=other"]
    assert launch_command(argv) == "kvadmit serve --api-key '<redacted>' --port 1 '--api-key=<redacted>'"


def test_simulated_model_path_defaults_to_the_served_name(tmp_path: Path) -> None:
    cost = write_cost_model(tmp_path / "cost.json")
    with running_server(["--simulate", cost, "--max-total-tokens", str(POOL)]) as s:
        info = httpx.get(f"{s.url}/server_info").json()
        card = httpx.get(f"{s.url}/v1/models").json()["data"][0]
    assert info["model_path"] == info["served_model_name"] == card["id"] == card["root"] == "simulated"


def test_models_in_sglang_shape(srv: RunningServer) -> None:
    body = httpx.get(f"{srv.url}/v1/models").json()
    assert body["object"] == "list"
    (card,) = body["data"]
    assert abs(card.pop("created") - time.time()) < 60
    assert card == {"id": "my-model", "object": "model", "owned_by": "sglang", "root": "my-model",
                    "parent": None, "max_model_len": CONTEXT}  # fmt: skip
    one = httpx.get(f"{srv.url}/v1/models/my-model").json()
    assert one["id"] == "my-model" and one["owned_by"] == "sglang"
    missing = httpx.get(f"{srv.url}/v1/models/other")
    assert missing.status_code == 404
    assert missing.json() == {"error": {"message": "The model 'other' does not exist",
                                        "type": "invalid_request_error", "param": "model",
                                        "code": "model_not_found"}}  # fmt: skip


def test_head_answers_where_sglang_does(srv: RunningServer) -> None:
    for path in ("/metrics", "/"):
        r = httpx.head(f"{srv.url}{path}")
        assert (r.status_code, r.content) == (200, b""), path
    # FastAPI's GET routes in SGLang answer HEAD with 405, and so does kvadmit
    assert httpx.head(f"{srv.url}/health").status_code == 405
    assert httpx.head(f"{srv.url}/v1/models").status_code == 405
    assert httpx.get(f"{srv.url}/").json() == "kvadmit is running (SGLang 0.5.22's API)"


def test_profile_switches_are_accepted(srv: RunningServer) -> None:
    start = httpx.post(f"{srv.url}/start_profile", json={"output_dir": "/nowhere", "num_steps": 5})
    assert start.status_code == 200
    assert start.text.startswith("Start profiling.") and "records no torch profile" in start.text
    assert httpx.get(f"{srv.url}/start_profile").status_code == 200
    stop = httpx.get(f"{srv.url}/stop_profile")
    assert stop.status_code == 200 and stop.text.startswith("Stop profiling.")
    assert httpx.post(f"{srv.url}/stop_profile").status_code == 200
    assert httpx.get(f"{srv.url}/version").status_code == 404  # 0.5.22 has no /version
