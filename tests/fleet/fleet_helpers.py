"""Fleet test helpers: `kvadmit serve --simulate` workers and the real routers (sglang-router, smg) as
subprocesses on free ports of 127.0.0.1, and reading what each worker counted from its own /metrics."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

ROUTERS = ("sglang-router", "smg")
COUNTERS = ("sglang:num_requests", "sglang:prompt_tokens", "sglang:generation_tokens")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


@dataclass
class Proc:
    """A subprocess whose output goes to `log`; stopped with SIGTERM, then SIGKILL."""

    popen: subprocess.Popen[bytes]
    log: Path
    url: str

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(15)


def start(argv: list[str], log: Path, url: str, env: dict[str, str] | None = None) -> Proc:
    with log.open("wb") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    return Proc(popen, log, url)


def wait_until(proc: Proc, ready: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ready():
                return
        except (httpx.TransportError, ValueError, KeyError):
            pass
        if proc.popen.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not become ready:\n{log_tail(proc.log)}")
        time.sleep(0.2)


def start_worker(cost_json: str, folder: Path, extra: list[str] | None = None) -> Proc:
    """`kvadmit serve --simulate COST` on a free port; ready when /ready answers 200 (which, unlike
    /health, generates nothing, so the counters start at 0)."""
    port = free_port()
    argv = [sys.executable, "-m", "kvadmit.cli", "serve", "--simulate", cost_json, "--host", "127.0.0.1",
            "--port", str(port), "--enable-metrics", "--log-level", "warning", *(extra or [])]  # fmt: skip
    return start(argv, folder / f"worker-{port}.log", f"http://127.0.0.1:{port}")


def wait_worker(worker: Proc) -> None:
    wait_until(worker, lambda: httpx.get(f"{worker.url}/ready", timeout=2).status_code == 200, "worker")


def router_argv(router: str, port: int, workers: list[str], policy: str, extra: list[str]) -> list[str]:
    """The router's own launch command, polling loads every second and never health-checking during a
    test (an idle kvadmit's /health generates one token, which would count as a request)."""
    common = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers,
              "--policy", policy, "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
              "--health-check-interval-secs", "3600", "--log-level", "warn", *extra]  # fmt: skip
    # `python -m`, not the `smg` script: sglang-router 0.3.2 installs an `smg` script of its own, so which
    # one a venv has depends on the order the two were installed in
    if router == "sglang-router":  # 0.3.2 polls /get_load at its worker start-up check interval
        return [sys.executable, "-m", "sglang_router.launch_router", *common,
                "--worker-startup-check-interval", "1"]  # fmt: skip
    return [sys.executable, "-m", "smg.launch_router", *common, "--load-monitor-interval", "1"]


def router_loads(router: str, url: str) -> dict[str, float]:
    """Worker URL -> the load the router reports on its /get_loads: sglang-router's `load` (the worker's
    /get_load tokens), smg's `num_running_reqs` + `num_waiting_reqs` (the worker's /v1/loads)."""
    body = httpx.get(f"{url}/get_loads", timeout=10).json()
    if router == "sglang-router":
        return {w["worker"]: float(w["load"]) for w in body["workers"]}
    loads: dict[str, float] = {}
    for w in body["loads"]:
        if w.get("num_running_reqs") is None:
            loads[w["worker"]] = -1.0
        else:
            loads[w["worker"]] = float(w["num_running_reqs"]) + float(w["num_waiting_reqs"])
    return loads


@contextmanager
def running_router(
    router: str, workers: list[Proc], policy: str, folder: Path, extra: list[str] | None = None
) -> Iterator[Proc]:
    """The router on a free port, ready once its /get_loads lists every worker and a request through it
    is answered."""
    port = free_port()
    urls = [w.url for w in workers]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    log = folder / f"{router}-{policy}-{port}.log"
    proc = start(router_argv(router, port, urls, policy, extra or []), log, f"http://127.0.0.1:{port}", env)
    try:
        wait_until(proc, lambda: set(router_loads(router, proc.url)) == set(urls), f"{router} /get_loads")
        body = {"model": "simulated", "prompt": "warm up", "max_tokens": 1}
        wait_until(proc, lambda: httpx.post(f"{proc.url}/v1/completions", json=body, timeout=10)
                   .status_code == 200, f"{router} routing")  # fmt: skip
        yield proc
    finally:
        proc.stop()


def counters(url: str) -> dict[str, float]:
    """The worker's counters (COUNTERS), summed over their labels."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        if family.name in out:
            out[family.name] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return out


def requests_counted(workers: list[Proc]) -> list[int]:
    return [int(counters(w.url)["sglang:num_requests"]) for w in workers]


def running(worker: Proc) -> int:
    """Requests the worker holds now (running + waiting), from its /get_load."""
    body = httpx.get(f"{worker.url}/get_load", timeout=10).json()
    return sum(int(d["num_reqs"]) + int(d["num_waiting_reqs"]) for d in body)


def wait_idle(workers: list[Proc], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while any(running(w) for w in workers):
        if time.monotonic() > deadline:
            raise AssertionError("workers still hold requests")
        time.sleep(0.1)


def send_all(url: str, bodies: list[dict[str, Any]], concurrency: int, timeout: float = 60) -> list[Any]:
    """POST each body to URL/v1/completions, `concurrency` at a time; (status, JSON or text) each."""

    async def run() -> list[Any]:
        gate = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:

            async def one(body: dict[str, Any]) -> Any:
                async with gate:
                    r = await client.post("/v1/completions", json=body)
                    return r.status_code, (r.json() if r.status_code == 200 else r.text)

            return await asyncio.gather(*(one(b) for b in bodies))

    return asyncio.run(run())


def warm_equally(workers: list[Proc], per_worker: int, max_tokens: int) -> None:
    """Each worker decodes `per_worker` requests of `max_tokens` tokens at once, sent to it directly, all
    workers together; returns when all are idle again. Done right before a measurement, it puts every
    worker in the state a fleet under steady load is in: its last decode window (the throughput SGLang
    reports, tokens since the previous report over the time since it) covers busy time only, and is the
    same on every worker, rather than spanning however long that worker sat idle before."""

    async def run() -> list[int]:
        async with httpx.AsyncClient(timeout=60) as client:

            async def one(url: str, i: int) -> int:
                body = {"model": "simulated", "prompt": f"warm {url} {i}", "max_tokens": max_tokens,
                        "ignore_eos": True}  # fmt: skip
                return (await client.post(f"{url}/v1/completions", json=body)).status_code

            return await asyncio.gather(*(one(w.url, i) for w in workers for i in range(per_worker)))

    statuses = asyncio.run(run())
    assert statuses == [200] * len(statuses), statuses
    wait_idle(workers)
