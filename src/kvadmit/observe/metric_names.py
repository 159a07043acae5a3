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
TOKEN_COUNT_BUCKETS = (
    100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12000, 15000,
    20000, 22000, 25000, 30000, 35000, 40000, 66000, 99000, 132000, 300000, 600000, 900000, 1100000,
)  # fmt: skip


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
KV_AVAILABLE_TOKENS = _gauge("sglang:kv_available_tokens", "Free KV slots.")
KV_EVICTABLE_TOKENS = _gauge("sglang:kv_evictable_tokens", "KV slots held by the cache only.")
KV_USED_TOKENS = _gauge("sglang:kv_used_tokens", "KV slots in use by requests.")
NEW_TOKEN_RATIO = _gauge("sglang:new_token_ratio", "The new-token ratio the last prefill's admission used.")
# A gauge holding the count of the most recent retraction, reset at the next report: a 0 says nothing
# about the run; the counter NUM_RETRACTED_REQUESTS does.
NUM_RETRACTED_REQS = _gauge(
    "sglang:num_retracted_reqs",
    "The number of requests retracted by the most recent retraction (reset each report).",
)
NUM_PAUSED_REQS = _gauge("sglang:num_paused_reqs", "The number of paused requests.")
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
# Set once at start-up; the help text is the name's words.
MAX_TOTAL_NUM_TOKENS = _gauge("sglang:max_total_num_tokens", "max total num tokens")
PAGE_SIZE = _gauge("sglang:page_size", "page size")
CONTEXT_LEN = _gauge("sglang:context_len", "context len")
NUM_PAGES = _gauge("sglang:num_pages", "num pages")

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
    "sglang:prompt_tokens_histogram", "histogram", "Prompt tokens per request.", REQUEST_LABELS,
    TOKEN_COUNT_BUCKETS,
)  # fmt: skip
UNCACHED_PROMPT_TOKENS_HISTOGRAM = Metric(
    "sglang:uncached_prompt_tokens_histogram", "histogram", "Uncached prompt tokens per request.",
    REQUEST_LABELS, TOKEN_COUNT_BUCKETS,
)  # fmt: skip
GENERATION_TOKENS_HISTOGRAM = Metric(
    "sglang:generation_tokens_histogram", "histogram", "Generated tokens per request.", REQUEST_LABELS,
    TOKEN_COUNT_BUCKETS,
)  # fmt: skip

SERVED = (
    NUM_RUNNING_REQS, NUM_QUEUE_REQS, NUM_GRAMMAR_QUEUE_REQS, GEN_THROUGHPUT, CACHE_HIT_RATE, TOKEN_USAGE,
    NUM_USED_TOKENS, KV_AVAILABLE_TOKENS, KV_EVICTABLE_TOKENS, KV_USED_TOKENS, NEW_TOKEN_RATIO,
    NUM_RETRACTED_REQS, NUM_PAUSED_REQS, NUM_RETRACTED_REQUESTS, NUM_RETRACTED_INPUT_TOKENS,
    NUM_RETRACTED_OUTPUT_TOKENS, REALTIME_TOKENS, QUEUE_TIME, MAX_TOTAL_NUM_TOKENS, PAGE_SIZE, CONTEXT_LEN,
    NUM_PAGES, TIME_TO_FIRST_TOKEN, INTER_TOKEN_LATENCY, TIME_PER_OUTPUT_TOKEN, E2E_REQUEST_LATENCY,
    PROMPT_TOKENS, GENERATION_TOKENS, NUM_REQUESTS, CACHED_TOKENS, NUM_ABORTED_REQUESTS, NUM_SO_REQUESTS,
    PROMPT_TOKENS_HISTOGRAM, UNCACHED_PROMPT_TOKENS_HISTOGRAM, GENERATION_TOKENS_HISTOGRAM,
)  # fmt: skip
"""Every series `kvadmit serve --enable-metrics` exports, in registration (and so exposition) order."""

# SGLang's, which kvadmit does not serve: hybrid (sliding-window) models' two pools.
FULL_TOKEN_USAGE = _gauge("sglang:full_token_usage", "The token usage of the full-attention pool.")
SWA_TOKEN_USAGE = _gauge("sglang:swa_token_usage", "The token usage of the sliding-window pool.")
