"""Two and four `kvadmit serve --simulate` workers behind the real routers (sglang-router 0.3.2 and smg
1.13.0), each as its own process on 127.0.0.1. Each worker's /metrics says how many requests it answered
(`sglang:num_requests`); those counts say where the router sent each request."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fleet_helpers import (
    ROUTERS,
    Proc,
    requests_counted,
    router_loads,
    running,
    running_router,
    send_all,
    wait_idle,
)

POLICIES = ("round_robin", "cache_aware", "power_of_two")
SIZES = pytest.mark.parametrize("workers", [2, 4], indirect=True, ids=["2w", "4w"])


def short(i: int) -> dict[str, Any]:
    return {"model": "simulated", "prompt": f"request {i}: tell me about the number {i * 7919}",
            "max_tokens": 4, "ignore_eos": True}  # fmt: skip


def delta(before: list[int], after: list[int]) -> list[int]:
    return [a - b for a, b in zip(after, before, strict=True)]


@SIZES
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("router", ROUTERS)
def test_every_request_is_answered_once(
    router: str, policy: str, workers: list[Proc], tmp_path: Path
) -> None:
    n = 48  # a multiple of 2 and 4: round robin gives each worker exactly n / workers
    with running_router(router, workers, policy, tmp_path) as r:
        before = requests_counted(workers)
        answers = send_all(r.url, [short(i) for i in range(n)], concurrency=8)
        wait_idle(workers)
        split = delta(before, requests_counted(workers))
        loads = router_loads(router, r.url)
    print(f"{router} {policy} {len(workers)} workers: split {split}")
    assert [status for status, _ in answers] == [200] * n, answers
    assert all(body["usage"]["completion_tokens"] == 4 for _, body in answers)
    assert sum(split) == n, split  # each request answered by exactly one worker, none twice
    assert sorted(loads) == sorted(w.url for w in workers)
    assert all(load >= 0 for load in loads.values()), loads  # -1 is a router's "could not read the load"
    if policy == "round_robin":
        assert split == [n // len(workers)] * len(workers)


# smg 1.13.0's power_of_two (its default load metric, expected_wait) scores a worker (queued tokens + 1024
# per request sent since the last poll) / its reported gen_throughput + a KV-pressure term. It kept feeding a
# busy worker while kvadmit's /v1/loads held each worker's last decode window forever; with 0.5.22's values
# (0 while idle and once the window is 30 s old, the window restored by the next prefill report, the first
# window counted from the start: tests/test_load_counters.py) it steers away from a busy worker. Four equal
# workers can still split unevenly, as they would under SGLang: a decode window spans the idle time before
# it, so the worker whose first report after a pause comes early reports a throughput a fraction of its
# peers' and is sent far less until it idles again (alone [179, 168, 148, 145] of 640; after the other
# router tests [187, 158, 191, 104]). `--power-of-two-load-metric requests` splits them evenly.
SMG_4W_UNEVEN = pytest.mark.xfail(
    reason="smg 1.13.0's expected_wait divides by each worker's gen_throughput, whose SGLang window spans "
    "idle time: a worker can be starved after a pause (measured [187, 158, 191, 104] of 640)",
    strict=False,
)
EVEN = [pytest.param("sglang-router", 2, id="sglang-router-2w"), pytest.param("sglang-router", 4,
        id="sglang-router-4w"), pytest.param("smg", 2, id="smg-2w"),
        pytest.param("smg", 4, id="smg-4w", marks=SMG_4W_UNEVEN)]  # fmt: skip


@pytest.mark.parametrize(("router", "workers"), EVEN, indirect=["workers"])
def test_power_of_two_splits_evenly_over_equal_workers(
    router: str, workers: list[Proc], tmp_path: Path
) -> None:
    # 160 requests per worker: the requests routed on loads a poll old weigh less. At 80 a worker (320 over
    # 4) a run on shared cores strayed past ±20% ([74, 68, 81, 97]); at 160: [154, 162, 162, 162] and
    # [153, 163, 152, 172]
    n = 160 * len(workers)
    bodies = [{**short(i), "max_tokens": 40} for i in range(n)]  # 40 steps of 5 ms: the polls see them
    with running_router(router, workers, "power_of_two", tmp_path) as r:
        before = requests_counted(workers)
        answers = send_all(r.url, bodies, concurrency=16)
        wait_idle(workers)
        split = delta(before, requests_counted(workers))
    print(f"{router} power_of_two {len(workers)} equal workers: split {split}")
    assert [status for status, _ in answers] == [200] * n
    assert sum(split) == n
    fair = n / len(workers)
    assert all(0.8 * fair <= c <= 1.2 * fair for c in split), split


class Occupier:
    """`count` long requests sent straight to one worker (not through the router), aborted at the end."""

    def __init__(self, worker: Proc, count: int) -> None:
        self.worker = worker
        self.count = count
        # distinct prompts, so the worker's token load is theirs in full (a shared prefix is held once);
        # 20,000 steps of 5 ms: they outlast the test, which aborts them
        bodies = [{"prompt": f"busy {i} " + "x" * 500, "max_tokens": 20000, "ignore_eos": True}
                  for i in range(count)]  # fmt: skip
        self.threads = [threading.Thread(target=self._send, args=(b,)) for b in bodies]

    def _send(self, body: dict[str, Any]) -> None:
        httpx.post(f"{self.worker.url}/v1/completions", json=body, timeout=120)

    def __enter__(self) -> Occupier:
        for t in self.threads:
            t.start()
        deadline = time.monotonic() + 30
        while running(self.worker) < self.count:
            assert time.monotonic() < deadline, "the long requests did not all arrive"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        httpx.post(f"{self.worker.url}/abort_request", json={"abort_all": True}, timeout=10)
        for t in self.threads:
            t.join(60)


def send_one_by_one(url: str, n: int, timeout: float) -> int:
    """n short requests through the router, one at a time; how many were answered within `timeout`
    (one the router puts behind the busy worker's queue is not)."""
    answered = 0
    with httpx.Client(timeout=timeout) as client:
        for i in range(n):
            with contextlib.suppress(httpx.TimeoutException):
                answered += client.post(f"{url}/v1/completions", json=short(i)).status_code == 200
    return answered


@SIZES
@pytest.mark.parametrize("router", ["sglang-router", "smg"])
def test_power_of_two_steers_away_from_a_busy_worker(
    router: str, workers: list[Proc], tmp_path: Path
) -> None:
    n, busy = 40, 8  # 8 long requests on a worker that runs 4 at a time: 4 run, 4 wait
    with running_router(router, workers, "power_of_two", tmp_path) as r:
        before = requests_counted(workers)
        with Occupier(workers[0], busy):
            # the router polls loads every second: wait until it reads the busy worker's load
            for _ in range(50):
                loads = router_loads(router, r.url)
                if loads[workers[0].url] > 0:
                    break
                time.sleep(0.2)
            time.sleep(2.5)  # two more polls: the policy's own copy of the loads is fresh
            answered = send_one_by_one(r.url, n, timeout=3)
            others = delta(before, requests_counted(workers))[1:]
        wait_idle(workers)
    # the idle workers answer at once; whatever they did not get went to the busy one
    to_busy = n - sum(others)
    print(
        f"{router} power_of_two, worker 0 busy with {busy}: loads {[loads[w.url] for w in workers]}, "
        f"split {[to_busy, *others]}, answered {answered}"
    )
    assert loads[workers[0].url] > 0, loads  # the router read the busy worker's real load
    assert all(loads[w.url] == 0 for w in workers[1:]), loads
    assert answered >= sum(others)
    assert to_busy <= n // 10, [to_busy, *others]  # the busy worker gets (almost) nothing


@SIZES
@pytest.mark.parametrize("router", ROUTERS)
def test_cache_aware_sends_a_shared_prefix_to_the_worker_holding_it(
    router: str, workers: list[Proc], tmp_path: Path
) -> None:
    prefixes = ["You are a careful assistant who answers briefly. " * 8,
                "Summarise the following legal text in plain words: " * 8]  # fmt: skip
    rounds = 6
    served: dict[int, list[int]] = {0: [], 1: []}  # prefix -> the worker of each of its requests
    cached: dict[int, list[int]] = {0: [], 1: []}
    with running_router(router, workers, "cache_aware", tmp_path) as r, httpx.Client(timeout=30) as client:
        for k in range(rounds):
            for p, prefix in enumerate(prefixes):
                before = requests_counted(workers)
                body = {"model": "simulated", "prompt": f"{prefix}question {k}?", "max_tokens": 2,
                        "ignore_eos": True}  # fmt: skip
                answer = client.post(f"{r.url}/v1/completions", json=body)
                assert answer.status_code == 200, answer.text
                cached[p].append(answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
                after = requests_counted(workers)
                served[p].append(delta(before, after).index(1))
    print(f"{router} cache_aware {len(workers)} workers: workers {served}, cached tokens {cached}")
    for p, prefix in enumerate(prefixes):
        assert len(set(served[p])) == 1, served  # every request of a prefix on one worker
        # the byte-level tokenizer: one token a byte, so the whole prefix is cached after the first
        assert all(c >= len(prefix.encode()) for c in cached[p][1:]), cached
