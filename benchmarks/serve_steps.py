"""serve_overhead.py's parts 1 and 3: a simulated step against its cost model at 1 / 16 / 64 running, one
worker's start-up time and memory, and sixteen workers behind sglang-router driven by `kvadmit bench`."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import httpx

STEP_MS = 10.0  # the cost model's decode step for part 1
BATCHES = (1, 16, 64)
STEP_OUTPUT = 120  # tokens each request generates in part 1 (ignore_eos)
FLEET, FLEET_MS, FLEET_PROMPTS, FLEET_CONC, FLEET_IN, FLEET_OUT = 16, 20.0, 320, 128, 64, 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_cost(path: Path, decode_ms: float, tokens_per_s: float = 1_000_000.0) -> Path:
    path.write_text(json.dumps({"decode": {"base_ms": decode_ms}, "prefill": {"tokens_per_s": tokens_per_s}}))
    return path


def rss_kib(pid: int) -> tuple[int, int]:
    """(resident now, peak resident) of a process, in KiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def start_worker(args: list[str], port: int | None = None) -> tuple[subprocess.Popen[bytes], str, float]:
    """`kvadmit serve ARGS` on a free port: the process, its URL, and the seconds until /ready said 200."""
    port = port or free_port()
    began = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvadmit.cli", "serve", "--port", str(port), "--log-level", "warning", *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                return proc, url, time.perf_counter() - began
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"the server did not start: {args}")


async def _stream_all(url: str, n: int, base: int) -> list[float]:
    """n streamed requests at once, each 32 prompt tokens of its own, STEP_OUTPUT tokens out; the gaps
    between each request's consecutive chunks as the client saw them (its first 5 left out). The client
    is aiohttp's (as `kvadmit bench`'s: about half httpx's CPU per streamed chunk), since it shares the
    server's cores."""
    connector = aiohttp.TCPConnector(limit=n + 4)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(base_url=url, connector=connector, timeout=timeout) as c:

        async def one(i: int) -> list[float]:
            ids = [(base + i * 37 + k) % 250 + 1 for k in range(32)]
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": STEP_OUTPUT, "ignore_eos": True},
                    "stream": True}  # fmt: skip
            seen = []
            async with c.post("/generate", json=body) as r:
                async for line in r.content:
                    if line.startswith(b"data: {"):
                        seen.append(time.perf_counter())
            return [b - a for a, b in itertools.pairwise(seen)][5:]

        gaps = await asyncio.gather(*(one(i) for i in range(n)))
        return [g for per_request in gaps for g in per_request]


def step_periods(rows: list[dict], batch: int) -> list[float]:
    """Seconds between consecutive decode steps both at this batch size (the first 5 left out)."""
    decodes = [r for r in rows if r["kind"] == "decode" and r["batch_size"] == batch]
    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(decodes) if b["step"] == a["step"] + 1]
    return gaps[5:]


