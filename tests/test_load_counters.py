"""/v1/loads' gen_throughput and cache_hit_rate as SGLang 0.5.22 fills them (its scheduler's metric stats:
updated only under --enable-metrics; the throughput 0 once its decode window is 30 s old, and zeroed by the
idle pass under the conditions of 0.5.22's _maybe_log_idle_metrics).
smg's power_of_two divides each worker's queued work by this throughput, so a stale value steers it.
Expected values by hand."""

from __future__ import annotations

from kvadmit.config import ServerArgs
from kvadmit.observe.load_snapshot import LoadCounters, load_snapshot
from kvadmit.request import Req, SamplingLimits
from kvadmit.scheduler.events import DecodeBatchStats, PrefillBatchStats
from kvadmit.scheduler.scheduler import Scheduler

START = 1000.0


def _decode(generated: int) -> DecodeBatchStats:
    return DecodeBatchStats(running_req=4, num_used_tokens=100, token_usage=0.1, queue_req=0,
                            generated_tokens=generated)  # fmt: skip


def _prefill(hit: int, computed: int) -> PrefillBatchStats:
    return PrefillBatchStats(new_seq=1, new_token=computed, cached_token=hit, num_used_tokens=100,
                             token_usage=0.1, running_req=0, queue_req=0, pending_token=0,
                             new_token_ratio=0.7, hit_tokens_for_rate=hit,
                             input_tokens_for_rate=computed)  # fmt: skip


def test_with_metrics_the_throughput_is_the_last_decode_window_and_goes_stale_after_30_s() -> None:
    c = LoadCounters(metrics_on=True, started=START)
    c.on_event(_decode(400), START + 2.0)  # the first window counts from the start: 400 / 2 s
    assert c.gen_throughput == c.last_gen_throughput == 200.0
    c.on_event(_decode(300), START + 3.0)  # 300 tokens in the 1 s since
    assert c.gen_throughput == 300.0
    c.on_event(_prefill(hit=30, computed=70), START + 20.0)  # 17 s after the window: still reported
    assert (c.gen_throughput, c.cache_hit_rate) == (300.0, 0.3)
    c.on_event(_prefill(hit=0, computed=0), START + 33.5)  # 30.5 s after it: stale
    assert (c.gen_throughput, c.last_gen_throughput, c.cache_hit_rate) == (0.0, 0.0, 0.0)


def test_without_metrics_the_snapshot_has_no_throughput_or_hit_rate() -> None:
    c = LoadCounters(metrics_on=False, started=START)
    c.on_event(_decode(400), START + 2.0)
    c.on_event(_prefill(hit=50, computed=50), START + 2.5)
    assert (c.gen_throughput, c.cache_hit_rate, c.recent_hit_rate(0.0)) == (0.0, 0.0, 0.0)
    assert c.last_gen_throughput == 200.0  # /server_info's last_gen_throughput has it either way


def test_an_idle_scheduler_reports_no_throughput_and_a_busy_one_its_window() -> None:
    sched = Scheduler(ServerArgs(max_total_tokens=1000))
    c = LoadCounters(metrics_on=True, started=START)
    c.on_event(_decode(400), START + 2.0)
    sched.add_request(Req("w", list(range(1, 11)), SamplingLimits(requested_max_new_tokens=5)))
    assert load_snapshot(sched, c)["gen_throughput"] == 200.0  # a request waits: not idle
    idle = Scheduler(ServerArgs(max_total_tokens=1000))
    assert load_snapshot(idle, c)["gen_throughput"] == 0.0
    c.on_event(_prefill(hit=0, computed=10), START + 5.0)  # work again: the window is back
    assert c.gen_throughput == 200.0


def test_the_idle_pass_zeroes_the_throughput_only_when_the_gauge_shows_requests_or_30_s_passed() -> None:
    # 0.5.22's _maybe_log_idle_metrics: publish (throughput 0, gauge 0) if the running gauge differs from
    # the empty batch or the stats were last logged over 30 s ago; otherwise the last value stands.
    idle = Scheduler(ServerArgs(max_total_tokens=1000))
    c = LoadCounters(metrics_on=True, started=START)
    c.on_event(_decode(400), START + 2.0)  # gauge 4 (the decode batch), throughput 400 / 2 s = 200
    assert load_snapshot(idle, c, now=START + 2.1)["gen_throughput"] == 0.0  # the gauge showed 4: zeroed
    c.on_event(_prefill(hit=0, computed=10), START + 3.0)  # joins an empty batch: gauge 0, window back
    assert c.gen_throughput == 200.0
    # idle again with no decode report since: the gauge already reads 0 and the stats were logged 7 s ago
    assert load_snapshot(idle, c, now=START + 10.0)["gen_throughput"] == 200.0
    assert load_snapshot(idle, c, now=START + 33.0)["gen_throughput"] == 200.0  # 30 s since: not over
    assert load_snapshot(idle, c, now=START + 33.5)["gen_throughput"] == 0.0  # 30.5 s: published, 0
    # the idle pass leaves the window itself alone, and the next decode window spans the idle time:
    # 1,000 tokens over the 40 s since the report at START + 2
    assert c.last_gen_throughput == 200.0
    c.on_event(_decode(1000), START + 42.0)
    assert c.gen_throughput == 25.0


def test_without_metrics_the_idle_pass_changes_nothing() -> None:
    idle = Scheduler(ServerArgs(max_total_tokens=1000))
    c = LoadCounters(metrics_on=False, started=START)
    c.on_event(_decode(400), START + 2.0)
    assert load_snapshot(idle, c, now=START + 2.1)["gen_throughput"] == 0.0
    assert c.last_gen_throughput == 200.0
