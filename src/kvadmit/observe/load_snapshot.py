"""The load a router polls, read from a scheduler: SGLang 0.5.22's `LoadSnapshot` (what `/v1/loads`
answers, `managers/load_snapshot.py` and `scheduler_components/load_inquirer.py`), for the server's
`/v1/loads` (server/load_api.py) and for the simulated smg router (fleet/), which reads the same numbers.

`LoadCounters` listens to an engine (events and steps) for what the snapshot accumulates: the generation
throughput, the cache hit rate, the prefill totals and the decode step-time moments. `load_snapshot`
reads the scheduler (on the engine thread in the server; between steps in a simulated fleet)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from kvadmit.scheduler.events import DecodeBatchStats, PrefillBatchStats, Retraction

if TYPE_CHECKING:
    from kvadmit.scheduler.scheduler import Scheduler
    from kvadmit.scheduler.types import ScheduledBatch


class TimedStep(Protocol):
    """What a step observer is told about a step's result (executor.base.StepResult has it)."""

    seconds: float


class Observable(Protocol):
    """The engine's observer lists (kvadmit.engine.Engine)."""

    observers: list[Callable[[Any, float], None]]
    step_observers: list[Callable[[Any, Any, float], None]]


CACHE_AWARE_POLICIES = ("lpm", "dfs-weight")  # the orders that match waiting requests against the cache
HIT_RATE_WINDOW_S = 15.0  # SGLANG_CACHE_HIT_RATE_WINDOW_SECONDS' default
DISAGG_QUEUES = ("prefill_bootstrap_queue_reqs", "prefill_inflight_queue_reqs", "decode_prealloc_queue_reqs",
                 "decode_transfer_queue_reqs", "decode_retracted_queue_reqs")  # fmt: skip


GEN_THROUGHPUT_STALE_S = 30.0  # GEN_THROUGHPUT_STALENESS_SECONDS: a decode window older than this reads 0
IDLE_LOG_INTERVAL_S = 30.0  # the idle pass publishes at least this often (`_maybe_log_idle_metrics`)


class LoadCounters:
    """What the load snapshot accumulates between polls (engine thread only).

    As in 0.5.22, the snapshot's `gen_throughput` and `cache_hit_rate` are the scheduler's metric stats,
    which it updates only under --enable-metrics (`metrics_on`); without it they stay 0. With it:
    `gen_throughput` is the last decode report's window (tokens since the previous report over the time
    since it, the first window counted from the start: an idle spell inside it counts), refreshed at each
    prefill report and 0 once that window is 30 s old; the idle pass zeroes it as 0.5.22's
    `_maybe_log_idle_metrics` does (below). `cache_hit_rate` is the last prefill report's, 0 for a report
    with no tokens. `last_gen_throughput` (/server_info) is the window itself, with or without metrics."""

    def __init__(self, metrics_on: bool = True, started: float | None = None) -> None:
        self.metrics_on = metrics_on
        self.last_gen_throughput = 0.0  # the last decode report's window (tokens/s)
        self.gen_throughput = 0.0  # the stats' value (metrics on)
        self.cache_hit_rate = 0.0  # the last prefill report's hit tokens / (hit + computed) (metrics on)
        self.last_retracted = 0  # requests retracted since the previous report (SGLang's stats)
        self.total_prefill_uncached_tokens = 0
        self.total_prefill_busy_us = 0
        # decode steps, Σ batch size, Σ step µs, Σ batch size², Σ batch size × step µs, Σ tokens generated
        self.decode_moments = [0.0] * 6
        self._last_decode_report = time.time() if started is None else started
        # What the idle pass reads: the stats' running-requests gauge (set by the last decode report to its
        # batch, by the last prefill report to the running batch it joined, by an idle publish to 0) and
        # when the stats were last logged (metrics_collector.last_log_time: any of those three).
        self._running_gauge = 0
        self._last_log = self._last_decode_report
        self._prefills: deque[tuple[float, int, int]] = deque()  # (event time, hit tokens, all tokens)

    def recent_hit_rate(self, now: float) -> float:
        """Hit tokens / prefilled tokens over the prefills of the last HIT_RATE_WINDOW_S seconds."""
        while self._prefills and self._prefills[0][0] <= now - HIT_RATE_WINDOW_S:
            self._prefills.popleft()
        hit = sum(h for _, h, _ in self._prefills)
        total = sum(t for _, _, t in self._prefills)
        return hit / total if total else 0.0

    def attach(self, engine: Observable) -> None:
        engine.observers.append(self.on_event)
        engine.step_observers.append(self.on_step)

    def on_event(self, event: Any, now: float) -> None:
        if isinstance(event, Retraction):
            self.last_retracted = len(event.rids)
        elif isinstance(event, PrefillBatchStats):
            if not self.metrics_on:
                return
            total = event.hit_tokens_for_rate + event.input_tokens_for_rate
            self.cache_hit_rate = event.hit_tokens_for_rate / total if total else 0.0
            if total:
                self._prefills.append((now, event.hit_tokens_for_rate, total))
            if now - self._last_decode_report > GEN_THROUGHPUT_STALE_S:
                self.last_gen_throughput = 0.0
            self.gen_throughput = self.last_gen_throughput
            self._running_gauge, self._last_log = event.running_req, now
        elif isinstance(event, DecodeBatchStats):
            gap = now - self._last_decode_report
            self._last_decode_report = now
            self.last_gen_throughput = event.generated_tokens / gap if gap > 0 else 0.0
            if self.metrics_on:
                self.gen_throughput = self.last_gen_throughput
                self._running_gauge, self._last_log = event.running_req, now

    def on_idle(self, now: float) -> None:
        """0.5.22's idle pass (`_maybe_log_idle_metrics`, metrics on): it publishes, zeroing the throughput,
        only when the running gauge still shows requests or the stats were last logged over 30 s ago; else
        the last value stands (a batch that ran no decode report since joining an empty one)."""
        if not self.metrics_on:
            return
        if self._running_gauge != 0 or now > self._last_log + IDLE_LOG_INTERVAL_S:
            self.gen_throughput = 0.0
            self._running_gauge, self._last_log = 0, now

    def on_step(self, batch: ScheduledBatch, result: TimedStep, now: float) -> None:
        step_us = int(result.seconds * 1e6)
        if batch.kind == "prefill":
            self.total_prefill_busy_us += step_us
            if batch.stats is not None:
                self.total_prefill_uncached_tokens += batch.stats.new_token
            return
        b = len(batch.reqs)
        if b == 0 or step_us <= 0:
            return
        for i, value in enumerate((1, b, step_us, b * b, b * step_us, b)):
            self.decode_moments[i] += float(value)


