"""How fast `kvadmit simulate` runs: 100,000 requests with full SGLang semantics, with leaps (the default)
and with --no-leaps (every step through the scheduler), in one run; and a million requests over a fleet.

Workload (issue #3): input 1–2,048 and output 1–1,024 tokens (bench_serving's random lengths with
--random-range-ratio 0), early stops (--disable-ignore-eos: each request stops uniformly within its
max_new_tokens), concurrency 512, a 500,000-token pool, default cost model. Targets: under 20 s on one
core (issue #3); leaps at least 5× faster than --no-leaps, and 1,000,000 requests over 16 replicas in
under 2 minutes of one core (issue #20).

A leap runs a quiet decode step (no arrival, admission, eviction, retraction or finish in it; see
docs/leaps.md) at a fraction of a step's cost, with byte-identical output; the table says what share of
the steps were quiet. The sparse row is a workload built to have long quiet stretches (few, long
requests at a low rate), to show what leaps do where the workload lets them.

The peer is the clock being simulated: how many seconds of serving one wall-clock second simulates.
The machine is shared, so next to the wall time the table gives the CPU time of the run (the time it
spent on its one core) and the load average around it: a wall time well above the CPU time means the
core was busy with other work.

The core rows (--core-compare N) run the random workload twice more, each in a process of its own: once
as pure Python (KVADMIT_PURE_PYTHON=1) and once on the compiled core (`make fast`, kvadmit/native.py),
with the same results required; the other rows run on whichever core this process has (the header says).

    python benchmarks/scheduler_overhead.py is the scheduler's per-step cost; this is the whole loop.
    usage: python benchmarks/sim_speed.py [--requests N ...] [--fleet-requests N] [--fleet-replicas R]
                                          [--core-compare N] [--output FILE | -]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core

from kvadmit import native
from kvadmit.bench.workload import WorkloadSpec
from kvadmit.config import ServerArgs
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.fleet.driver import FleetSpec, simulate_fleet
from kvadmit.fleet.router import RouterSettings
from kvadmit.scheduler.events import Event
from kvadmit.sim.run import SimConfig, simulate
from machine import cpu_model, publish

CORE = "compiled" if native.status().startswith("compiled") else "pure Python"  # this process's core
TARGET_S = 20.0
TARGET_RATIO = 5.0
FLEET_TARGET_S = 120.0


def config(n: int, leaps: bool, sparse: bool = False) -> SimConfig:
    if sparse:  # long requests, a few at a time: most decode steps are quiet
        workload = WorkloadSpec(num_prompts=n, input_len=1024, output_len=1024, range_ratio=1.0)
        return SimConfig(
            args=ServerArgs(max_total_tokens=500_000),
            workload=workload,
            cost=CostModel.simple(decode_step_ms=20.0, prefill_tokens_per_s=10_000.0),
            request_rate=1.0,
            warmup_requests=0,
            leaps=leaps,
        )
    return SimConfig(
        args=ServerArgs(max_total_tokens=500_000),
        workload=WorkloadSpec(
            num_prompts=n, input_len=2048, output_len=1024, range_ratio=0.0, ignore_eos=False
        ),
        cost=CostModel.simple(decode_step_ms=20.0, prefill_tokens_per_s=10_000.0),
        max_concurrency=512,
        warmup_requests=0,
        leaps=leaps,
    )


def progress_writer(path: str | None) -> tuple[Callable[[Event, float], None], ...]:
    """--progress FILE: a line (CPU s, simulated s) each simulated minute, for a run too long to wait for."""
    if path is None:
        return ()
    mark = [60.0]
    cpu0 = time.process_time()

    def note(event: Event, now: float) -> None:
        if now >= mark[0]:
            mark[0] = now + 60.0
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"{time.process_time() - cpu0:.1f} CPU s: {now:,.0f} simulated s\n")

    return (note,)


def timed(label: str, cfg: SimConfig, replicas: int = 1, progress: str | None = None) -> dict[str, object]:
    cpu = time.process_time()
    t = time.perf_counter()
    if replicas == 1:
        result = simulate(cfg)
    else:
        spec = FleetSpec(replicas, RouterSettings("round_robin"))
        result = simulate_fleet(cfg, spec, watch_events=progress_writer(progress)).sim
    wall = time.perf_counter() - t
    cpu = time.process_time() - cpu
    m = result.metrics
    return {
        "label": label,
        "leaps": "on" if cfg.leaps else "off (--no-leaps)",
        "requests": len(result.outcomes),
        "completed": m.completed,
        "tokens": m.total_output,
        "steps": result.steps,
        "leapt": result.leapt,
        "retractions": result.retractions,
        "wall_s": wall,
        "cpu_s": cpu,
        "sim_s": result.duration_s,
        "ttft_p50": m.ttft_ms["median"],
    }


def core_pair(n: int) -> tuple[dict, dict]:  # type: ignore[type-arg]
    """The random workload, leaps on, timed in two fresh processes: pure Python, then the compiled core."""
    rows = []
    for pure in (True, False):
        env = {k: v for k, v in os.environ.items() if k != native.PURE_ENV}
        if pure:
            env[native.PURE_ENV] = "1"
        done = subprocess.run([sys.executable, __file__, "--one-row", str(n)], env=env, check=True,
                              capture_output=True, text=True)  # fmt: skip
        rows.append(json.loads(done.stdout))
    return rows[0], rows[1]


def row(r: dict) -> str:  # type: ignore[type-arg]
    return (
        f"| {r['label']} | {r['leaps']} | {r.get('core', CORE)} | {r['requests']:,} | {r['tokens']:,} | "
        f"{r['steps']:,} | "
        f"{100 * r['leapt'] / max(r['steps'], 1):.1f}% | {r['retractions']:,} | {r['wall_s']:.1f} | "
        f"{r['cpu_s']:.1f} | {r['sim_s']:,.0f} | {r['sim_s'] / r['wall_s']:,.0f}× |"
    )


def same(a: dict, b: dict) -> bool:  # type: ignore[type-arg]
    keys = ("requests", "completed", "tokens", "steps", "retractions", "sim_s", "ttft_p50")
    return all(a[k] == b[k] for k in keys)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, nargs="*", default=[10_000, 100_000])
    ap.add_argument("--sparse-requests", type=int, default=2_000)
    ap.add_argument("--fleet-requests", type=int, default=1_000_000, help="0: no fleet run")
    ap.add_argument("--fleet-replicas", type=int, default=16)
    ap.add_argument("--fleet-compare", type=int, default=100_000, help="fleet requests run both ways")
    ap.add_argument("--progress", metavar="FILE", help="the fleet run's progress, each simulated minute")
    ap.add_argument(
        "--core-compare", type=int, default=100_000, help="requests run pure and compiled; 0: none"
    )
    ap.add_argument("--one-row", type=int, help=argparse.SUPPRESS)  # a core_pair child: one row as JSON
    ap.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "sim_speed.txt"))
    ns = ap.parse_args()
    if ns.one_row:
        r = timed("random lengths, concurrency 512", config(ns.one_row, True))
        print(json.dumps({**r, "core": CORE}))
        return
    load_before = os.getloadavg()[0]
    pairs = []
    for n in ns.requests:
        pairs.append((timed("random lengths, concurrency 512", config(n, True)),
                      timed("random lengths, concurrency 512", config(n, False))))  # fmt: skip
    if ns.sparse_requests:
        label = "sparse: 1 req/s, 1,024 + 1,024 tokens"
        pairs.append((timed(label, config(ns.sparse_requests, True, sparse=True)),
                      timed(label, config(ns.sparse_requests, False, sparse=True))))  # fmt: skip
    k = ns.fleet_replicas
    fleet = []
    if ns.fleet_compare:
        label = f"{k} replicas, round_robin"
        pairs.append((timed(label, config(ns.fleet_compare, True), k),
                      timed(label, config(ns.fleet_compare, False), k)))  # fmt: skip
    cores = core_pair(ns.core_compare) if ns.core_compare else None
    if ns.fleet_requests:
        fleet.append(timed(f"{k} replicas, round_robin", config(ns.fleet_requests, True), k, ns.progress))
    load_after = os.getloadavg()[0]
    lines = [
        "# benchmarks/sim_speed.py: kvadmit simulate, full SGLang semantics, leaps against --no-leaps",
        f"date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"machine: {cpu_model()}, {os.cpu_count()} cores (one used, shared with other jobs); "
        f"Python {platform.python_version()}",
        "workload: input 1–2048, output 1–1024, early stops, concurrency 512 (over the whole fleet), "
        "pool 500,000 tokens (per replica), 20 ms decode steps, 10,000 prefill tokens/s",
        f"load average (1 min) before / after: {load_before:.1f} / {load_after:.1f}",
        f"this process: {native.status()}",
        "",
        "| workload | leaps | core | requests | output tokens | steps | quiet (leapt) | retractions | "
        "wall s | CPU s | simulated s | simulated s per wall s |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for on, off in pairs:
        lines += [row(on), row(off)]
    lines += [row(r) for r in fleet]
    if cores:
        lines += [row(cores[0]), row(cores[1])]
    lines.append("")
    for on, off in pairs:
        lines.append(
            f"{on['label']}, {on['requests']:,} requests: leaps {off['cpu_s'] / on['cpu_s']:.2f}× faster "  # type: ignore[operator]
            f"in CPU time than --no-leaps ({on['cpu_s']:.1f} s against {off['cpu_s']:.1f} s); results "
            f"{'identical' if same(on, off) else 'DIFFERENT'}"
        )
    if cores:
        pure, compiled = cores
        speedup = pure["cpu_s"] / compiled["cpu_s"]
        lines.append(
            f"{pure['requests']:,} requests, leaps on: the compiled core {speedup:.2f}× "
            f"faster in CPU time than pure Python ({compiled['cpu_s']:.1f} s against {pure['cpu_s']:.1f} s; "
            f"{compiled['core']}); results {'identical' if same(pure, compiled) else 'DIFFERENT'}"
        )
    if ns.requests:
        lines += targets(pairs[len(ns.requests) - 1])
    for r in fleet:
        lines.append(
            f"target (issue #20): {r['requests']:,} requests over {k} replicas under {FLEET_TARGET_S:.0f} s "
            f"of one core: {'meets' if r['cpu_s'] < FLEET_TARGET_S else 'misses'} it "  # type: ignore[operator]
            f"(CPU {r['cpu_s']:.0f} s, wall {r['wall_s']:.0f} s)"
        )
    publish(lines, ns.output, keep_earlier=True)  # the file keeps the earlier runs below


def targets(pair: tuple[dict, dict]) -> list[str]:  # type: ignore[type-arg]
    on, off = pair
    ratio = off["cpu_s"] / on["cpu_s"]
    return [
        "",
        f"target (issue #3): {on['requests']:,} requests under {TARGET_S:.0f} s: "
        f"{'meets' if on['wall_s'] < TARGET_S else 'misses'} it "  # type: ignore[operator]
        f"(wall {on['wall_s']:.1f} s, CPU {on['cpu_s']:.1f} s)",
        f"target (issue #20): leaps {TARGET_RATIO:.0f}× faster than --no-leaps on it: "
        f"{'meets' if ratio >= TARGET_RATIO else 'misses'} it ({ratio:.2f}×; "
        f"{100 * on['leapt'] / max(on['steps'], 1):.1f}% of its steps are quiet)",
    ]


if __name__ == "__main__":
    main()
