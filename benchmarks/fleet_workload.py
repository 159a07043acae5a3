"""The request stream of benchmarks/fleet_fidelity.py, and the two ways it is run: the simulated fleet
(`kvadmit simulate --replicas N --router POLICY` as a library call) and a real client against a real
router in front of `kvadmit serve --simulate` workers. Both report, per worker: which requests it served,
its peak queue (the largest #queue-req of its log lines, --decode-log-interval 1), and the TTFT median of
its requests, and the requests it retracted (the #retracted_reqs of its 'Retract requests' lines)."""

from __future__ import annotations

import asyncio
import json
import random
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kvadmit.bench.workload import SimRequest, WorkloadSpec
from kvadmit.config import ServerArgs
from kvadmit.costmodel.costmodel import CostModel, DecodeCost, PrefillCost
from kvadmit.fleet.driver import FleetSpec, simulate_fleet
from kvadmit.fleet.router import RouterSettings
from kvadmit.sim.replay import Replay
from kvadmit.sim.run import SimConfig

SYSTEM_PROMPTS = [
    f"You are assistant number {k}, answer in the voice of character {k}. " * 3 for k in range(4)
]
QUEUE = re.compile(r"#queue-req: (\d+)")
RETRACTED = re.compile(r"#retracted_reqs: (\d+)")
MARK = re.compile(r"question (\d+):")


@dataclass(frozen=True)
class Stream:
    prompts: list[str]
    arrivals: list[float]  # seconds after the first request
    max_tokens: int


def make_stream(n: int, rate: float, max_tokens: int, seed: int = 1) -> Stream:
    """n requests, Poisson arrivals at `rate`; each prompt one of four system prompts and a question. The
    warm-up asks for 32 tokens: max_tokens must differ, to tell it apart in the workers' traces."""
    assert max_tokens != 32
    rng = random.Random(seed)
    prompts, arrivals, t = [], [], 0.0
    for i in range(n):
        prompts.append(f"{SYSTEM_PROMPTS[rng.randrange(4)]}question {i}: what is {rng.randrange(10**6)}?")
        arrivals.append(t)
        t += rng.expovariate(rate)
    return Stream(prompts, arrivals, max_tokens)


@dataclass
class WorkerResult:
    served: list[int]  # request indices
    peak_queue: int
    ttft_p50_ms: float
    retracted: int  # requests retracted, summed over the worker's retraction log lines
    ttfts_ms: list[float] = field(default_factory=list)  # each served request's TTFT, in `served` order


@dataclass
class SimulatedRun:
    workers: list[WorkerResult]
    start_s: float  # the stream's start on the simulated clock (0: the router's start, its first warm-up)


def simulated(stream: Stream, args: ServerArgs, decode_ms: float, policy: str, workers: int,
              poll_s: int, latency_s: float, first_poll_s: float = 0.0,
              impl: str = "sglang-router", prefill_ms: float = 0.0) -> SimulatedRun:  # fmt: skip
    """The stream through `simulate --replicas N --router POLICY --router-impl IMPL`: byte tokens (the
    workers' tokenizer), two warm-up requests (the real run's router check and its warm-up),
    --request-latency-ms latency_s, the router's first load poll at first_poll_s; `prefill_ms`: a
    prefill step's fixed time (the cost model's prefill base_ms)."""
    reqs = tuple(
        SimRequest(i, len(p.encode()), stream.max_tokens, stream.max_tokens, None, True, 0, tuple(p.encode()))
        for i, p in enumerate(stream.prompts)
    )
    cfg = SimConfig(
        args=args, workload=WorkloadSpec(num_prompts=len(reqs), vocab_size=257),
        cost=CostModel(DecodeCost(base_ms=decode_ms), PrefillCost(base_ms=prefill_ms, tokens_per_s=1e6)),
        warmup_requests=2,
        request_latency_s=latency_s,
        replay=Replay(reqs, tuple(stream.arrivals), tuple(f"req-{i}" for i in range(len(reqs)))),
    )  # fmt: skip
    lines: list[str] = []
    settings = RouterSettings(policy, poll_interval_secs=poll_s, first_poll_s=first_poll_s, impl=impl)
    spec = FleetSpec(workers, settings)
    result = simulate_fleet(cfg, spec, emit_log=lines.append)
    out = []
    for k in range(workers):
        tag = f" DP{k}]" if workers > 1 else "]"
        mine = [line for line in lines if tag in line[:26]]
        served = [i for i, r in enumerate(result.routed) if r == k]
        ttfts = [1000 * result.sim.outcomes[i].ttft for i in served]
        median = statistics.median(ttfts) if ttfts else 0.0
        out.append(WorkerResult(served, peak_queue(mine), median, retracted(mine), ttfts))
    # (the first request is sent at the stream's start plus its arrival offset)
    return SimulatedRun(out, result.sim.outcomes[0].start_time - stream.arrivals[0])


