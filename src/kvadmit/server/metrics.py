"""SGLang's Prometheus metrics (reference section 5): the same names, types, labels and buckets (their
table: observe/metric_names.py), so existing SGLang dashboards and alerts work unchanged against kvadmit.

Scheduler-side series are updated from the scheduler's events on the engine thread, when SGLang's
metrics reporter updates them (each prefill batch, every --decode-log-interval decode batches, and on
going idle); forward seconds after each step; the radix cache's series at each eviction pass;
request-side series (latencies, token counters) from the HTTP side when a request ends, and the HTTP
series from the middleware (server/http_metrics.py) around every request.
"""

from __future__ import annotations

import os
import time
from collections import Counter as Tally
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kvadmit.executor.base import StepResult
from kvadmit.observe import metric_names
from kvadmit.observe.metric_names import Metric
from kvadmit.scheduler.events import DecodeBatchStats, Event, PrefillBatchStats, Retraction
from kvadmit.scheduler.scheduler import Scheduler
from kvadmit.scheduler.types import ScheduledBatch

# Series that exist from the start with the scheduler's labels (a dashboard sees zeros).
_TOUCHED = (
    metric_names.NUM_RUNNING_REQS, metric_names.NUM_QUEUE_REQS, metric_names.NUM_GRAMMAR_QUEUE_REQS,
    metric_names.GEN_THROUGHPUT, metric_names.CACHE_HIT_RATE, metric_names.TOKEN_USAGE,
    metric_names.NUM_USED_TOKENS, metric_names.KV_AVAILABLE_TOKENS, metric_names.KV_EVICTABLE_TOKENS,
    metric_names.KV_USED_TOKENS, metric_names.NEW_TOKEN_RATIO, metric_names.NUM_RETRACTED_REQUESTS,
    metric_names.NUM_RETRACTED_INPUT_TOKENS, metric_names.NUM_RETRACTED_OUTPUT_TOKENS,
    metric_names.QUEUE_TIME, metric_names.DECODE_SUM_SEQ_LENS, metric_names.FULL_TOKEN_USAGE,
    metric_names.SWA_TOKEN_USAGE, metric_names.MAMBA_USAGE, metric_names.SWA_AVAILABLE_TOKENS,
    metric_names.SWA_EVICTABLE_TOKENS, metric_names.SWA_USED_TOKENS, metric_names.MAMBA_AVAILABLE_TOKENS,
    metric_names.MAMBA_EVICTABLE_TOKENS, metric_names.MAMBA_USED_TOKENS, metric_names.UTILIZATION,
)  # fmt: skip
# Gauges registered in prometheus_client's default multiprocess mode: SGLang's scrape labels them by pid.
_PID_GAUGES = (metric_names.NUM_RETRACTED_REQS, metric_names.NUM_PAUSED_REQS)
# 0.5.22's default prefix cache class (also under --disable-radix-cache), which names its series.
CACHE_TYPE = "UnifiedRadixCache"
_STREAMING_COUNTERS = (metric_names.PROMPT_TOKENS, metric_names.GENERATION_TOKENS, metric_names.NUM_REQUESTS)


def _label_names(metric: Metric, priority: bool) -> tuple[str, ...]:
    """The metric's label names; with priority scheduling, SGLang's scheduler and tokenizer collectors add
    `priority` after their own labels (before the metric's extra ones, as its label dicts are built)."""
    labels = metric.labels
    if not priority or "model_name" not in labels:
        return labels
    base = metric_names.SCHEDULER_LABELS if "tp_rank" in labels else metric_names.REQUEST_LABELS
    return (*base, "priority", *labels[len(base) :])


def _register(metric: Metric, registry: CollectorRegistry, priority: bool = False) -> Any:
    """The prometheus_client collector of one metric of the table."""
    names = _label_names(metric, priority)
    if metric.kind == "histogram":
        return Histogram(metric.name, metric.help, names, buckets=metric.buckets, registry=registry)
    if metric.kind == "counter":
        return Counter(metric.name, metric.help, names, registry=registry)
    # SGLang leaves the retraction and pause gauges in prometheus_client's default multiprocess mode ("all"),
    # and sums the HTTP requests in flight over its processes.
    mode = "all" if metric in _PID_GAUGES else "mostrecent"
    if metric is metric_names.HTTP_REQUESTS_ACTIVE:
        mode = "livesum"
    return Gauge(metric.name, metric.help, names, registry=registry, multiprocess_mode=mode)


