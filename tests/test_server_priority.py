"""The `priority` field on /generate, /v1/completions and /v1/chat/completions (docs/sglang-rules.md §13),
on `serve --simulate`: checked (an integer in SGLang's signed 64-bit range, else 400 naming it) and handed to
the scheduler, which orders, preempts or turns requests away by it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from server_helpers import RunningServer, running_server, wait_idle, write_cost_model


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
        urgent = post(
            s,
            "/generate",
            {"text": "b", "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}, "priority": 11},
        )
        assert urgent.status_code == 200 and urgent.json()["meta_info"]["completion_tokens"] == 2
        assert t.is_alive()  # answered while the 200-token stream still runs: it was preempted
        t.join(60)
        assert results == [200]


def test_metrics_carry_sglangs_priority_label(cost: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    argv = ["--simulate", cost, "--max-total-tokens", "4096", "--enable-metrics", "--decode-log-interval",
            "1", "--enable-priority-scheduling", "--default-priority-value", "3"]  # fmt: skip
    with running_server(argv) as s:
        native = {"text": "hi", "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}, "priority": 7}
        assert post(s, "/generate", native).status_code == 200
        completion = {"prompt": "hi", "max_tokens": 3, "ignore_eos": True}  # no priority: gets the default, 3
        assert post(s, "/v1/completions", completion).status_code == 200
        wait_idle(s)  # a request is answered before its step's report reaches the metrics
        text = httpx.get(f"{s.url}/metrics", timeout=10).text
    samples = [x for f in text_string_to_metric_families(text) for x in f.samples]

    def value(name: str, **labels: str) -> float:
        found = [x.value for x in samples if x.name == name and labels.items() <= x.labels.items()]
        assert len(found) == 1, (name, labels, found)
        return found[0]

    # the tokenizer side: the request's priority after the default
    assert value("sglang:num_requests_total", priority="7", is_streaming="false") == 1
    assert value("sglang:num_requests_total", priority="3", is_streaming="false") == 1
    # the scheduler side: "" on every series, and for the two queue counts a series per priority seen at a
    # report (each request ran in decode batches that reported, --decode-log-interval 1); idle now: 0
    assert value("sglang:num_queue_reqs", priority="") == 0
    assert value("sglang:token_usage", priority="") >= 0
    assert (
        value("sglang:num_running_reqs", priority="7") == 0
        and value("sglang:num_queue_reqs", priority="7") == 0
        and value("sglang:num_running_reqs", priority="3") == 0
    )
    assert all(
        "priority" in x.labels for x in samples if x.name.startswith("sglang:") and "model_name" in x.labels
    )