def peak_queue(lines: list[str]) -> int:
    """The largest #queue-req of a worker's log lines (0 without any)."""
    return max((int(m.group(1)) for line in lines for m in [QUEUE.search(line)] if m), default=0)


def retracted(lines: list[str]) -> int:
    """The requests a worker retracted: the sum of #retracted_reqs over its log lines."""
    return sum(int(m.group(1)) for line in lines for m in [RETRACTED.search(line)] if m)


async def send_one(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int, at: float) -> float:
    """One streamed completion sent at monotonic time `at`; its TTFT in ms."""
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    sent = time.monotonic()
    body = {
        "model": "simulated",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    first = None
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if first is None and line.startswith("data: {"):
                first = time.monotonic()
    return 1000 * ((first or time.monotonic()) - sent)


@dataclass
class StreamRun:
    ttfts_ms: list[float]  # each request's, in stream order
    # when the router's load polls reached the watched worker, in seconds after the stream's start
    polls_s: list[float]


# How a router's load poll shows in a worker's access log (uvicorn's, written once the answer is sent)
POLL_MARKERS = {"sglang-router": b'"GET /get_load ', "smg": b'"GET /v1/loads'}


async def watch_polls(log: Path, marker: bytes, seen: list[float], stop: asyncio.Event) -> None:
    """Append to `seen` the monotonic time at which each new line of `log` holding `marker` appears, read
    every millisecond (an idle worker answers a poll within about a millisecond; a busy one after its
    current step, up to a step later)."""
    with log.open("rb") as f:
        f.seek(0, 2)
        pending = b""
        while not stop.is_set():
            chunk = f.read()
            if chunk:
                now = time.monotonic()
                *lines, pending = (pending + chunk).split(b"\n")
                seen.extend(now for line in lines if marker in line)
            await asyncio.sleep(0.001)


def send_stream(url: str, stream: Stream, poll_log: Path | None = None, marker: bytes = b"") -> StreamRun:
    """The stream through the router in real time (the first prompt first as a warm-up, as bench_serving
    does); each request's TTFT, and the router's polls as `poll_log` (a worker's output) shows them."""

    async def run() -> StreamRun:
        seen: list[float] = []
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch_polls(poll_log, marker, seen, stop)) if poll_log else None
        async with httpx.AsyncClient(timeout=120) as client:
            await send_one(client, url, stream.prompts[0], min(stream.max_tokens, 32), time.monotonic())
            await asyncio.sleep(1.0)
            start = time.monotonic()
            jobs = [send_one(client, url, p, stream.max_tokens, start + a)
                    for p, a in zip(stream.prompts, stream.arrivals, strict=True)]  # fmt: skip
            ttfts = list(await asyncio.gather(*jobs))
        stop.set()
        if watcher is not None:
            await watcher
        return StreamRun(ttfts, [t - start for t in seen])

    return asyncio.run(run())


def probe_ttfts_ms(url: str, max_tokens: int, n: int = 7, gap_s: float = 0.5) -> list[float]:
    """The TTFTs of n requests (prompts no run uses) sent one at a time, each `gap_s` after the previous
    answer (the first `gap_s` after the call)."""

    async def run() -> list[float]:
        out: list[float] = []
        async with httpx.AsyncClient(timeout=60) as client:
            for k in range(n):
                await asyncio.sleep(gap_s)
                prompt = f"probe {k}: " + "x" * 200
                out.append(await send_one(client, url, prompt, max_tokens, time.monotonic()))
        return out

    return asyncio.run(run())


def idle_ttft_ms(url: str, max_tokens: int, n: int = 7, gap_s: float = 0.5) -> float:
    """The median TTFT of n requests sent one at a time, `gap_s` apart, to an idle fleet: what the HTTP
    path through the router and the server adds to a simulated TTFT.

    The gap matters. sglang-router 0.3.2 holds a request sent within about 40 ms of the previous answer for
    about 40 ms more (benchmarks/router_http.txt; smg 1.13.0 and the worker alone do not; by its length
    and window, a reused connection's delayed-acknowledgement stall, not checked further). Probes sent
    back to back measured that stall, 48 ms, and the simulated TTFTs came out about 40 ms high for every
    lightly loaded request; requests of the stream arrive 0.1 s apart on average."""
    return statistics.median(probe_ttfts_ms(url, max_tokens, n, gap_s))


def served_from_trace(new_lines: list[str]) -> list[int]:
    """The request indices a worker's --trace-requests lines name (the router's check has no `question i:`,
    the warm-up asks for 32 tokens)."""
    out = []
    for line in new_lines:
        row = json.loads(line)
        m = MARK.search(bytes(i for i in row["input_ids"] if i < 256).decode())
        if m and row["max_new_tokens"] != 32:
            out.append(int(m.group(1)))
    return sorted(out)
