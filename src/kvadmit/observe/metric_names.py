"""SGLang's Prometheus metrics (reference section 5): names, kinds, help texts, labels and buckets, in the
order `kvadmit serve --enable-metrics` registers them (server/metrics.py), and the names the doctor reads
from a scrape (doctor/prom.py). A counter's samples carry the suffix _total (prometheus_client's rule):
`sample` is the name a scrape shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
REQUEST_LABELS = ("model_name", "engine_type")
STREAMING_LABELS = (*REQUEST_LABELS, "is_streaming")

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
# SGLang 0.5.22's default bounds for the prompt, uncached-prompt and generation token histograms (all three
# share one list unless --prompt-tokens-buckets / --generation-tokens-buckets say otherwise).
TOKEN_COUNT_BUCKETS = (
    100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12500, 15000,
    17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000, 200000, 300000, 400000,
    600000, 800000, 1000000, 1100000,
)  # fmt: skip
# The radix cache's eviction pass: 1 to 9 ms by the millisecond, then up to a 1 s ceiling.
EVICTION_DURATION_BUCKETS = (
    0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009, 0.01, 0.02, 0.03, 0.04, 0.05, 0.1, 0.2,
    0.5, 1.0,
)  # fmt: skip
# The radix cache's own collector: the cache class, not the model, names the series.
RADIX_CACHE_LABELS = ("cache_type", "tp_rank", "pp_rank", "dp_rank")
# The HTTP middleware's: the route's path (the raw path when no route matches) and the method.
HTTP_LABELS = ("endpoint", "method")


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    kind: Literal["gauge", "counter", "histogram"]
    help: str
    labels: tuple[str, ...] = SCHEDULER_LABELS
    buckets: tuple[float, ...] = ()

    @property
    def sample(self) -> str:
        """The name of its value in a scrape."""
        return f"{self.name}_total" if self.kind == "counter" else self.name


def _gauge(name: str, help: str) -> Metric:
    return Metric(name, "gauge", help)


# ----- scheduler side: one series per scheduler (SCHEDULER_LABELS) -----------------------------------
NUM_RUNNING_REQS = _gauge("sglang:num_running_reqs", "The number of running requests.")
NUM_QUEUE_REQS = _gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
NUM_GRAMMAR_QUEUE_REQS = _gauge(
    "sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue."
)
GEN_THROUGHPUT = _gauge("sglang:gen_throughput", "The generation throughput (token/s).")
CACHE_HIT_RATE = _gauge("sglang:cache_hit_rate", "The prefix cache hit rate.")
TOKEN_USAGE = _gauge("sglang:token_usage", "The token usage.")
NUM_USED_TOKENS = _gauge("sglang:num_used_tokens", "The number of used tokens.")
KV_AVAILABLE_TOKENS = _gauge("sglang:kv_available_tokens", "Number of free token slots in the KV cache pool.")
KV_EVICTABLE_TOKENS = _gauge(
    "sglang:kv_evictable_tokens", "Number of evictable (radix-cached) token slots in the KV cache pool."
)
KV_USED_TOKENS = _gauge("sglang:kv_used_tokens", "Number of actively used token slots in the KV cache pool.")
NEW_TOKEN_RATIO = _gauge("sglang:new_token_ratio", "The new-token ratio the last prefill's admission used.")
# SGLang registers these two gauges in prometheus_client's default multiprocess mode ("all"), so its
# scrape shows each with the scheduler process's `pid` as a last label.
PID_LABELS = (*SCHEDULER_LABELS, "pid")
# A gauge holding the count of the most recent retraction, reset at the next report: a 0 says nothing
# about the run; the counter NUM_RETRACTED_REQUESTS does.
NUM_RETRACTED_REQS = Metric(
    "sglang:num_retracted_reqs", "gauge", "The number of retracted requests.", PID_LABELS
)
# Requests paused by an asynchronous weight update; kvadmit has none, so it reports 0 like an idle SGLang.
NUM_PAUSED_REQS = Metric(
    "sglang:num_paused_reqs", "gauge", "The number of paused requests by async weight sync.", PID_LABELS
)
NUM_RETRACTED_REQUESTS = Metric(
    "sglang:num_retracted_requests", "counter", "Total number of retracted requests."
)
NUM_RETRACTED_INPUT_TOKENS = Metric(
    "sglang:num_retracted_input_tokens", "counter", "Total prompt tokens of retracted requests."
)
NUM_RETRACTED_OUTPUT_TOKENS = Metric(
    "sglang:num_retracted_output_tokens", "counter", "Total output tokens of retracted requests."
)
REALTIME_TOKENS = Metric(
    "sglang:realtime_tokens", "counter", "Tokens processed, by mode.", (*SCHEDULER_LABELS, "mode")
)
QUEUE_TIME = Metric(
    "sglang:queue_time_seconds", "histogram", "Time from arrival to the first prefill.",
    buckets=QUEUE_TIME_BUCKETS,
)  # fmt: skip
DECODE_SUM_SEQ_LENS = _gauge("sglang:decode_sum_seq_lens", "The sum of all sequence lengths in decode.")
# Per-pool usage: kvadmit has one full-attention pool, so the sliding-window and Mamba gauges stay at the
# 0 SGLang reports for a model without those pools.
FULL_TOKEN_USAGE = _gauge("sglang:full_token_usage", "The token usage for full attention layers.")
SWA_TOKEN_USAGE = _gauge("sglang:swa_token_usage", "The token usage for SWA layers.")
MAMBA_USAGE = _gauge("sglang:mamba_usage", "The token usage for Mamba layers.")
SWA_AVAILABLE_TOKENS = _gauge(
    "sglang:swa_available_tokens", "Number of free token slots in the SWA pool (hybrid-SWA only)."
)
SWA_EVICTABLE_TOKENS = _gauge(
    "sglang:swa_evictable_tokens", "Number of evictable (radix-cached) token slots in the SWA pool."
)
SWA_USED_TOKENS = _gauge("sglang:swa_used_tokens", "Number of actively used token slots in the SWA pool.")
MAMBA_AVAILABLE_TOKENS = _gauge(
    "sglang:mamba_available_tokens", "Number of free state slots in the mamba SSM pool (hybrid-SSM only)."
)
MAMBA_EVICTABLE_TOKENS = _gauge(
    "sglang:mamba_evictable_tokens", "Number of evictable (radix-cached) state slots in the mamba SSM pool."
)
MAMBA_USED_TOKENS = _gauge(
    "sglang:mamba_used_tokens", "Number of actively used state slots in the mamba SSM pool."
)
# SGLang computes it from max_running_requests_under_SLO, which 0.5.22 never sets: it stays at 0.
UTILIZATION = _gauge("sglang:utilization", "The utilization.")
PREFILL_EFFECTIVE_TOKENS = Metric(
    "sglang:prefill_effective_tokens", "counter",
    "Effective prefill tokens with retracted-request re-counts excluded, updated on each log interval. "
    "mode: device_hit, host_hit, storage_hit, input. Windowed prefix cache hit rate = rate(sum of *_hit) / "
    "rate(sum of all modes); per-tier rate uses a single *_hit mode in the numerator.",
    (*SCHEDULER_LABELS, "mode"),
)  # fmt: skip
FORWARD_EXECUTION_SECONDS = Metric(
    "sglang:forward_execution_seconds", "counter",
    "Total time that GPU is busy executing model forward passes. Refer to ForwardMode for category labels.",
    (*SCHEDULER_LABELS, "category"),
)  # fmt: skip
# Set once at start-up; the help text is the name's words.
MAX_TOTAL_NUM_TOKENS = _gauge("sglang:max_total_num_tokens", "max total num tokens")
PAGE_SIZE = _gauge("sglang:page_size", "page size")
CONTEXT_LEN = _gauge("sglang:context_len", "context len")
NUM_PAGES = _gauge("sglang:num_pages", "num pages")
WEIGHT_MEMORY_USAGE_GB = _gauge("sglang:weight_memory_usage_gb", "Memory used by model weights in GB.")
KV_CACHE_MEMORY_USAGE_GB = _gauge(
    "sglang:kv_cache_memory_usage_gb", "Memory used by the KV cache pools in GB."
)
# One series per captured device-graph phase; kvadmit captures none, so (as SGLang without graphs) none.
GRAPH_MEMORY_USAGE_GB = Metric(
    "sglang:graph_memory_usage_gb", "gauge", "Memory used by captured device graphs in GB.",
    (*SCHEDULER_LABELS, "phase"),
)  # fmt: skip
STARTUP_AVAILABLE_GPU_MEMORY_GB = _gauge(
    "sglang:startup_available_gpu_memory_gb", "Available GPU memory in GB at startup."
)

# ----- the radix cache's evictions (RADIX_CACHE_LABELS): series appear at the first eviction ----------
EVICTION_DURATION = Metric(
    "sglang:eviction_duration_seconds", "histogram",
    "End-to-end time of a device eviction pass in seconds; under --hicache-write-policy write_back this "
    "includes the blocking D->H backup (see sglang:hicache_backup_duration_seconds for the copy alone).",
    RADIX_CACHE_LABELS, EVICTION_DURATION_BUCKETS,
)  # fmt: skip
EVICTED_TOKENS = Metric(
    "sglang:evicted_tokens", "counter",
    "The number of device KV token slots freed by eviction, regardless of whether the data was backed up "
    "to host (see sglang:hicache_backup_tokens_total) or destroyed "
    "(see sglang:hicache_dropped_tokens_total).",
    RADIX_CACHE_LABELS,
)  # fmt: skip

# ----- the HTTP middleware (HTTP_LABELS) ------------------------------------------------------------------
HTTP_REQUESTS = Metric(
    "sglang:http_requests", "counter", "Total number of HTTP requests by endpoint and method", HTTP_LABELS
)
HTTP_RESPONSES = Metric(
    "sglang:http_responses", "counter", "Total number of HTTP responses by endpoint and status code",
    ("endpoint", "status_code", "method"),
)  # fmt: skip
HTTP_REQUESTS_ACTIVE = Metric(
    "sglang:http_requests_active", "gauge", "Number of currently active HTTP requests", HTTP_LABELS
)

# ----- request side: per model, some split by streaming -----------------------------------------------
TIME_TO_FIRST_TOKEN = Metric(
    "sglang:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.",
    STREAMING_LABELS, TTFT_BUCKETS,
)  # fmt: skip
INTER_TOKEN_LATENCY = Metric(
    "sglang:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.",
    REQUEST_LABELS, ITL_BUCKETS,
)  # fmt: skip
TIME_PER_OUTPUT_TOKEN = Metric(
    "sglang:request_time_per_output_token_seconds", "histogram", "Histogram of time per output token.",
    STREAMING_LABELS, ITL_BUCKETS,
)  # fmt: skip
E2E_REQUEST_LATENCY = Metric(
    "sglang:e2e_request_latency_seconds", "histogram", "Histogram of end-to-end request latency in seconds.",
    STREAMING_LABELS, E2E_BUCKETS,
)  # fmt: skip
PROMPT_TOKENS = Metric(
    "sglang:prompt_tokens", "counter", "Number of prefill tokens processed.", STREAMING_LABELS
)
GENERATION_TOKENS = Metric(
    "sglang:generation_tokens", "counter", "Number of generation tokens processed.", STREAMING_LABELS
)
NUM_REQUESTS = Metric("sglang:num_requests", "counter", "Number of requests processed.", STREAMING_LABELS)
CACHED_TOKENS = Metric(
    "sglang:cached_tokens", "counter", "Number of cached prompt tokens.", (*REQUEST_LABELS, "cache_source")
)
NUM_ABORTED_REQUESTS = Metric(
    "sglang:num_aborted_requests", "counter", "Number of requests aborted.", REQUEST_LABELS
)
NUM_SO_REQUESTS = Metric(
    "sglang:num_so_requests", "counter", "Number of structured-output requests.", REQUEST_LABELS
)
PROMPT_TOKENS_HISTOGRAM = Metric(
    "sglang:prompt_tokens_histogram", "histogram", "Histogram of prompt token length.", REQUEST_LABELS,
    TOKEN_COUNT_BUCKETS,
)  # fmt: skip
UNCACHED_PROMPT_TOKENS_HISTOGRAM = Metric(
    "sglang:uncached_prompt_tokens_histogram", "histogram",
    "Histogram of uncached (compute) prompt token length.", REQUEST_LABELS, TOKEN_COUNT_BUCKETS,
)  # fmt: skip
GENERATION_TOKENS_HISTOGRAM = Metric(
    "sglang:generation_tokens_histogram", "histogram", "Histogram of generation token length.",
    REQUEST_LABELS, TOKEN_COUNT_BUCKETS,
)  # fmt: skip

SERVED = (
    NUM_RUNNING_REQS, NUM_QUEUE_REQS, NUM_GRAMMAR_QUEUE_REQS, GEN_THROUGHPUT, CACHE_HIT_RATE, TOKEN_USAGE,
    NUM_USED_TOKENS, KV_AVAILABLE_TOKENS, KV_EVICTABLE_TOKENS, KV_USED_TOKENS, NEW_TOKEN_RATIO,
    NUM_RETRACTED_REQS, NUM_PAUSED_REQS, NUM_RETRACTED_REQUESTS, NUM_RETRACTED_INPUT_TOKENS,
    NUM_RETRACTED_OUTPUT_TOKENS, REALTIME_TOKENS, QUEUE_TIME, MAX_TOTAL_NUM_TOKENS, PAGE_SIZE, CONTEXT_LEN,
    NUM_PAGES, TIME_TO_FIRST_TOKEN, INTER_TOKEN_LATENCY, TIME_PER_OUTPUT_TOKEN, E2E_REQUEST_LATENCY,
    PROMPT_TOKENS, GENERATION_TOKENS, NUM_REQUESTS, CACHED_TOKENS, NUM_ABORTED_REQUESTS, NUM_SO_REQUESTS,
    PROMPT_TOKENS_HISTOGRAM, UNCACHED_PROMPT_TOKENS_HISTOGRAM, GENERATION_TOKENS_HISTOGRAM,
    DECODE_SUM_SEQ_LENS, FULL_TOKEN_USAGE, SWA_TOKEN_USAGE, MAMBA_USAGE, SWA_AVAILABLE_TOKENS,
    SWA_EVICTABLE_TOKENS, SWA_USED_TOKENS, MAMBA_AVAILABLE_TOKENS, MAMBA_EVICTABLE_TOKENS, MAMBA_USED_TOKENS,
    UTILIZATION, PREFILL_EFFECTIVE_TOKENS, FORWARD_EXECUTION_SECONDS, WEIGHT_MEMORY_USAGE_GB,
    KV_CACHE_MEMORY_USAGE_GB, GRAPH_MEMORY_USAGE_GB, STARTUP_AVAILABLE_GPU_MEMORY_GB, EVICTION_DURATION,
    EVICTED_TOKENS, HTTP_REQUESTS, HTTP_RESPONSES, HTTP_REQUESTS_ACTIVE,
)  # fmt: skip
"""Every series `kvadmit serve --enable-metrics` exports, in registration (and so exposition) order."""
