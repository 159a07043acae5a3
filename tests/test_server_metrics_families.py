"""/metrics carries SGLang 0.5.22's scheduling and memory families with its names, types, labels and bucket
bounds (written here from 0.5.22's metrics collector), and their values move by what a known load implies.
Scrapes are read with prometheus_client's parser (a counter's family drops the _total suffix)."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvadmit.memory.pool import TokenPool
from kvadmit.memory.radix import RadixCache
from kvadmit.scheduler.events import PrefillBatchStats, Retraction
from kvadmit.server.metrics import ServerMetrics
from server_helpers import RunningServer, running_server, wait_idle, write_cost_model, write_tiny_model

SCHED = {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}
REQ = {"model_name", "engine_type"}
RADIX = {"cache_type", "tp_rank", "pp_rank", "dp_rank"}

# name → (type, label names of every sample); label names None: no sample on a fresh server.
FRESH_FAMILIES: dict[str, tuple[str, set[str] | None]] = {
    "sglang:utilization": ("gauge", SCHED),
    "sglang:num_paused_reqs": ("gauge", SCHED | {"pid"}),
    "sglang:num_retracted_reqs": ("gauge", SCHED | {"pid"}),
    "sglang:decode_sum_seq_lens": ("gauge", SCHED),
    "sglang:prefill_effective_tokens": ("counter", SCHED | {"mode"}),
    "sglang:forward_execution_seconds": ("counter", None),
    "sglang:token_usage": ("gauge", SCHED),
    "sglang:full_token_usage": ("gauge", SCHED),
    "sglang:swa_token_usage": ("gauge", SCHED),
    "sglang:mamba_usage": ("gauge", SCHED),
    "sglang:num_used_tokens": ("gauge", SCHED),
    "sglang:kv_available_tokens": ("gauge", SCHED),
    "sglang:kv_evictable_tokens": ("gauge", SCHED),
    "sglang:kv_used_tokens": ("gauge", SCHED),
    "sglang:swa_available_tokens": ("gauge", SCHED),
    "sglang:swa_evictable_tokens": ("gauge", SCHED),
    "sglang:swa_used_tokens": ("gauge", SCHED),
    "sglang:mamba_available_tokens": ("gauge", SCHED),
    "sglang:mamba_evictable_tokens": ("gauge", SCHED),
    "sglang:mamba_used_tokens": ("gauge", SCHED),
    "sglang:max_total_num_tokens": ("gauge", SCHED),
    "sglang:weight_memory_usage_gb": ("gauge", SCHED),
    "sglang:kv_cache_memory_usage_gb": ("gauge", SCHED),
    "sglang:graph_memory_usage_gb": ("gauge", None),
    "sglang:startup_available_gpu_memory_gb": ("gauge", SCHED),
    "sglang:eviction_duration_seconds": ("histogram", None),
    "sglang:evicted_tokens": ("counter", None),
    "sglang:http_requests": ("counter", {"endpoint", "method"}),
    "sglang:http_requests_active": ("gauge", {"endpoint", "method"}),
    "sglang:prompt_tokens_histogram": ("histogram", None),
    "sglang:uncached_prompt_tokens_histogram": ("histogram", None),
    "sglang:generation_tokens_histogram": ("histogram", None),
}

# 0.5.22's default_bucket_prompt_tokens, shared by the three token-count histograms.
TOKEN_BUCKETS = [
    100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12500, 15000,
    17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000, 200000, 300000, 400000,
    600000, 800000, 1000000, 1100000,
]  # fmt: skip
EVICTION_BUCKETS = [
    0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009, 0.01, 0.02, 0.03, 0.04, 0.05, 0.1, 0.2,
    0.5, 1.0,
]  # fmt: skip


def scrape(srv: RunningServer) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(httpx.get(f"{srv.url}/metrics").text)}


def value(families: dict[str, object], name: str, sample: str | None = None, **labels: str) -> float:
    """The one sample of `name` (or its `sample` series) whose labels include `labels`."""
    found = [
        s.value
        for s in families[name].samples  # type: ignore[attr-defined]
        if s.name == (sample or name) and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (name, sample, labels, found)
    return found[0]


def bounds(families: dict[str, object], name: str) -> list[float]:
    return [
        float(s.labels["le"])
        for s in families[name].samples  # type: ignore[attr-defined]
        if s.name == f"{name}_bucket"
    ]


def complete(srv: RunningServer, prompt: str, max_tokens: int = 5) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    r = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture()
def sim(tmp_path: Path) -> Iterator[RunningServer]:
    # prefill: 1e6 tokens/s, so 40 tokens take 40 µs; decode: 2 ms a step
    cost = write_cost_model(tmp_path / "cost.json", decode_ms=2.0, tokens_per_s=1e6)
    with running_server(["--simulate", cost, "--enable-metrics", "--max-total-tokens", "200"]) as srv:
        yield srv


def test_a_fresh_server_has_each_family_with_its_type_and_labels(sim: RunningServer) -> None:
    families = scrape(sim)
    for name, (kind, labels) in FRESH_FAMILIES.items():
        assert name in families, name
        family = families[name]
        assert family.type == kind, name  # type: ignore[attr-defined]
        if labels is not None:
            assert family.samples, name  # type: ignore[attr-defined]
            for s in family.samples:  # type: ignore[attr-defined]
                assert set(s.labels) == labels, (name, s.labels)
    pid = str(os.getpid())  # the test server runs in this process
    assert value(families, "sglang:num_retracted_reqs", pid=pid) == 0
    assert value(families, "sglang:num_paused_reqs", pid=pid) == 0
    modes = {s.labels["mode"]: s.value for s in families["sglang:prefill_effective_tokens"].samples}  # type: ignore[attr-defined]
    assert modes == {"input": 0, "device_hit": 0, "host_hit": 0, "storage_hit": 0}
    # the empty pool of 200 slots; a simulated GPU holds no weights, no KV bytes, and reports no memory
    assert value(families, "sglang:kv_available_tokens") == 200
    assert value(families, "sglang:kv_used_tokens") == 0
    assert value(families, "sglang:weight_memory_usage_gb") == 0
    assert value(families, "sglang:kv_cache_memory_usage_gb") == 0
    assert value(families, "sglang:utilization") == 0
    # the middleware counts the scrape itself before it is answered
    assert value(families, "sglang:http_requests", "sglang:http_requests_total", endpoint="/metrics") == 1
    assert value(families, "sglang:http_requests_active", endpoint="/metrics", method="GET") == 1
    again = scrape(sim)
    assert value(again, "sglang:http_requests", "sglang:http_requests_total", endpoint="/metrics") == 2
    assert value(again, "sglang:http_responses", "sglang:http_responses_total", status_code="200") == 1


def test_a_known_load_moves_the_counters_by_what_it_implies(sim: RunningServer) -> None:
    # Three prompts of 40 one-byte tokens with different first bytes (no shared prefix), five tokens each.
    for ch in "abc":
        usage = complete(sim, ch * 40)["usage"]
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == (40, 5)
    wait_idle(sim)
    f = scrape(sim)
    prompt = sum(value(f, "sglang:prompt_tokens", "sglang:prompt_tokens_total", is_streaming=s)
                 for s in ("true", "false"))  # fmt: skip
    assert prompt == 120
    effective = "sglang:prefill_effective_tokens_total"
    assert value(f, "sglang:prefill_effective_tokens", effective, mode="input") == 120
    assert value(f, "sglang:prefill_effective_tokens", effective, mode="device_hit") == 0
    assert value(f, "sglang:cache_hit_rate") == 0
    seconds = "sglang:forward_execution_seconds_total"
    # three prefills of 40 µs; each request's other four tokens take one 2 ms decode step each
    assert value(f, "sglang:forward_execution_seconds", seconds, category="extend") == pytest.approx(120e-6)
    assert value(f, "sglang:forward_execution_seconds", seconds, category="decode") == pytest.approx(
        12 * 2e-3
    )
    for name in ("sglang:prompt_tokens_histogram", "sglang:uncached_prompt_tokens_histogram",
                 "sglang:generation_tokens_histogram"):  # fmt: skip
        assert bounds(f, name) == [*TOKEN_BUCKETS, float("inf")], name
    # Each finished request left 44 slots in the cache (40 prompt + 4 outputs with KV; the last sampled
    # token has none): 132 of 200 cached, 68 free.
    assert value(f, "sglang:kv_evictable_tokens") == 132
    assert value(f, "sglang:kv_available_tokens") == 68
    assert value(f, "sglang:kv_used_tokens") == 0
    assert "sglang:evicted_tokens_total" not in {s.name for s in f["sglang:evicted_tokens"].samples}  # type: ignore[attr-defined]
    # A fourth prompt leaves 176 cached, 24 free; a fifth needs 40 slots: the oldest leaf ("a", 44) goes.
    complete(sim, "d" * 40)
    complete(sim, "e" * 40)
    # "b"*40 again (still cached; "a" was the leaf evicted): 39 of its tokens come from the cache (one is
    # always computed), 39 hits of 40.
    complete(sim, "b" * 40)
    wait_idle(sim)
    f = scrape(sim)
    assert (
        value(f, "sglang:evicted_tokens", "sglang:evicted_tokens_total", cache_type="UnifiedRadixCache") == 44
    )
    assert value(f, "sglang:eviction_duration_seconds", "sglang:eviction_duration_seconds_count") == 1
    assert bounds(f, "sglang:eviction_duration_seconds") == [*EVICTION_BUCKETS, float("inf")]
    assert value(f, "sglang:prefill_effective_tokens", effective, mode="device_hit") == 39
    assert value(f, "sglang:prefill_effective_tokens", effective, mode="input") == 120 + 40 + 40 + 1
    assert value(f, "sglang:cache_hit_rate") == pytest.approx(39 / 40)
    posts = value(f, "sglang:http_responses", "sglang:http_responses_total", endpoint="/v1/completions",
                  method="POST", status_code="200")  # fmt: skip
    assert posts == 6


def test_a_model_server_reports_the_bytes_of_its_kv_pool(tmp_path: Path) -> None:
    folder = write_tiny_model(tmp_path / "tiny")
    argv = [
        "--model-path",
        str(folder),
        "--max-total-tokens",
        "2048",
        "--enable-metrics",
        "--dtype",
        "float32",
    ]
    with running_server(argv) as srv:
        f = scrape(srv)
    # 2 layers × K and V × 2 KV heads × 2048 slots × head_dim 16 (64 / 4 heads) × 4 bytes = 2^20 bytes
    assert value(f, "sglang:kv_cache_memory_usage_gb") == 2**20 / 2**30
    assert 0 < value(f, "sglang:weight_memory_usage_gb") < 0.01  # a model of a few hundred kB


RETRACT = re.compile(r"KV cache pool is full\. Retract requests\. #retracted_reqs: (\d+)")


def test_retractions_on_a_small_pool_move_the_retraction_counters(tmp_path: Path) -> None:
    cost = write_cost_model(tmp_path / "cost.json", decode_ms=0.2)
    argv = ["--simulate", cost, "--max-total-tokens", "600", "--enable-metrics"]
    with running_server(argv) as srv:
        # 40-byte prompts asking for far more tokens than most use: admission grows bold, decode retracts
        bodies = [{"prompt": f"{i:04d}" * 10, "max_tokens": 400, "seed": i} for i in range(60)]

        async def run() -> None:
            async with httpx.AsyncClient(base_url=srv.url, timeout=300) as client:
                answers = await asyncio.gather(*(client.post("/v1/completions", json=b) for b in bodies))
            assert all(a.status_code == 200 for a in answers)

        asyncio.run(run())
        wait_idle(srv)
        f = scrape(srv)
    retracted = sum(int(m.group(1)) for ln in srv.log_lines if (m := RETRACT.search(ln)))
    assert retracted > 0, "no retraction happened"
    name = "sglang:num_retracted_requests"
    assert value(f, name, f"{name}_total") == retracted
    name = "sglang:num_retracted_input_tokens"
    assert value(f, name, f"{name}_total") == 40 * retracted  # every prompt is 40 tokens
    name = "sglang:num_retracted_output_tokens"
    assert value(f, name, f"{name}_total") > 0
    assert {s.labels["pid"] for s in f["sglang:num_retracted_reqs"].samples} == {str(os.getpid())}  # type: ignore[attr-defined]


def _prefill(hit: int, computed: int, reprocessed: int = 0) -> PrefillBatchStats:
    return PrefillBatchStats(
        new_seq=1, new_token=computed, cached_token=hit, num_used_tokens=0, token_usage=0.0, running_req=0,
        queue_req=0, pending_token=0, new_token_ratio=0.7, hit_tokens_for_rate=hit,
        input_tokens_for_rate=computed, reprocessed_input_tokens=reprocessed,
    )  # fmt: skip


def _read(metrics: ServerMetrics) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}


def test_cache_hit_rate_resets_on_a_prefill_report_with_nothing_effective() -> None:
    metrics = ServerMetrics("m", 1000, 1, 4096)
    metrics.on_event(_prefill(hit=30, computed=10), 0.0)
    assert value(_read(metrics), "sglang:cache_hit_rate") == 0.75
    # Only a retracted request's recomputation: nothing counts, and the rate does not keep 0.75.
    metrics.on_event(_prefill(hit=0, computed=20, reprocessed=20), 1.0)
    f = _read(metrics)
    assert value(f, "sglang:cache_hit_rate") == 0
    effective = "sglang:prefill_effective_tokens_total"
    assert value(f, "sglang:prefill_effective_tokens", effective, mode="input") == 10
    assert value(f, "sglang:prefill_effective_tokens", effective, mode="device_hit") == 30
    # realtime_tokens counts every computed token, recomputations included
    realtime = "sglang:realtime_tokens_total"
    assert value(f, "sglang:realtime_tokens", realtime, mode="prefill_compute") == 30


def test_the_retraction_gauge_holds_the_last_count_until_the_next_report() -> None:
    metrics = ServerMetrics("m", 1000, 1, 4096)
    metrics.on_event(Retraction(("a", "b"), 10, 0.7, 0.9, False, 80, 7), 0.0)
    metrics.on_event(_prefill(hit=0, computed=5), 0.1)
    f = _read(metrics)
    assert value(f, "sglang:num_retracted_reqs") == 2
    assert value(f, "sglang:num_retracted_input_tokens", "sglang:num_retracted_input_tokens_total") == 80
    assert value(f, "sglang:num_retracted_output_tokens", "sglang:num_retracted_output_tokens_total") == 7
    metrics.on_event(_prefill(hit=0, computed=5), 0.2)
    assert value(_read(metrics), "sglang:num_retracted_reqs") == 0


class _Recorder:
    def __init__(self) -> None:
        self.passes: list[int] = []
        self.now = 0.0

    def clock(self) -> float:
        self.now += 0.5
        return self.now

    def evicted(self, tokens: int, seconds: float) -> None:
        self.passes.append(tokens)
        assert seconds == 0.5


def test_the_cache_tells_its_observer_of_evictions_but_not_of_a_flush() -> None:
    pool = TokenPool(100)
    cache = RadixCache(pool)
    for first in (1, 2):
        cache.insert([first] * 10, pool.alloc_extend([], 10))
    observer = _Recorder()
    cache.eviction_observer = observer
    assert cache.evict(0) == 0 and cache.evict(5) == 10  # a whole leaf goes
    assert observer.passes == [10]
    cache.reset()  # flush_cache frees the other leaf: not an eviction
    assert observer.passes == [10] and pool.available_size() == 100


def test_decode_sum_seq_lens_is_the_last_decode_reports_kv_length(tmp_path: Path) -> None:
    cost = write_cost_model(tmp_path / "cost.json")
    argv = ["--simulate", cost, "--enable-metrics", "--decode-log-interval", "1"]
    with running_server(argv) as srv:
        complete(srv, "q" * 40)
        wait_idle(srv)
        f = scrape(srv)
    # The last decode step sampled the 5th token from the 4th: 40 prompt + 4 output tokens have KV.
    assert value(f, "sglang:decode_sum_seq_lens") == 44
