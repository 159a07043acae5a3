"""How long a fleet simulation takes: one server, the same behind the router (the fleet driver's own
cost), and four replicas under each routing policy, on sim_speed.py's workload.

Workload (as benchmarks/sim_speed.py): input 1–2,048 and output 1–1,024 tokens (bench_serving's random
lengths, early stops), concurrency 512 over the whole fleet, a 500,000-token pool per replica, 20 ms decode
steps and 10,000 prefill tokens/s, no warm-up.

    usage: python benchmarks/fleet_speed.py [--requests N] [--replicas R] [--output FILE | -]
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
from kvadmit.fleet.driver import FleetSpec, simulate_fleet
from kvadmit.fleet.router import RouterSettings
from kvadmit.sim.run import SimConfig, SimResult, simulate
from machine import cpu_model, publish


def config(n: int) -> SimConfig:
    return SimConfig(
        args=ServerArgs(max_total_tokens=500_000),
        workload=WorkloadSpec(
            num_prompts=n, input_len=2048, output_len=1024, range_ratio=0.0, ignore_eos=False
        ),
        cost=CostModel.simple(decode_step_ms=20.0, prefill_tokens_per_s=10_000.0),
        max_concurrency=512,
        warmup_requests=0,
    )


def timed(label: str, replicas: int, run: object) -> dict[str, object]:
    cpu, wall = time.process_time(), time.perf_counter()
    result, split = run()  # type: ignore[operator]
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert isinstance(result, SimResult)
    m = result.metrics
    return {"label": label, "replicas": replicas, "requests": len(result.outcomes), "completed": m.completed,
            "steps": result.steps, "wall_s": wall, "cpu_s": cpu, "sim_s": result.duration_s,
            "ttft_p50": m.ttft_ms["median"], "ttft_p99": m.ttft_ms["p99"], "split": split}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "fleet_speed.txt"))
    ns = ap.parse_args()
    cfg = config(ns.requests)
    load_before = os.getloadavg()[0]

    def fleet(policy: str, k: int) -> object:
        def go() -> tuple[SimResult, list[int]]:
            r = simulate_fleet(cfg, FleetSpec(k, RouterSettings(policy)))
            return r.sim, [x.requests for x in r.replicas]

        return go

    rows = [timed("simulate (one server)", 1, lambda: (simulate(cfg), [ns.requests]))]
    rows.append(timed("--replicas 1 --router round_robin", 1, fleet("round_robin", 1)))
    for policy in ("round_robin", "random", "power_of_two", "cache_aware"):
        rows.append(
            timed(f"--replicas {ns.replicas} --router {policy}", ns.replicas, fleet(policy, ns.replicas))
        )
    load_after = os.getloadavg()[0]
    lines = [
        "# benchmarks/fleet_speed.py: kvadmit simulate --replicas N --router POLICY (leaps on, the default)",
        f"date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"machine: {cpu_model()}, {os.cpu_count()} cores (one used, shared with other jobs); "
        f"Python {platform.python_version()}",
        "workload: input 1–2048, output 1–1024, early stops, concurrency 512 over the fleet, "
        "pool 500,000 tokens per replica, 20 ms decode steps, 10,000 prefill tokens/s",
        f"load average (1 min) before / after: {load_before:.1f} / {load_after:.1f}",
        "",
        "| run | requests | steps | CPU s | wall s | simulated s | TTFT p50 ms | TTFT p99 ms | "
        "requests per replica |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        split = ", ".join(f"{c:,}" for c in r["split"])  # type: ignore[attr-defined]
        lines.append(
            f"| {r['label']} | {r['requests']:,} | {r['steps']:,} | {r['cpu_s']:.1f} | {r['wall_s']:.1f} | "
            f"{r['sim_s']:,.0f} | {r['ttft_p50']:,.0f} | {r['ttft_p99']:,.0f} | {split} |"
        )
    plain, one = rows[0], rows[1]
    lines += [
        "",
        f"the fleet driver's own cost with one replica: "
        f"{one['cpu_s'] / plain['cpu_s']:.2f}× simulate's CPU time (identical results)",  # type: ignore[operator]
    ]
    publish(lines, ns.output)


if __name__ == "__main__":
    main()
