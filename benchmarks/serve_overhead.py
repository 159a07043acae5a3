"""What the HTTP server costs on top of the engine, measured against a peer in one run.

1. A simulated step against its cost model: `kvadmit serve --simulate` (a 10 ms decode step) with 1, 16
   and 64 requests running (streamed, ignore_eos); from its --trace-steps rows, the time from one decode
   step's end to the next's at that batch size, against the cost model's 10 ms. Under SGLang's non-overlap
   loop the server's own work per step (scheduling, tokens to the HTTP side, SSE) adds to the 10 ms; under
   the overlap loop it hides behind the step in flight, as on a GPU. Also one simulated worker's start-up
   time (the process start to /ready answering 200) and its memory (resident set after start-up, peak).
2. `serve --simulate` in real time against the virtual clock: the same workload (200 requests of 128
   prompt + 128 output tokens, ignore_eos, concurrency 32, a 10 ms decode step, 50k prefill tokens/s) is
   simulated by `kvadmit simulate` (the cost model's own prediction, no overhead) and sent to a real
   `kvadmit serve --simulate` over HTTP. Ratio of wall durations and of mean TPOT = the serving stack's
   overhead (scheduling in real time, the engine thread, HTTP, SSE) on a step that costs 10 ms.
3. A fleet: sixteen `serve --simulate` workers behind sglang-router (round_robin), driven by `kvadmit bench`
   through the router; the fleet's request rate against what the cost model predicts for sixteen
   independent workers (`kvadmit simulate` of one worker's share, times sixteen).
4. The real model (the default SmolLM2-135M when it is cached, bf16/fp32 as the server resolves it):
   the same 32 prompts through the offline `kvadmit.Engine` and through `kvadmit serve` over HTTP at
   concurrency 32; output tokens per second of each.

Run: python benchmarks/serve_overhead.py [--skip-model] [--skip-fleet]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import httpx

from machine import cpu_model
from serve_steps import fleet_part, steps_part

N, INPUT, OUTPUT, CONC, DECODE_MS, PREFILL = 200, 128, 128, 32, 10.0, 50_000.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvadmit.cli", "serve", "--port", str(port), "--log-level", "warning", *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not start")


async def fire(url: str, bodies: list[dict], conc: int) -> tuple[float, list[dict]]:
    sem = asyncio.Semaphore(conc)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=conc)) as c:

        async def one(body: dict) -> dict:
            async with sem:
                t = time.perf_counter()
                r = await c.post("/generate", json=body)
                out = r.json()
                out["_latency"] = time.perf_counter() - t
                return out

        start = time.perf_counter()
        outs = await asyncio.gather(*(one(b) for b in bodies))
        return time.perf_counter() - start, outs


def simulated_part() -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        cost = Path(tmp) / "cost.json"
        cost.write_text(json.dumps({"decode": {"base_ms": DECODE_MS}, "prefill": {"tokens_per_s": PREFILL}}))
        sim = subprocess.run(
            [sys.executable, "-m", "kvadmit.cli", "simulate", "--num-prompts", str(N), "--random-input-len",
             str(INPUT), "--random-output-len", str(OUTPUT), "--random-range-ratio", "1", "--max-concurrency",
             str(CONC), "--cost-model", str(cost), "--max-total-tokens", "100000", "--warmup-requests", "0",
             "--quiet"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        predicted = float(re.search(r"Benchmark duration \(s\):\s+([\d.]+)", sim).group(1))  # type: ignore[union-attr]
        predicted_tpot = float(re.search(r"Mean TPOT \(ms\):\s+([\d.]+)", sim).group(1))  # type: ignore[union-attr]
        proc, url = start_server(["--simulate", str(cost), "--max-total-tokens", "100000"])
        try:
            sp = {"max_new_tokens": OUTPUT, "ignore_eos": True}
            bodies = [
                {"input_ids": [(i * 7 + k) % 250 + 1 for k in range(INPUT)], "sampling_params": sp}
                for i in range(N)
            ]
            wall, outs = asyncio.run(fire(url, bodies, CONC))
        finally:
            proc.terminate()
            proc.wait(30)
    assert all(o["meta_info"]["completion_tokens"] == OUTPUT for o in outs)
    tpots = [(o["_latency"]) / OUTPUT * 1000 for o in outs]
    measured_tpot = sum(tpots) / len(tpots)
    return [
        f"2. serve --simulate vs its cost model: {N} requests × ({INPUT} + {OUTPUT}), concurrency {CONC}, "
        f"decode step {DECODE_MS:g} ms",
        "",
        "| | duration s | mean time per output token ms |",
        "| --- | ---: | ---: |",
        f"| kvadmit simulate (virtual clock) | {predicted:.2f} | {predicted_tpot:.2f} (TPOT) |",
        f"| kvadmit serve --simulate over HTTP | {wall:.2f} | {measured_tpot:.2f} (latency / tokens) |",
        f"| ratio | {wall / predicted:.3f} | |",
        "",
    ]


def model_part() -> list[str]:
    import kvadmit

    prompts = [f"Write a short story about the number {i}." for i in range(32)]
    sp = {"max_new_tokens": 64, "temperature": 0.0, "ignore_eos": True}
    engine = kvadmit.Engine(max_total_tokens=20000)
    engine.generate(prompts[:2], sp)  # warm-up
    t = time.perf_counter()
    offline = engine.generate(prompts, sp)
    offline_s = time.perf_counter() - t
    tokens = sum(o["meta_info"]["completion_tokens"] for o in offline)  # type: ignore[index]
    dtype = str(next(engine.model.parameters()).dtype).replace("torch.", "")
    del engine
    proc, url = start_server(["--max-total-tokens", "20000", "--dtype", dtype])
    try:
        asyncio.run(fire(url, [{"text": p, "sampling_params": sp} for p in prompts[:2]], 2))
        wall, outs = asyncio.run(fire(url, [{"text": p, "sampling_params": sp} for p in prompts], 32))
    finally:
        proc.terminate()
        proc.wait(30)
    served = sum(o["meta_info"]["completion_tokens"] for o in outs)
    same = sum(o["text"] == off["text"] for o, off in zip(outs, offline, strict=True))  # type: ignore[index]
    return [
        f"4. the default model ({dtype}): 32 prompts × 64 output tokens (greedy, ignore_eos)",
        "",
        "| | output tok/s |",
        "| --- | ---: |",
        f"| kvadmit.Engine offline | {tokens / offline_s:.1f} |",
        f"| kvadmit serve over HTTP, concurrency 32 | {served / wall:.1f} |",
        f"| ratio (served / offline) | {(served / wall) / (tokens / offline_s):.3f} |",
        "",
        f"identical greedy texts: {same} of 32",
        "",
    ]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--skip-model", action="store_true")
    p.add_argument("--skip-fleet", action="store_true")
    p.add_argument("--parts", default="1,2,3,4", help="which parts to run, e.g. 1,3")
    ns = p.parse_args()
    parts = {int(x) for x in ns.parts.split(",")}
    lines = [f"# serve_overhead — {cpu_model()}, {os.cpu_count()} cores (shared with other jobs), Python "
             f"{sys.version.split()[0]}, {date.today()}, load average {os.getloadavg()[0]:.1f}", "",
             f"`python benchmarks/serve_overhead.py {' '.join(sys.argv[1:])}`", ""]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        if 1 in parts:
            lines += steps_part(Path(tmp))
        if 2 in parts:
            lines += simulated_part()
        if 3 in parts and not ns.skip_fleet:
            lines += fleet_part(Path(tmp))
    if 4 in parts and not ns.skip_model:
        lines += model_part()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
