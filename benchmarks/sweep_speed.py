"""How fast `kvadmit sweep` runs: one 10,000-request point (target: under 2 s), and a 24-point sweep on one
worker process against all cores (target: both cores used).

A point is a whole simulation: every prefill and decode step through the real scheduler, plus the sweep's
per-step observer (queue times, KV usage). Two workloads for the single point, because the time goes with
the number of steps and tokens, not with the number of requests:

    short   prompts 1–512, outputs 1–256 (early stops), concurrency 256, pool 200,000 tokens
    long    prompts 1–2,048, outputs 1–1,024 (early stops), concurrency 512, pool 500,000 tokens
            (benchmarks/sim_speed.py's workload)

The machine is shared: each timing is the median of --repeats runs, and the sweep comparison is a ratio.

    usage: python benchmarks/sweep_speed.py [--repeats N] [--output FILE | -]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import resource
import statistics
import time
from dataclasses import replace

from kvadmit.bench.workload import WorkloadSpec
from kvadmit.config import ServerArgs
from kvadmit.costmodel.costspec import resolve_cost_model
from kvadmit.sim.run import SimConfig
from kvadmit.sim.sweep import SweepPoint, default_workers, run_point, run_points
from machine import cpu_model, publish

TARGET_S = 2.0
COST = resolve_cost_model("h100:llama-3-8b")
WORKLOADS = {
    "short": (
        WorkloadSpec(num_prompts=10_000, input_len=512, output_len=256, ignore_eos=False),
        256,
        200_000,
    ),
    "long": (
        WorkloadSpec(num_prompts=10_000, input_len=2048, output_len=1024, ignore_eos=False),
        512,
        500_000,
    ),
}


def config(name: str) -> SimConfig:
    workload, concurrency, pool = WORKLOADS[name]
    return SimConfig(ServerArgs(max_total_tokens=pool), workload, COST, max_concurrency=concurrency,
                     warmup_requests=0)  # fmt: skip


def time_point(cfg: SimConfig, repeats: int) -> tuple[float, int]:
    """Median wall seconds of one point, and how many requests it completed."""
    walls, completed = [], 0
    for _ in range(repeats):
        t = time.perf_counter()
        completed = run_point(SweepPoint({}, cfg)).completed
        walls.append(time.perf_counter() - t)
    return statistics.median(walls), completed


def sweep_points() -> list[SweepPoint]:
    """24 points of 2,000 requests: 3 conservativeness × 2 policies × 4 concurrencies."""
    base = replace(config("short"), workload=replace(WORKLOADS["short"][0], num_prompts=2000))
    return [
        SweepPoint({"c": c, "p": p, "n": n},
                   replace(base, args=ServerArgs(max_total_tokens=200_000, schedule_conservativeness=c,
                                                 admission_policy=p), max_concurrency=n))
        for c in (0.3, 1.0, 1.3) for p in ("sglang", "optimistic") for n in (32, 64, 128, 256)
    ]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "sweep_speed.txt"))
    ns = ap.parse_args()
    rows = []
    for name in WORKLOADS:
        wall, completed = time_point(config(name), ns.repeats)
        rows.append((name, wall, completed))
    points = sweep_points()
    workers = default_workers()
    serial, parallel, busy = [], [], []
    for _ in range(ns.repeats):
        t = time.perf_counter()
        run_points(points, 1)
        serial.append(time.perf_counter() - t)
        cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        run_points(points, workers)
        parallel.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        # CPU seconds the worker processes used per wall second: how many cores the sweep kept busy.
        busy.append((after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime) / parallel[-1])
    lines = [
        "# benchmarks/sweep_speed.py: kvadmit sweep points and sweeps",
        f"date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"machine: {cpu_model()}, {os.cpu_count()} cores shared with other work (load average "
        f"{os.getloadavg()[0]:.1f} at the end of this run); Python {platform.python_version()}",
        f"cost model: {COST.name}; median of {ns.repeats} runs per point",
        "",
        "| one point: workload | requests | wall s (median) | target |",
        "| --- | ---: | ---: | --- |",
    ]
    for name, wall, completed in rows:
        verdict = "meets" if wall < TARGET_S else "misses"
        lines.append(f"| {name} | {completed:,} | {wall:.2f} | < {TARGET_S:.0f} s: {verdict} |")
    ratios = [a / b for a, b in zip(serial, parallel, strict=True)]

    def listed(values: list[float], unit: str = "") -> str:
        return ", ".join(f"{v:.2f}{unit}" for v in values)

    lines += [
        "",
        f"24-point sweep (2,000 requests each, short workload), {ns.repeats} rounds: 1 worker "
        f"{listed(serial)} s; {workers} workers {listed(parallel)} s",
        f"speed-up per round {listed(ratios, '×')} (median {statistics.median(ratios):.2f}×); cores kept "
        f"busy by the workers {listed(busy)} (their CPU seconds per wall second)",
    ]
    publish(lines, ns.output)


if __name__ == "__main__":
    main()
