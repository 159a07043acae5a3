"""The per-replica table of a fleet run: where the router sent the requests and what each replica did
with them. Peak queue: the most requests waiting after any of the replica's steps. KV usage: the pool's
tokens in use (SGLang's token usage) after each step; peak, and the mean weighted by step time over the
replica's busy time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvadmit.fleet.driver import FleetResult


@dataclass(frozen=True, slots=True)
class ReplicaRow:
    replica: int
    requests: int
    peak_queue: int
    retractions: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    kv_peak: float
    kv_mean: float


def replica_rows(result: FleetResult) -> list[ReplicaRow]:
    ttfts: list[list[float]] = [[] for _ in result.replicas]
    for outcome, k in zip(result.sim.outcomes, result.routed, strict=True):
        if outcome.success:
            ttfts[k].append(1000 * outcome.ttft)
    rows = []
    for r, ttft in zip(result.replicas, ttfts, strict=True):
        rows.append(
            ReplicaRow(
                replica=r.index,
                requests=r.requests,
                peak_queue=r.peak_queue,
                retractions=r.client.retractions,
                ttft_p50_ms=float(np.median(ttft)) if ttft else 0.0,
                ttft_p99_ms=float(np.percentile(ttft, 99)) if ttft else 0.0,
                kv_peak=r.kv_peak,
                kv_mean=r.kv_time / r.busy_time if r.busy_time > 0 else 0.0,
            )
        )
    return rows


def render_replica_table(result: FleetResult) -> str:
    head = ["replica", "requests", "peak queue", "retractions", "TTFT p50 ms", "TTFT p99 ms", "KV usage peak",
            "KV usage mean"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + " ---: |" * len(head)]
    for row in replica_rows(result):
        cells = [f"DP{row.replica}", f"{row.requests:,}", f"{row.peak_queue:,}", f"{row.retractions:,}",
                 f"{row.ttft_p50_ms:,.1f}", f"{row.ttft_p99_ms:,.1f}", f"{row.kv_peak:.2f}",
                 f"{row.kv_mean:.2f}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