def steps_part(tmp: Path) -> list[str]:
    cost = write_cost(tmp / "step-cost.json", STEP_MS)
    trace = tmp / "steps.jsonl"
    args = ["--simulate", str(cost), "--max-total-tokens", "200000", "--trace-steps", str(trace)]
    proc, url, startup_s = start_worker(args)
    idle_rss, _ = rss_kib(proc.pid)
    client_gaps = {}
    try:
        for k, n in enumerate(BATCHES):
            client_gaps[n] = asyncio.run(_stream_all(url, n, base=k * 1000))
        _, peak_rss = rss_kib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
    rows = [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []
    lines = [
        f"1. a simulated decode step against its cost model ({STEP_MS:g} ms a step), streamed requests of 32 "
        f"prompt + {STEP_OUTPUT} output tokens",
        "",
        "| running | steps | median step ms | mean step ms | p90 step ms | mean / cost model "
        "| client: median gap ms | client: mean gap ms |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n in BATCHES:
        gaps = sorted(g * 1000 for g in step_periods(rows, n))
        seen = [g * 1000 for g in client_gaps[n]]
        client = f"{statistics.median(seen):.2f} | {statistics.fmean(seen):.2f}"
        if not gaps:  # no step trace from this build
            lines.append(f"| {n} | – | – | – | – | – | {client} |")
            continue
        p90 = gaps[int(0.9 * (len(gaps) - 1))]
        mean = statistics.fmean(gaps)
        lines.append(f"| {n} | {len(gaps)} | {statistics.median(gaps):.2f} | {mean:.2f} | {p90:.2f} | "
                     f"{mean / STEP_MS:.3f} | {client} |")  # fmt: skip
    lines += [
        "",
        f"one simulated worker: start-up (process start to /ready 200) {startup_s:.2f} s; resident memory "
        f"{idle_rss / 1024:.0f} MiB after start-up, {peak_rss / 1024:.0f} MiB peak (after the 64-request "
        "run)",
        "",
    ]
    return lines


def _simulate_rate(cost: Path, prompts: int, conc: int) -> float:
    """Requests per second `kvadmit simulate` predicts for one worker's share of the fleet workload."""
    out = subprocess.run(
        [sys.executable, "-m", "kvadmit.cli", "simulate", "--num-prompts", str(prompts),
         "--random-input-len", str(FLEET_IN), "--random-output-len", str(FLEET_OUT), "--random-range-ratio",
         "1", "--max-concurrency", str(conc), "--cost-model", str(cost), "--max-total-tokens", "200000",
         "--warmup-requests", "0", "--quiet"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return float(re.search(r"Request throughput \(req/s\):\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]


def fleet_part(tmp: Path) -> list[str]:
    cost = write_cost(tmp / "fleet-cost.json", FLEET_MS)
    workers = []
    try:
        for _ in range(FLEET):
            workers.append(start_worker(["--simulate", str(cost), "--enable-metrics"]))
        port = free_port()
        urls = [url for _, url, _ in workers]
        router = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
             "--worker-urls", *urls, "--policy", "round_robin", "--prometheus-host", "127.0.0.1",
             "--prometheus-port", str(free_port()), "--health-check-interval-secs", "3600", "--log-level",
             "warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )  # fmt: skip
        try:
            router_url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            body = {"text": "warm up", "sampling_params": {"max_new_tokens": 1}}
            while True:
                try:
                    if httpx.post(f"{router_url}/generate", json=body, timeout=10).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("sglang-router did not start")
                time.sleep(0.2)
            bench = subprocess.run(
                [sys.executable, "-m", "kvadmit.cli", "bench", "--backend", "sglang", "--base-url",
                 router_url, "--tokenizer", "byte-level", "--dataset-name", "random-ids", "--num-prompts",
                 str(FLEET_PROMPTS),
                 "--random-input-len", str(FLEET_IN), "--random-output-len", str(FLEET_OUT),
                 "--random-range-ratio", "1", "--max-concurrency", str(FLEET_CONC), "--warmup-requests", "0",
                 "--disable-tqdm"],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
        finally:
            router.terminate()
            router.wait(30)
    finally:
        for proc, _, _ in workers:
            proc.terminate()
        for proc, _, _ in workers:
            proc.wait(30)

    def field(name: str) -> float:
        return float(re.search(rf"{re.escape(name)}:\s+([\d.]+)", bench).group(1))  # type: ignore[union-attr]

    share = FLEET_PROMPTS // FLEET
    predicted = _simulate_rate(cost, share, FLEET_CONC // FLEET) * FLEET
    return [
        f"3. a fleet: {FLEET} simulated workers ({FLEET_MS:g} ms decode step) behind sglang-router "
        f"(round_robin), `kvadmit bench` through the router: {FLEET_PROMPTS} requests of {FLEET_IN} + "
        f"{FLEET_OUT} tokens (random-ids, ignore_eos), concurrency {FLEET_CONC}",
        "",
        "| | requests/s | output tokens/s | mean TPOT ms |",
        "| --- | ---: | ---: | ---: |",
        f"| the cost model: {FLEET} independent workers of {share} requests at concurrency "
        f"{FLEET_CONC // FLEET} (`kvadmit simulate` × {FLEET}) | {predicted:.1f} | "
        f"{predicted * FLEET_OUT:.0f} | {FLEET_MS:.2f} |",
        f"| measured through sglang-router | {field('Request throughput (req/s)'):.1f} | "
        f"{field('Output token throughput (tok/s)'):.0f} | {field('Mean TPOT (ms)'):.2f} |",
        "",
        f"(All {FLEET} workers, the router and the client share this machine's cores: the measured rate is "
        "the machine's limit as much as the servers'.)",
        "",
    ]
