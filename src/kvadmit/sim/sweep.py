"""Sweeps: many simulations of one workload under different server flags and loads, on all cores.

A point is a SimConfig and the settings that made it (for the table). `run_point` simulates it and keeps
what an operator compares: TTFT p50/p99, TPOT, throughput, retractions per minute, time in the queue,
and how full the pool ran. `run_points` spreads points over worker processes (each simulation is
single-threaded and independent), or over a Ray cluster given its address (ray_pool), in the order given.
"""

from __future__ import annotations

import multiprocessing
import operator
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from kvadmit.engine import StepObserver
from kvadmit.executor.base import StepResult
from kvadmit.scheduler.types import ScheduledBatch
from kvadmit.sim.run import SimConfig, SimResult, simulate

Settings = dict[str, object]


class FleetRunner(Protocol):
    """Runs a point as a fleet of replicas (kvadmit.fleet.driver.FleetSpec), one result over all requests."""

    def simulate(self, cfg: SimConfig, watch_steps: tuple[StepObserver, ...] = ()) -> SimResult: ...


@dataclass(frozen=True, slots=True)
class SweepPoint:
    settings: Settings
    cfg: SimConfig
    fleet: FleetRunner | None = None  # None: one server


@dataclass(frozen=True, slots=True)
class PointResult:
    settings: Settings
    completed: int
    failed: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_mean_ms: float
    tpot_p99_ms: float
    output_throughput: float  # tokens/s
    request_throughput: float  # requests/s
    retractions: int
    retractions_per_min: float
    queue_mean_ms: float  # from sending a request to its first prefill starting
    queue_p99_ms: float
    kv_usage_mean: float  # KV held by running requests / pool, averaged over decode time
    running_mean: float  # decode batch size, averaged over decode time
    duration_s: float  # simulated
    wall_s: float  # what the simulation took here
    extra: dict[str, float] = field(default_factory=dict)

    def metric(self, name: str) -> float:
        return float(getattr(self, name))


_KV = operator.attrgetter("kv")
KV_SAMPLE_EVERY = 8  # decode steps between KV-usage samples (counting every request's KV costs O(batch))


class _Watch:
    """Per-step observer: when each request first reached a prefill, and decode-time averages (the KV
    held by running requests sampled every KV_SAMPLE_EVERY-th decode step, weighted by its duration)."""

    def __init__(self) -> None:
        self.first_prefill: dict[str, float] = {}
        self.decode_time = 0.0
        self.batch_time = 0.0
        self.sampled_time = 0.0
        self.kv_time = 0.0
        self.decodes = 0

    def __call__(self, batch: ScheduledBatch, result: StepResult, now: float) -> None:
        if batch.kind == "prefill":
            began = now - result.seconds
            for req in batch.reqs:
                self.first_prefill.setdefault(req.rid, began)
            return
        s = result.seconds
        self.decode_time += s
        self.batch_time += s * len(batch.reqs)
        self.decodes += 1
        if self.decodes % KV_SAMPLE_EVERY == 1:
            self.sampled_time += s
            self.kv_time += s * sum(map(len, map(_KV, batch.reqs)))


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def run_point(point: SweepPoint) -> PointResult:
    watch = _Watch()
    steps: tuple[StepObserver, ...] = (watch,)
    t0 = time.perf_counter()
    if point.fleet is None:
        result = simulate(point.cfg, watch_steps=steps)
    else:
        result = point.fleet.simulate(point.cfg, steps)
    wall = time.perf_counter() - t0
    m = result.metrics
    queue = []
    for i, o in enumerate(result.outcomes):
        began = watch.first_prefill.get(f"req-{i}")
        if began is not None:
            queue.append(1000 * (began - o.start_time))
    pool = result.scheduler.max_total_num_tokens
    decode = watch.decode_time or 1.0
    minutes = result.duration_s / 60 if result.duration_s > 0 else float("inf")
    return PointResult(
        settings=point.settings,
        completed=m.completed,
        failed=len(result.outcomes) - m.completed,
        ttft_p50_ms=m.ttft_ms["median"],
        ttft_p99_ms=m.ttft_ms["p99"],
        tpot_mean_ms=m.tpot_ms["mean"],
        tpot_p99_ms=m.tpot_ms["p99"],
        output_throughput=m.output_throughput,
        request_throughput=m.request_throughput,
        retractions=result.retractions,
        retractions_per_min=result.retractions / minutes,
        queue_mean_ms=float(np.mean(queue)) if queue else 0.0,
        queue_p99_ms=_pct(queue, 99),
        kv_usage_mean=watch.kv_time / (watch.sampled_time or 1.0) / pool,
        running_mean=watch.batch_time / decode,
        duration_s=result.duration_s,
        wall_s=wall,
    )


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def parallel_map(
    fn: Callable[[object], object],
    items: Iterable[object],
    workers: int,
    ray_address: str | None = None,
    on_ray_connect: Callable[[int], None] | None = None,
) -> list[object]:
    """fn over items in worker processes (fork where the platform has it), or as tasks on the Ray cluster
    at ray_address (workers unused; on_ray_connect gets its CPU count), results in input order."""
    items = list(items)
    if ray_address is not None:
        from kvadmit.sim.ray_pool import ray_map

        return ray_map(fn, items, ray_address, on_connect=on_ray_connect)
    workers = max(1, min(workers, len(items)))
    if workers == 1:
        return [fn(x) for x in items]
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ctx.Pool(workers) as pool:
        return pool.map(fn, items, chunksize=1)


def run_points(
    points: Sequence[SweepPoint],
    workers: int | None = None,
    ray_address: str | None = None,
    on_ray_connect: Callable[[int], None] | None = None,
) -> list[PointResult]:
    results = parallel_map(
        run_point,  # type: ignore[arg-type]
        points,
        workers or default_workers(),
        ray_address=ray_address,
        on_ray_connect=on_ray_connect,
    )
    return results  # type: ignore[return-value]
