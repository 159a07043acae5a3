"""How fast `kvadmit simulate` runs: 100,000 requests with full SGLang semantics, step by step.

Workload (issue #3): input 1–2,048 and output 1–1,024 tokens (bench_serving's random lengths with
--random-range-ratio 0), early stops (--disable-ignore-eos: each request stops uniformly within its
max_new_tokens), concurrency 512, a 500,000-token pool, default cost model. Target: under 20 s on one core.

The peer is the clock being simulated: how many seconds of serving one wall-clock second simulates.
No step is skipped: every prefill and decode step runs through the real scheduler.

The machine is shared, so next to the wall time the table gives the CPU time of the run (the time it
spent on its one core) and the load average around it: a wall time well above the CPU time means the
core was busy with other work.

    python benchmarks/scheduler_overhead.py is the scheduler's per-step cost; this is the whole loop.
    usage: python benchmarks/sim_speed.py [--requests N ...] [--output FILE | -]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core

from kvadmit.bench.workload import WorkloadSpec
from kvadmit.config import ServerArgs
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.sim.run import SimConfig, simulate
from machine import cpu_model, publish

TARGET_S = 20.0


def run(n: int) -> dict[str, float]:
    cfg = SimConfig(
        args=ServerArgs(max_total_tokens=500_000),
        workload=WorkloadSpec(
            num_prompts=n, input_len=2048, output_len=1024, range_ratio=0.0, ignore_eos=False
        ),
        cost=CostModel.simple(decode_step_ms=20.0, prefill_tokens_per_s=10_000.0),
        max_concurrency=512,
        warmup_requests=0,
    )
    cpu = time.process_time()
    t = time.perf_counter()
    result = simulate(cfg)
    wall = time.perf_counter() - t
    cpu = time.process_time() - cpu
    m = result.metrics
    return {
        "requests": n,
        "completed": m.completed,
        "tokens": m.total_output,
        "steps": result.steps,
        "retractions": result.retractions,
        "wall_s": wall,
        "cpu_s": cpu,
        "sim_s": result.duration_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "sim_speed.txt"))
    ns = ap.parse_args()
    load_before = os.getloadavg()[0]
    rows = [run(n) for n in ns.requests]
    load_after = os.getloadavg()[0]
    lines = [
        "# benchmarks/sim_speed.py: kvadmit simulate, full SGLang semantics, step by step",
        f"date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"machine: {cpu_model()}, {os.cpu_count()} cores (one used); Python {platform.python_version()}",
        "workload: input 1–2048, output 1–1024, early stops, concurrency 512, pool 500,000 tokens",
        f"load average (1 min) before / after: {load_before:.1f} / {load_after:.1f}",
        "",
        "| requests | output tokens | steps | retractions | wall s | CPU s | simulated s | req/s | "
        "tokens/s | simulated s per wall s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['requests']:,} | {r['tokens']:,} | {r['steps']:,} | {r['retractions']:,} | "
            f"{r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['sim_s']:,.0f} | "
            f"{r['requests'] / r['wall_s']:,.0f} | "
            f"{r['tokens'] / r['wall_s']:,.0f} | {r['sim_s'] / r['wall_s']:,.0f}× |"
        )
    big = max(rows, key=lambda r: r["requests"])
    verdict = "meets" if big["wall_s"] < TARGET_S else "misses"
    lines += [
        "",
        f"target: {big['requests']:,} requests under {TARGET_S:.0f} s: {verdict} it "
        f"(wall {big['wall_s']:.1f} s, CPU {big['cpu_s']:.1f} s)",
    ]
    publish(lines, ns.output)


if __name__ == "__main__":
    main()