class _EvictionMetrics:
    """The radix cache's eviction observer: each pass that freed slots, its duration and its tokens. As in
    SGLang, the series appear at the first eviction."""

    def __init__(self, duration: Any, tokens: Any, labels: dict[str, str]) -> None:
        self.duration = duration
        self.tokens = tokens
        self.labels = labels

    def clock(self) -> float:
        return time.perf_counter()

    def evicted(self, tokens: int, seconds: float) -> None:
        self.duration.labels(**self.labels).observe(seconds)
        self.tokens.labels(**self.labels).inc(tokens)


class ServerMetrics:
    def __init__(
        self,
        model_name: str,
        max_total_num_tokens: int,
        page_size: int,
        context_len: int,
        *,
        weight_gb: float = 0.0,
        kv_cache_gb: float = 0.0,
        available_gb: float = 0.0,
        priority_scheduling: bool = False,
        default_priority: int | None = None,
    ):
        self.registry = CollectorRegistry()
        self._labels = {
            "model_name": model_name, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
            "moe_ep_rank": "0",
        }  # fmt: skip
        self._req_labels = {"model_name": model_name, "engine_type": "unified"}
        # --enable-priority-scheduling: a `priority` label everywhere ("" on the usual series), per-priority
        # running and queued counts, and request series labelled with the request's priority
        self._by_priority = priority_scheduling
        self._default_priority = default_priority
        self._known_priorities: set[int | None] = set()
        self._read_priorities: Callable[[], tuple[list[int | None], list[int | None]]] | None = None
        if priority_scheduling:
            self._labels["priority"] = self._req_labels["priority"] = ""
        self._series = {
            metric: _register(metric, self.registry, priority_scheduling) for metric in metric_names.SERVED
        }
        for metric, value in (
            (metric_names.MAX_TOTAL_NUM_TOKENS, max_total_num_tokens),
            (metric_names.PAGE_SIZE, page_size),
            (metric_names.CONTEXT_LEN, context_len),
            (metric_names.NUM_PAGES, max_total_num_tokens // page_size),
            (metric_names.WEIGHT_MEMORY_USAGE_GB, weight_gb),
            (metric_names.KV_CACHE_MEMORY_USAGE_GB, kv_cache_gb),
            (metric_names.STARTUP_AVAILABLE_GPU_MEMORY_GB, available_gb),
        ):
            self._sched(metric).set(value)
        for metric in _TOUCHED:
            self._sched(metric)
        self._pid = str(os.getpid())
        for metric in _PID_GAUGES:
            self._sched(metric, pid=self._pid)
        for mode in ("input", "device_hit", "host_hit", "storage_hit"):  # every operand of a hit-rate ratio
            self._sched(metric_names.PREFILL_EFFECTIVE_TOKENS, mode=mode)
        self._max_total = max_total_num_tokens
        self._read_pool: Callable[[], tuple[int, int]] | None = None  # (available, evictable)
        for mode in ("prefill_compute", "prefill_cache", "decode"):
            self._sched(metric_names.REALTIME_TOKENS, mode=mode)
        for streaming in ("true", "false"):
            for metric in _STREAMING_COUNTERS:
                self._req(metric, is_streaming=streaming)
        self._req(metric_names.NUM_ABORTED_REQUESTS)
        self._last_retracted = 0  # the most recent retraction's count, until the next report
        self._arrivals: dict[str, float] = {}
        self._last_decode_report = time.time()

    def _sched(self, metric: Metric, **extra: str) -> Any:
        """The metric's series of this scheduler (created at the first call)."""
        return self._series[metric].labels(**self._labels, **extra)

    def _req(self, metric: Metric, **extra: str) -> Any:
        """The metric's series of this model's requests."""
        return self._series[metric].labels(**self._req_labels, **extra)

    # ----- scheduler side (engine thread) ---------------------------------------------------------
    def attach(self, scheduler: Scheduler) -> None:
        """Read the pool at each report (as SGLang's pool observer does) and time the cache's evictions."""
        pool, cache = scheduler.pool, scheduler.cache
        self._read_pool = lambda: (pool.available_size(), cache.evictable_size())
        labels = {"cache_type": CACHE_TYPE, "tp_rank": "0", "pp_rank": "0", "dp_rank": "0"}
        cache.eviction_observer = _EvictionMetrics(
            self._series[metric_names.EVICTION_DURATION], self._series[metric_names.EVICTED_TOKENS], labels
        )
        self._publish_pool()  # the empty pool, before the first report
        if self._by_priority:
            self._read_priorities = lambda: (
                [r.priority for r in scheduler.running.reqs],
                [r.priority for r in scheduler.waiting],
            )

    def on_event(self, event: Event, now: float) -> None:
        m = metric_names
        if isinstance(event, Retraction):
            if not event.rids:
                return
            self._last_retracted = len(event.rids)
            self._sched(m.NUM_RETRACTED_REQUESTS).inc(len(event.rids))
            self._sched(m.NUM_RETRACTED_INPUT_TOKENS).inc(event.input_tokens)
            self._sched(m.NUM_RETRACTED_OUTPUT_TOKENS).inc(event.output_tokens)
        elif isinstance(event, PrefillBatchStats):
            self._batch_state(event)
            self._sched(m.NEW_TOKEN_RATIO).set(event.new_token_ratio)
            # Retracted requests' recomputed tokens are left out (0.5.22's "effective" tokens); a report
            # with none left sets the rate to 0 rather than keeping the previous one.
            hit = event.hit_tokens_for_rate
            computed = event.input_tokens_for_rate - event.reprocessed_input_tokens
            total = hit + computed
            self._sched(m.CACHE_HIT_RATE).set(hit / total if total > 0 else 0.0)
            if computed > 0:
                self._sched(m.PREFILL_EFFECTIVE_TOKENS, mode="input").inc(computed)
            if hit > 0:  # one tier: every cached token is on the device
                self._sched(m.PREFILL_EFFECTIVE_TOKENS, mode="device_hit").inc(hit)
            self._sched(m.REALTIME_TOKENS, mode="prefill_compute").inc(event.new_token)
            self._sched(m.REALTIME_TOKENS, mode="prefill_cache").inc(event.cached_token)
            self._report_retracted()
        elif isinstance(event, DecodeBatchStats):
            self._batch_state(event)
            self._sched(m.DECODE_SUM_SEQ_LENS).set(event.sum_seq_lens)
            elapsed = now - self._last_decode_report
            self._last_decode_report = now
            if elapsed > 0:
                self._sched(m.GEN_THROUGHPUT).set(event.generated_tokens / elapsed)
            self._report_retracted()

    def _batch_state(self, event: PrefillBatchStats | DecodeBatchStats) -> None:
        self._sched(metric_names.NUM_RUNNING_REQS).set(event.running_req)
        self._sched(metric_names.NUM_QUEUE_REQS).set(event.queue_req)
        self._publish_by_priority()
        self._sched(metric_names.TOKEN_USAGE).set(round(event.token_usage, 2))
        self._sched(metric_names.NUM_USED_TOKENS).set(event.num_used_tokens)
        self._publish_pool()

    def _publish_by_priority(self, idle: bool = False) -> None:
        """SGLang's QueueCount breakdown: a series per priority seen so far (0 once none is left)."""
        if self._read_priorities is None:
            return
        running, waiting = self._read_priorities()
        if idle:
            running = []
        self._known_priorities.update(running, waiting)
        base = {k: v for k, v in self._labels.items() if k != "priority"}
        m = metric_names
        for metric, reqs in ((m.NUM_RUNNING_REQS, running), (m.NUM_QUEUE_REQS, waiting)):
            counts = Tally(reqs)
            for prio in self._known_priorities:
                self._series[metric].labels(**base, priority=str(prio)).set(counts.get(prio, 0))

    def _publish_pool(self) -> None:
        """The full-attention pool as it is now: free, cache-only and in-use slots, and the in-use share
        unrounded (token_usage is the same share rounded to 2 places)."""
        if self._read_pool is None:
            return
        available, evictable = self._read_pool()
        used = self._max_total - available - evictable
        self._sched(metric_names.KV_AVAILABLE_TOKENS).set(available)
        self._sched(metric_names.KV_EVICTABLE_TOKENS).set(evictable)
        self._sched(metric_names.KV_USED_TOKENS).set(used)
        self._sched(metric_names.FULL_TOKEN_USAGE).set(used / self._max_total)

    def _report_retracted(self) -> None:
        # SGLang copies the last retraction's count into the next report, then resets it: a scrape
        # sees it only until the following report. Use the _total counter for rates.
        self._sched(metric_names.NUM_RETRACTED_REQS, pid=self._pid).set(self._last_retracted)
        self._last_retracted = 0
        self._sched(metric_names.NUM_PAUSED_REQS, pid=self._pid).set(0)  # no weight updates pause requests

    def publish_idle(self, queue: int) -> None:
        self._sched(metric_names.NUM_RUNNING_REQS).set(0)
        self._sched(metric_names.NUM_QUEUE_REQS).set(queue)
        self._publish_by_priority(idle=True)
        self._sched(metric_names.GEN_THROUGHPUT).set(0)
        self._publish_pool()

    def on_arrival(self, rid: str, t: float) -> None:
        self._arrivals[rid] = t

    def on_step(self, batch: ScheduledBatch, result: StepResult, now: float) -> None:
        # The executor's measured seconds, in SGLang's ForwardMode categories (a prefill is "extend").
        category = "decode" if batch.kind == "decode" else "extend"
        self._sched(metric_names.FORWARD_EXECUTION_SECONDS, category=category).inc(result.seconds)
        if batch.kind == "decode":
            self._sched(metric_names.REALTIME_TOKENS, mode="decode").inc(len(batch.reqs))
            return
        started = now - result.seconds
        for req in batch.reqs:
            arrived = self._arrivals.pop(req.rid, None)
            if arrived is not None:
                self._sched(metric_names.QUEUE_TIME).observe(max(0.0, started - arrived))

    def forget(self, rid: str) -> None:
        self._arrivals.pop(rid, None)

    # ----- request side (HTTP) ----------------------------------------------------------------------
    def request_done(
        self,
        *,
        streaming: bool,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int,
        aborted: bool,
        ttft: float | None,
        e2e: float,
        itls: list[float],
        priority: int | None = None,
    ) -> None:
        """`priority`: what the request asked for (None: nothing); with priority scheduling on, its series
        carry it after the default value, as SGLang's tokenizer labels them ("" for none)."""
        m = metric_names
        s = "true" if streaming else "false"
        labels = self._req_labels
        if self._by_priority:
            shown = priority if priority is not None else self._default_priority
            labels = {**labels, "priority": "" if shown is None else str(shown)}

        def req(metric: Metric, **extra: str) -> Any:
            return self._series[metric].labels(**labels, **extra)

        req(m.PROMPT_TOKENS, is_streaming=s).inc(prompt_tokens)
        req(m.GENERATION_TOKENS, is_streaming=s).inc(completion_tokens)
        req(m.NUM_REQUESTS, is_streaming=s).inc()
        if cached_tokens:
            req(m.CACHED_TOKENS, cache_source="device").inc(cached_tokens)
        req(m.PROMPT_TOKENS_HISTOGRAM).observe(prompt_tokens)
        req(m.UNCACHED_PROMPT_TOKENS_HISTOGRAM).observe(prompt_tokens - cached_tokens)
        req(m.GENERATION_TOKENS_HISTOGRAM).observe(completion_tokens)
        if aborted:
            req(m.NUM_ABORTED_REQUESTS).inc()
        if ttft is not None:
            req(m.TIME_TO_FIRST_TOKEN, is_streaming=s).observe(ttft)
            if completion_tokens > 1:
                tpot = (e2e - ttft) / (completion_tokens - 1)
                req(m.TIME_PER_OUTPUT_TOKEN, is_streaming=s).observe(tpot)
        req(m.E2E_REQUEST_LATENCY, is_streaming=s).observe(e2e)
        itl = req(m.INTER_TOKEN_LATENCY)
        for gap in itls:
            itl.observe(gap)

    # ----- HTTP (the middleware, event loop) ------------------------------------------------------
    def http_request_started(self, endpoint: str, method: str) -> None:
        self._series[metric_names.HTTP_REQUESTS].labels(endpoint=endpoint, method=method).inc()
        self._series[metric_names.HTTP_REQUESTS_ACTIVE].labels(endpoint=endpoint, method=method).inc()

    def http_response(self, endpoint: str, method: str, status: int) -> None:
        self._series[metric_names.HTTP_RESPONSES].labels(
            endpoint=endpoint, status_code=str(status), method=method
        ).inc()

    def http_request_ended(self, endpoint: str, method: str) -> None:
        self._series[metric_names.HTTP_REQUESTS_ACTIVE].labels(endpoint=endpoint, method=method).dec()

    def render(self) -> bytes:
        return generate_latest(self.registry)