def pool_used(s: Scheduler) -> int:
    return s.max_total_num_tokens - s.pool.available_size() - s.cache.evictable_size()


def load_snapshot(s: Scheduler, counters: LoadCounters, now: float | None = None) -> dict[str, Any]:
    """One DP rank's LoadSnapshot with every section kvadmit has, keys in 0.5.22's order. `memory`,
    `speculative` and `lora` are left out, as SGLang leaves them out when it has no numbers for them."""
    used = pool_used(s)
    waiting_tokens = sum(r.seqlen for r in s.waiting)
    # Tokens still to prefill (load_inquirer's get_num_waiting_uncached_tokens): under a cache-aware order
    # each waiting request's tokens beyond its matched prefix, otherwise its tokens times the recent miss
    # rate, rounded down per request; plus what the chunked request has not prefilled yet.
    if s.order.effective_policy(s.waiting) in CACHE_AWARE_POLICIES:
        uncached = sum(max(0, r.seqlen - r.prefix_len) for r in s.waiting)
    else:
        miss = 1.0 - counters.recent_hit_rate(time.time() if now is None else now)
        uncached = sum(int(r.seqlen * miss) for r in s.waiting)
    if s.chunked_req is not None:
        uncached += max(0, s.chunked_req.seqlen - s.chunked_req.prefix_len)
    moments = counters.decode_moments
    if not s.running.reqs and not s.waiting and s.chunked_req is None:
        counters.on_idle(time.time() if now is None else now)  # (SGLang's scheduler idles as it empties)
    return {
        "timestamp": time.time(),
        "dp_rank": 0,
        "num_running_reqs": len(s.running.reqs),
        "num_waiting_reqs": len(s.waiting),
        "num_waiting_uncached_tokens": uncached,
        "num_used_tokens": used,
        "num_total_tokens": used + waiting_tokens,
        "num_active_tokens": used + waiting_tokens,  # no KV awaits a transfer outside PD decode
        "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": s.max_total_num_tokens,
        "max_running_requests": s.max_running_requests,
        "token_usage": round(used / s.max_total_num_tokens, 4),
        "gen_throughput": round(counters.gen_throughput, 2),
        "cache_hit_rate": round(counters.cache_hit_rate, 4),
        "utilization": 0.0,  # 0.5.22 has no setter for it: 0 outside PD prefill
        "total_prefill_uncached_tokens": counters.total_prefill_uncached_tokens,
        "total_prefill_busy_us": counters.total_prefill_busy_us,
        "decode_moments": list(moments) if moments[0] > 0 else None,
        "disaggregation": {"mode": "null", **dict.fromkeys(DISAGG_QUEUES, 0),
                           "kv_transfer_speed_gb_s": 0.0, "kv_transfer_latency_ms": 0.0},
        "queues": {"waiting": len(s.waiting), "grammar": 0, "paused": 0, "retracted": counters.last_retracted,
                   "prealloc_ready": 0},
    }  # fmt: skip
