"""Bad requests get 400 with an OpenAI-style error naming the field and what is allowed; a full queue
503; a wrong API key 401; a dead or stalled engine loop makes /health answer 503. Never a 500 for a
client mistake. Runs on `serve --simulate` (byte-level tokenizer: n ASCII characters are n tokens)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from server_helpers import RunningServer, pool_is_whole, running_server, wait_idle, write_cost_model


@pytest.fixture(scope="module")
def cost(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_cost_model(tmp_path_factory.mktemp("cost") / "cost.json", decode_ms=1.0)


@pytest.fixture(scope="module")
def srv(cost: str) -> Iterator[RunningServer]:
    with running_server(["--simulate", cost, "--max-total-tokens", "256", "--context-length", "1000"]) as s:
        yield s


def post(srv: RunningServer, path: str, body: object, **kw: object) -> httpx.Response:
    return httpx.post(f"{srv.url}{path}", json=body, timeout=30, **kw)  # type: ignore[arg-type]


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"]["code"] == status and body["error"]["message"] == body["message"]
    return body["error"]


def test_malformed_json_and_wrong_types(srv: RunningServer) -> None:
    r = httpx.post(f"{srv.url}/v1/completions", content=b'{"prompt": "hi", ', timeout=10,
                   headers={"content-type": "application/json"})  # fmt: skip
    assert "not valid JSON" in error_of(r, 400)["message"]
    err = error_of(post(srv, "/v1/completions", {"prompt": "hi", "max_tokens": "lots"}), 400)
    assert err["param"] == "max_tokens" and "integer" in err["message"]
    err = error_of(post(srv, "/v1/chat/completions", {"messages": "hi"}), 400)
    assert err["param"] == "messages"
    assert "field required" in error_of(post(srv, "/v1/completions", {"max_tokens": 3}), 400)["message"]
    bad_key = {"text": "hi", "sampling_params": {"max_new_tokens": 3, "tempo": 1}}
    err = error_of(post(srv, "/generate", bad_key), 400)
    assert "tempo" in err["message"] and "temperature" in err["message"]  # names the allowed keys
    error_of(post(srv, "/generate", {"sampling_params": {}}), 400)  # neither text nor input_ids
    asks = [(-1, "must be ≥ 0, got -1"), (-1.0, "must be ≥ 0, got -1"), (2.5, "must be an integer, got 2.5")]
    for value, says in asks:
        body = {"text": "hi", "sampling_params": {"max_new_tokens": value}}
        err = error_of(post(srv, "/generate", body), 400)
        assert err["message"] == f"max_new_tokens {says}" and err["param"] == "max_new_tokens"


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("max_tokens", 0, "max_tokens must be at least 1, got 0"),
        ("max_tokens", -5, "max_tokens must be at least 1, got -5"),
        ("temperature", -0.5, "temperature must be ≥ 0"),
        ("top_p", 0, "top_p must be in (0, 1]"),
        ("top_p", 1.5, "top_p must be in (0, 1]"),
        ("top_k", 0, "top_k must be −1 (all) or ≥ 1"),
        ("n", 2, "n must be 1"),
    ],
)
def test_out_of_range_sampling(srv: RunningServer, field: str, value: object, says: str) -> None:
    err = error_of(post(srv, "/v1/completions", {"prompt": "hi", "max_tokens": 3, field: value}), 400)
    assert says in err["message"]
    assert err["param"] == field


def test_prompt_longer_than_the_context(srv: RunningServer) -> None:
    err = error_of(post(srv, "/v1/completions", {"prompt": "x" * 1000, "max_tokens": 1}), 400)
    assert "The input (1000 tokens) is longer than the model's context length (1000 tokens)" in err["message"]
    err = error_of(post(srv, "/v1/completions", {"prompt": "x" * 900, "max_tokens": 100}), 400)
    assert "maximum context length of 1000 tokens" in err["message"]
    assert "a total of 1000 tokens: 900 tokens from the input messages and 100 tokens" in err["message"]
    # Without a max_tokens (chat), a prompt longer than the pool can still never run: the scheduler says so.
    long_chat = {"messages": [{"role": "user", "content": "x" * 300}]}
    err = error_of(post(srv, "/v1/chat/completions", long_chat), 400)
    assert "exceeds the maximum allowed length" in err["message"]


def test_prompt_plus_max_tokens_that_can_never_fit_the_pool(srv: RunningServer) -> None:
    # Pool 256, page 1: a prompt of 100 tokens may ask for at most 256 − 100 − 1 − 1 = 154 new tokens
    # (the scheduler keeps prompt + max_new + one page strictly below the pool).
    ok = post(srv, "/v1/completions", {"prompt": "y" * 100, "max_tokens": 154, "ignore_eos": True})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 154
    err = error_of(post(srv, "/v1/completions", {"prompt": "y" * 98, "max_tokens": 157}), 400)
    assert "prompt 98 tokens + max_tokens 157 + one page (1) = 256 tokens, but the pool holds 256" in err[
        "message"]  # fmt: skip
    assert "at most 156 tokens" in err["message"]
    native = {"text": "y" * 98, "sampling_params": {"max_new_tokens": 157}}
    err = error_of(post(srv, "/generate", native), 400)
    assert err["param"] == "max_new_tokens"


def test_queue_full_is_503_and_nothing_leaks(cost: str, tmp_path: Path) -> None:
    slow = write_cost_model(tmp_path / "slow.json", decode_ms=20.0)
    argv = ["--simulate", slow, "--max-total-tokens", "4096", "--max-running-requests", "1",
            "--max-queued-requests", "1"]  # fmt: skip
    with running_server(argv) as s:
        body = {"prompt": "a", "max_tokens": 60, "ignore_eos": True, "stream": True}
        first_token = threading.Event()
        results: list[int] = []

        def long_stream() -> None:
            with httpx.stream("POST", f"{s.url}/v1/completions", json=body, timeout=30) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        first_token.set()
                results.append(r.status_code)

        t1 = threading.Thread(target=long_stream)
        t1.start()
        assert first_token.wait(10)  # running: the request cap is reached
        queued = threading.Thread(target=lambda: results.append(post(s, "/v1/completions", {
            "prompt": "b", "max_tokens": 2, "ignore_eos": True}).status_code))  # fmt: skip
        queued.start()
        deadline = time.monotonic() + 10
        while s.runner.call(lambda: len(s.runner.scheduler.waiting)).result(5) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        err = error_of(post(s, "/v1/completions", {"prompt": "c", "max_tokens": 2}), 503)
        assert err["message"] == "The request queue is full."
        t1.join(30)
        queued.join(30)
        assert sorted(results) == [200, 200]
        wait_idle(s)
        free, size = pool_is_whole(s)
        assert free == size


def test_api_key(cost: str) -> None:
    with running_server(["--simulate", cost, "--max-total-tokens", "4096", "--api-key", "sekrit"]) as s:
        body = {"prompt": "hi", "max_tokens": 2}
        err = error_of(httpx.post(f"{s.url}/v1/completions", json=body), 401)
        assert "API key" in err["message"]
        wrong = {"Authorization": "Bearer nope"}
        error_of(httpx.post(f"{s.url}/v1/completions", json=body, headers=wrong), 401)
        ok = httpx.post(f"{s.url}/v1/completions", json=body, headers={"Authorization": "Bearer sekrit"})
        assert ok.status_code == 200
        assert httpx.get(f"{s.url}/health").status_code == 200  # health checks need no key


def test_client_disconnect_aborts_and_frees(srv: RunningServer) -> None:
    body = {"prompt": "z" * 20, "max_tokens": 150, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{srv.url}/v1/completions", json=body, timeout=30) as r:
        got = 0
        for line in r.iter_lines():
            if line.startswith("data: {"):
                got += 1
                if got == 3:
                    break  # the client goes away mid-stream
    wait_idle(srv, timeout=10)
    free, size = pool_is_whole(srv)
    assert free == size


class _Broken:
    def run(self, batch: object) -> object:
        raise RuntimeError("device lost")


class _Stuck:
    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def run(self, batch: object) -> object:
        self.entered.set()
        self.release.wait(30)
        raise RuntimeError("released")


def test_health_503_when_the_engine_loop_dies(cost: str) -> None:
    with running_server(["--simulate", cost, "--max-total-tokens", "4096"]) as s:
        assert httpx.get(f"{s.url}/health").status_code == 200
        s.runner.engine.executor = _Broken()
        r = post(s, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 500 and "device lost" in r.json()["message"]  # a server fault, said so
        h = httpx.get(f"{s.url}/health")
        assert h.status_code == 503 and "engine loop died" in h.text
        err = error_of(post(s, "/v1/completions", {"prompt": "hi", "max_tokens": 2}), 503)
        assert "The engine loop is not running (RuntimeError: device lost)" in err["message"]


def test_health_503_when_no_progress_while_work_is_pending(cost: str) -> None:
    with running_server(["--simulate", cost, "--max-total-tokens", "4096", "--watchdog-timeout", "0.3"]) as s:
        stuck = _Stuck()
        s.runner.engine.executor = stuck
        t = threading.Thread(target=lambda: post(s, "/v1/completions", {"prompt": "hi", "max_tokens": 2}))
        t.start()
        # Time the stall from the moment a step is stuck, not from the post: on a loaded machine
        # the request can take longer than the watchdog timeout to reach the engine.
        assert stuck.entered.wait(10)
        time.sleep(0.8)
        h = httpx.get(f"{s.url}/health", timeout=10)
        assert h.status_code == 503 and "no step completed" in h.text
        stuck.release.set()
        t.join(30)
