"""SGLang's Prometheus metrics (reference section 5): the same names, types, labels and buckets (their
table: observe/metric_names.py), so existing SGLang dashboards and alerts work unchanged against kvadmit.

Scheduler-side series are updated from the scheduler's events on the engine thread, when SGLang's
metrics reporter updates them (each prefill batch, every --decode-log-interval decode batches, and on
going idle); request-side series (latencies, token counters) from the HTTP side when a request ends.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kvadmit.executor.base import StepResult
from kvadmit.observe import metric_names
from kvadmit.observe.metric_names import Metric
from kvadmit.scheduler.events import DecodeBatchStats, Event, PrefillBatchStats, Retraction
from kvadmit.scheduler.types import ScheduledBatch

# Series that exist from the start with the scheduler's labels (a dashboard sees zeros).
_TOUCHED = (
    metric_names.NUM_RUNNING_REQS, metric_names.NUM_QUEUE_REQS, metric_names.NUM_GRAMMAR_QUEUE_REQS,
    metric_names.GEN_THROUGHPUT, metric_names.CACHE_HIT_RATE, metric_names.TOKEN_USAGE,
    metric_names.NUM_USED_TOKENS, metric_names.KV_AVAILABLE_TOKENS, metric_names.KV_EVICTABLE_TOKENS,
    metric_names.KV_USED_TOKENS, metric_names.NEW_TOKEN_RATIO, metric_names.NUM_RETRACTED_REQS,
    metric_names.NUM_PAUSED_REQS, metric_names.NUM_RETRACTED_REQUESTS,
    metric_names.NUM_RETRACTED_INPUT_TOKENS, metric_names.NUM_RETRACTED_OUTPUT_TOKENS,
    metric_names.QUEUE_TIME,
)  # fmt: skip
_STREAMING_COUNTERS = (metric_names.PROMPT_TOKENS, metric_names.GENERATION_TOKENS, metric_names.NUM_REQUESTS)


def _register(metric: Metric, registry: CollectorRegistry) -> Any:
    """The prometheus_client collector of one metric of the table."""
    if metric.kind == "histogram":
        return Histogram(metric.name, metric.help, metric.labels, buckets=metric.buckets, registry=registry)
    if metric.kind == "counter":
        return Counter(metric.name, metric.help, metric.labels, registry=registry)
    # The retraction gauge keeps prometheus_client's default multiprocess mode, as it always had.
    mode = "all" if metric is metric_names.NUM_RETRACTED_REQS else "mostrecent"
    return Gauge(metric.name, metric.help, metric.labels, registry=registry, multiprocess_mode=mode)


class ServerMetrics:
    def __init__(self, model_name: str, max_total_num_tokens: int, page_size: int, context_len: int):
        self.registry = CollectorRegistry()
        self._labels = {
            "model_name": model_name, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
            "moe_ep_rank": "0",
        }  # fmt: skip
        self._req_labels = {"model_name": model_name, "engine_type": "unified"}
        self._series = {metric: _register(metric, self.registry) for metric in metric_names.SERVED}
        for metric, value in (
            (metric_names.MAX_TOTAL_NUM_TOKENS, max_total_num_tokens),
            (metric_names.PAGE_SIZE, page_size),
            (metric_names.CONTEXT_LEN, context_len),
            (metric_names.NUM_PAGES, max_total_num_tokens // page_size),
        ):
            self._sched(metric).set(value)
        for metric in _TOUCHED:
            self._sched(metric)
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
            total = event.hit_tokens_for_rate + event.input_tokens_for_rate
            if total:
                self._sched(m.CACHE_HIT_RATE).set(event.hit_tokens_for_rate / total)
            self._sched(m.REALTIME_TOKENS, mode="prefill_compute").inc(event.new_token)
            self._sched(m.REALTIME_TOKENS, mode="prefill_cache").inc(event.cached_token)
            self._report_retracted()
        elif isinstance(event, DecodeBatchStats):
            self._batch_state(event)
            elapsed = now - self._last_decode_report
            self._last_decode_report = now
            if elapsed > 0:
                self._sched(m.GEN_THROUGHPUT).set(event.generated_tokens / elapsed)
            self._report_retracted()

    def _batch_state(self, event: PrefillBatchStats | DecodeBatchStats) -> None:
        self._sched(metric_names.NUM_RUNNING_REQS).set(event.running_req)
        self._sched(metric_names.NUM_QUEUE_REQS).set(event.queue_req)
        self._sched(metric_names.TOKEN_USAGE).set(round(event.token_usage, 2))
        self._sched(metric_names.NUM_USED_TOKENS).set(event.num_used_tokens)

    def _report_retracted(self) -> None:
        # SGLang copies the last retraction's count into the next report, then resets it: a scrape
        # sees it only until the following report. Use the _total counter for rates.
        self._sched(metric_names.NUM_RETRACTED_REQS).set(self._last_retracted)
        self._last_retracted = 0

    def set_pool(self, available: int, evictable: int, used: int) -> None:
        self._sched(metric_names.KV_AVAILABLE_TOKENS).set(available)
        self._sched(metric_names.KV_EVICTABLE_TOKENS).set(evictable)
        self._sched(metric_names.KV_USED_TOKENS).set(used)

    def publish_idle(self, queue: int) -> None:
        self._sched(metric_names.NUM_RUNNING_REQS).set(0)
        self._sched(metric_names.NUM_QUEUE_REQS).set(queue)
        self._sched(metric_names.GEN_THROUGHPUT).set(0)

    def on_arrival(self, rid: str, t: float) -> None:
        self._arrivals[rid] = t

    def on_step(self, batch: ScheduledBatch, result: StepResult, now: float) -> None:
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
    ) -> None:
        m = metric_names
        s = "true" if streaming else "false"
        self._req(m.PROMPT_TOKENS, is_streaming=s).inc(prompt_tokens)
        self._req(m.GENERATION_TOKENS, is_streaming=s).inc(completion_tokens)
        self._req(m.NUM_REQUESTS, is_streaming=s).inc()
        if cached_tokens:
            self._req(m.CACHED_TOKENS, cache_source="device").inc(cached_tokens)
        self._req(m.PROMPT_TOKENS_HISTOGRAM).observe(prompt_tokens)
        self._req(m.UNCACHED_PROMPT_TOKENS_HISTOGRAM).observe(prompt_tokens - cached_tokens)
        self._req(m.GENERATION_TOKENS_HISTOGRAM).observe(completion_tokens)
        if aborted:
            self._req(m.NUM_ABORTED_REQUESTS).inc()
        if ttft is not None:
            self._req(m.TIME_TO_FIRST_TOKEN, is_streaming=s).observe(ttft)
            if completion_tokens > 1:
                tpot = (e2e - ttft) / (completion_tokens - 1)
                self._req(m.TIME_PER_OUTPUT_TOKEN, is_streaming=s).observe(tpot)
        self._req(m.E2E_REQUEST_LATENCY, is_streaming=s).observe(e2e)
        itl = self._req(m.INTER_TOKEN_LATENCY)
        for gap in itls:
            itl.observe(gap)

    def render(self) -> bytes:
        return generate_latest(self.registry)
