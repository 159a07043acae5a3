"""The `priority` field on /generate, /v1/completions and /v1/chat/completions (docs/sglang-rules.md §13),
on `serve --simulate`: checked (an integer in SGLang's signed 64-bit range, else 400 naming it) and handed to
the scheduler, which orders, preempts or turns requests away by it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from server_helpers import RunningServer, running_server, write_cost_model


@pytest.fixture(scope="module")
def cost(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_cost_model(tmp_path_factory.mktemp("cost") / "cost.json", decode_ms=1.0)


@pytest.fixture(scope="module")
def srv(cost: str) -> Iterator[RunningServer]:
    argv = ["--simulate", cost, "--max-total-tokens", "4096", "--abort-on-priority-when-disabled"]
    with running_server(argv) as s:
        yield s


def post(srv: RunningServer, path: str, body: object) -> httpx.Response:
    return httpx.post(f"{srv.url}{path}", json=body, timeout=30)


BODIES = {
    "/generate": {"text": "hi", "sampling_params": {"max_new_tokens": 2}},
    "/v1/completions": {"prompt": "hi", "max_tokens": 2},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
}


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize(
    ("priority", "says"),
    [
        ("high", "priority must be an integer, got 'high'"),
        (1.5, "priority must be an integer, got 1.5"),
        (True, "priority must be an integer, got True"),
        (
            1 << 63,
            "priority must be a signed 64-bit integer between -9223372036854775808 and 9223372036854775807",
        ),
    ],
)
def test_a_priority_that_is_not_a_64_bit_integer_is_a_400(
    srv: RunningServer, path: str, priority: object, says: str
) -> None:
    r = post(srv, path, {**BODIES[path], "priority": priority})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == says and r.json()["error"]["param"] == "priority"


@pytest.mark.parametrize("path", list(BODIES))
def test_with_priorities_off_the_server_aborts_a_request_that_has_one(srv: RunningServer, path: str) -> None:
    r = post(srv, path, {**BODIES[path], "priority": -(1 << 63)})
    assert r.status_code == 503, r.text
    assert (
        "Using priority is disabled for this server. Please send a new request without a priority." in r.text
    )
    assert post(srv, path, BODIES[path]).status_code == 200
    assert post(srv, path, {**BODIES[path], "priority": None}).status_code == 200


def test_an_urgent_request_preempts_a_running_one_over_http(tmp_path: Path) -> None:
    # One request slot, held by a 200-token stream at priority 0. A request at priority 11 preempts it
    # and is answered while the stream still runs; the stream resumes (recomputed) and ends with 200.
    slow = write_cost_model(tmp_path / "slow.json", decode_ms=20.0)
    argv = ["--simulate", slow, "--max-total-tokens", "4096", "--max-running-requests", "1",
            "--enable-priority-scheduling"]  # fmt: skip
    with running_server(argv) as s:
        first_token = threading.Event()
        results: list[int] = []

        def long_stream() -> None:
            body = {"prompt": "a", "max_tokens": 200, "ignore_eos": True, "stream": True, "priority": 0}
            with httpx.stream("POST", f"{s.url}/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        first_token.set()
                results.append(r.status_code)

        t = threading.Thread(target=long_stream)
        t.start()
        assert first_token.wait(10)
        urgent = post(s, "/generate", {"text": "b", "sampling_params": {"max_new_tokens": 2}, "priority": 11})
        assert urgent.status_code == 200 and urgent.json()["meta_info"]["completion_tokens"] == 2
        assert t.is_alive()  # answered while the 200-token stream still runs: it was preempted
        t.join(60)
        assert results == [200]
