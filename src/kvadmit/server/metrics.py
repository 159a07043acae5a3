"""SGLang's Prometheus metrics (reference section 5): the same names, types, labels and buckets, so
existing SGLang dashboards and alerts work unchanged against kvadmit.

Scheduler-side series are updated from the scheduler's events on the engine thread, when SGLang's
metrics reporter updates them (each prefill batch, every --decode-log-interval decode batches, and on
going idle); request-side series (latencies, token counters) from the HTTP side when a request ends.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kvadmit.executor.base import StepResult
from kvadmit.scheduler.events import DecodeBatchStats, Event, PrefillBatchStats, Retraction
from kvadmit.scheduler.types import ScheduledBatch

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
    0.200, 0.400, 0.600, 0.800, 1, 2, 4, 6, 8,
)  # fmt: skip
E2E_BUCKETS = (*TTFT_BUCKETS, 600, 1200, 1800, 2400)
QUEUE_TIME_BUCKETS = (
    0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20,
    *range(30, 101, 10), *range(200, 1001, 100), 1200, 1400, 1600, 1800, 2000, 2500, 3000,
)  # fmt: skip
TOKEN_COUNT_BUCKETS = (
    100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12000, 15000,
    20000, 22000, 25000, 30000, 35000, 40000, 66000, 99000, 132000, 300000, 600000, 900000, 1100000,
)  # fmt: skip

SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
REQUEST_LABELS = ("model_name", "engine_type")


class ServerMetrics:
    def __init__(self, model_name: str, max_total_num_tokens: int, page_size: int, context_len: int):
        self.registry = CollectorRegistry()
        self._labels = {
            "model_name": model_name, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
            "moe_ep_rank": "0",
        }  # fmt: skip
        self._req_labels = {"model_name": model_name, "engine_type": "unified"}
        self._add_scheduler_series(max_total_num_tokens, page_size, context_len)
        self._add_request_series()
        self._touch_series()
        self._last_retracted = 0  # the most recent retraction's count, until the next report
        self._arrivals: dict[str, float] = {}
        self._last_decode_report = time.time()

    def _add_scheduler_series(self, max_total_num_tokens: int, page_size: int, context_len: int) -> None:
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, SCHEDULER_LABELS, registry=r, multiprocess_mode="mostrecent")

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, SCHEDULER_LABELS + extra, registry=r)

        self.num_running_reqs = gauge("sglang:num_running_reqs", "The number of running requests.")
        self.num_queue_reqs = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.num_grammar_queue_reqs = gauge(
            "sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue."
        )
        self.gen_throughput = gauge("sglang:gen_throughput", "The generation throughput (token/s).")
        self.cache_hit_rate = gauge("sglang:cache_hit_rate", "The prefix cache hit rate.")
        self.token_usage = gauge("sglang:token_usage", "The token usage.")
        self.num_used_tokens = gauge("sglang:num_used_tokens", "The number of used tokens.")
        self.kv_available_tokens = gauge("sglang:kv_available_tokens", "Free KV slots.")
        self.kv_evictable_tokens = gauge("sglang:kv_evictable_tokens", "KV slots held by the cache only.")
        self.kv_used_tokens = gauge("sglang:kv_used_tokens", "KV slots in use by requests.")
        self.new_token_ratio = gauge(
            "sglang:new_token_ratio", "The new-token ratio the last prefill's admission used."
        )
        self.num_retracted_reqs = Gauge(
            "sglang:num_retracted_reqs",
            "The number of requests retracted by the most recent retraction (reset each report).",
            SCHEDULER_LABELS,
            registry=r,
        )
        self.num_paused_reqs = gauge("sglang:num_paused_reqs", "The number of paused requests.")
        self.retracted_total = counter("sglang:num_retracted_requests", "Total number of retracted requests.")
        self.retracted_input_total = counter(
            "sglang:num_retracted_input_tokens", "Total prompt tokens of retracted requests."
        )
        self.retracted_output_total = counter(
            "sglang:num_retracted_output_tokens", "Total output tokens of retracted requests."
        )
        self.realtime_tokens = counter(
            "sglang:realtime_tokens", "Tokens processed, by mode.", extra=("mode",)
        )
        self.queue_time = Histogram(
            "sglang:queue_time_seconds", "Time from arrival to the first prefill.", SCHEDULER_LABELS,
            buckets=QUEUE_TIME_BUCKETS, registry=r,
        )  # fmt: skip
        for name, value in (
            ("sglang:max_total_num_tokens", max_total_num_tokens),
            ("sglang:page_size", page_size),
            ("sglang:context_len", context_len),
            ("sglang:num_pages", max_total_num_tokens // page_size),
        ):
            gauge(name, name.split(":")[1].replace("_", " ")).labels(**self._labels).set(value)

    def _add_request_series(self) -> None:
        r = self.registry
        streaming = (*REQUEST_LABELS, "is_streaming")
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            streaming, buckets=TTFT_BUCKETS, registry=r,
        )  # fmt: skip
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            REQUEST_LABELS, buckets=ITL_BUCKETS, registry=r,
        )  # fmt: skip
        self.tpot = Histogram(
            "sglang:request_time_per_output_token_seconds", "Histogram of time per output token.",
            streaming, buckets=ITL_BUCKETS, registry=r,
        )  # fmt: skip
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds", "Histogram of end-to-end request latency in seconds.",
            streaming, buckets=E2E_BUCKETS, registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "sglang:prompt_tokens", "Number of prefill tokens processed.", streaming, registry=r
        )
        self.generation_tokens = Counter(
            "sglang:generation_tokens", "Number of generation tokens processed.", streaming, registry=r
        )
        self.num_requests = Counter(
            "sglang:num_requests", "Number of requests processed.", streaming, registry=r
        )
        self.cached_tokens = Counter(
            "sglang:cached_tokens", "Number of cached prompt tokens.", (*REQUEST_LABELS, "cache_source"),
            registry=r,
        )  # fmt: skip
        self.num_aborted = Counter(
            "sglang:num_aborted_requests", "Number of requests aborted.", REQUEST_LABELS, registry=r
        )
        self.num_so = Counter(
            "sglang:num_so_requests", "Number of structured-output requests.", REQUEST_LABELS, registry=r
        )
        self.prompt_tokens_hist = Histogram(
            "sglang:prompt_tokens_histogram", "Prompt tokens per request.", REQUEST_LABELS,
            buckets=TOKEN_COUNT_BUCKETS, registry=r,
        )  # fmt: skip
        self.uncached_prompt_tokens_hist = Histogram(
            "sglang:uncached_prompt_tokens_histogram", "Uncached prompt tokens per request.", REQUEST_LABELS,
            buckets=TOKEN_COUNT_BUCKETS, registry=r,
        )  # fmt: skip
        self.generation_tokens_hist = Histogram(
            "sglang:generation_tokens_histogram", "Generated tokens per request.", REQUEST_LABELS,
            buckets=TOKEN_COUNT_BUCKETS, registry=r,
        )  # fmt: skip

    def _touch_series(self) -> None:
        """Touch the labelled children so every series exists from the start (a dashboard sees zeros)."""
        for g in (self.num_running_reqs, self.num_queue_reqs, self.num_grammar_queue_reqs,
                  self.gen_throughput, self.cache_hit_rate, self.token_usage, self.num_used_tokens,
                  self.kv_available_tokens, self.kv_evictable_tokens, self.kv_used_tokens,
                  self.new_token_ratio, self.num_retracted_reqs, self.num_paused_reqs,
                  self.retracted_total, self.retracted_input_total, self.retracted_output_total,
                  self.queue_time):  # fmt: skip
            g.labels(**self._labels)
        for mode in ("prefill_compute", "prefill_cache", "decode"):
            self.realtime_tokens.labels(**self._labels, mode=mode)
        for s in ("true", "false"):
            for m in (self.prompt_tokens, self.generation_tokens, self.num_requests):
                m.labels(**self._req_labels, is_streaming=s)
        self.num_aborted.labels(**self._req_labels)

    # ----- scheduler side (engine thread) ---------------------------------------------------------
    def on_event(self, event: Event, now: float) -> None:
        labels = self._labels
        if isinstance(event, Retraction):
            if not event.rids:
                return
            self._last_retracted = len(event.rids)
            self.retracted_total.labels(**labels).inc(len(event.rids))
            self.retracted_input_total.labels(**labels).inc(event.input_tokens)
            self.retracted_output_total.labels(**labels).inc(event.output_tokens)
        elif isinstance(event, PrefillBatchStats):
            self.num_running_reqs.labels(**labels).set(event.running_req)
            self.num_queue_reqs.labels(**labels).set(event.queue_req)
            self.token_usage.labels(**labels).set(round(event.token_usage, 2))
            self.num_used_tokens.labels(**labels).set(event.num_used_tokens)
            self.new_token_ratio.labels(**labels).set(event.new_token_ratio)
            total = event.hit_tokens_for_rate + event.input_tokens_for_rate
            if total:
                self.cache_hit_rate.labels(**labels).set(event.hit_tokens_for_rate / total)
            self.realtime_tokens.labels(**labels, mode="prefill_compute").inc(event.new_token)
            self.realtime_tokens.labels(**labels, mode="prefill_cache").inc(event.cached_token)
            self._report_retracted()
        elif isinstance(event, DecodeBatchStats):
            self.num_running_reqs.labels(**labels).set(event.running_req)
            self.num_queue_reqs.labels(**labels).set(event.queue_req)
            self.token_usage.labels(**labels).set(round(event.token_usage, 2))
            self.num_used_tokens.labels(**labels).set(event.num_used_tokens)
            elapsed = now - self._last_decode_report
            self._last_decode_report = now
            if elapsed > 0:
                self.gen_throughput.labels(**labels).set(event.generated_tokens / elapsed)
            self._report_retracted()

    def _report_retracted(self) -> None:
        # SGLang copies the last retraction's count into the next report, then resets it: a scrape
        # sees it only until the following report. Use the _total counter for rates.
        self.num_retracted_reqs.labels(**self._labels).set(self._last_retracted)
        self._last_retracted = 0

    def set_pool(self, available: int, evictable: int, used: int) -> None:
        self.kv_available_tokens.labels(**self._labels).set(available)
        self.kv_evictable_tokens.labels(**self._labels).set(evictable)
        self.kv_used_tokens.labels(**self._labels).set(used)

    def publish_idle(self, queue: int) -> None:
        labels = self._labels
        self.num_running_reqs.labels(**labels).set(0)
        self.num_queue_reqs.labels(**labels).set(queue)
        self.gen_throughput.labels(**labels).set(0)

    def on_arrival(self, rid: str, t: float) -> None:
        self._arrivals[rid] = t

    def on_step(self, batch: ScheduledBatch, result: StepResult, now: float) -> None:
        if batch.kind == "decode":
            self.realtime_tokens.labels(**self._labels, mode="decode").inc(len(batch.reqs))
            return
        started = now - result.seconds
        for req in batch.reqs:
            arrived = self._arrivals.pop(req.rid, None)
            if arrived is not None:
                self.queue_time.labels(**self._labels).observe(max(0.0, started - arrived))

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
        s = {**self._req_labels, "is_streaming": "true" if streaming else "false"}
        self.prompt_tokens.labels(**s).inc(prompt_tokens)
        self.generation_tokens.labels(**s).inc(completion_tokens)
        self.num_requests.labels(**s).inc()
        if cached_tokens:
            self.cached_tokens.labels(**self._req_labels, cache_source="device").inc(cached_tokens)
        r = self._req_labels
        self.prompt_tokens_hist.labels(**r).observe(prompt_tokens)
        self.uncached_prompt_tokens_hist.labels(**r).observe(prompt_tokens - cached_tokens)
        self.generation_tokens_hist.labels(**r).observe(completion_tokens)
        if aborted:
            self.num_aborted.labels(**r).inc()
        if ttft is not None:
            self.ttft.labels(**s).observe(ttft)
            if completion_tokens > 1:
                self.tpot.labels(**s).observe((e2e - ttft) / (completion_tokens - 1))
        self.e2e.labels(**s).observe(e2e)
        itl = self.itl.labels(**r)
        for gap in itls:
            itl.observe(gap)

    def render(self) -> bytes:
        return generate_latest(self.registry)
