"""--admission-policy: SGLang's forecast, reserve-everything and optimistic (vLLM V1) on one scheduler.

Numbers come from the rules (scheduler/policy.py, docs/sglang-rules.md §1.4, §1.6, §3): a request of p prompt
tokens and m max_new_tokens is charged p + 1 + m under sglang and reserve-all, p + 1 under optimistic, and is
admitted while its own need is strictly below what is left of the pool.
"""

from __future__ import annotations

import pytest

from helpers import make_req, make_scheduler, step
from kvadmit.bench.workload import WorkloadSpec
from kvadmit.config import ConfigError, ServerArgs
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.scheduler.events import Retraction
from kvadmit.sim.run import SimConfig
from kvadmit.sim.sweep import SweepPoint, run_point


def queue(sched: object, prompts: list[int], max_new: int = 300, ignore_eos: bool = False) -> None:
    for i, p in enumerate(prompts):
        sched.add_request(make_req(f"r{i}", p, max_new, ignore_eos))  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("policy", "admitted"),
    [
        # 401 < 1000, 401 < 599, then 401 < 198 fails: two.
        ("sglang", 2),
        ("reserve-all", 2),
        # 101 < 1000 − 101 k holds for k = 0 … 8 (101 < 192) and fails at k = 9 (101 < 91): nine.
        ("optimistic", 9),
    ],
)
def test_the_first_pass_admits_by_each_policys_reservation(policy: str, admitted: int) -> None:
    sched = make_scheduler(max_total_tokens=1000, admission_policy=policy)
    queue(sched, [100] * 12)
    batch, _ = step(sched)
    assert [r.rid for r in batch.reqs] == [f"r{i}" for i in range(admitted)]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("policy", "admitted"), [("sglang", 2), ("optimistic", 9)])
def test_optimistic_skips_sglangs_ignore_eos_occupancy_check(policy: str, admitted: int) -> None:
    # --disable-radix-cache with ignore_eos: SGLang's future-occupancy walk stops the third request
    # (cur 1000 − 202 − 101 = 697 < 3 × 300); optimistic reserves no output and admits nine.
    sched = make_scheduler(max_total_tokens=1000, disable_radix_cache=True, admission_policy=policy)
    queue(sched, [100] * 12, ignore_eos=True)
    batch, _ = step(sched)
    assert len(batch.reqs) == admitted  # type: ignore[attr-defined]


def test_reserve_all_pins_the_ratio_at_one_and_reserves_every_remaining_token() -> None:
    sched = make_scheduler(max_total_tokens=5000, admission_policy="reserve-all")
    sched.add_request(make_req("a", 100, 5000 - 100 - 2))  # above the 4,096 clip: reserved in full
    sched.add_request(make_req("b", 100, 300))
    for _ in range(30):
        step(sched)
    assert sched.ratio.current == 1.0  # sglang would have decayed it 29 times
    remaining = sum(r.remaining_new_tokens for r in sched.running.reqs)
    assert remaining > 4096  # the clip would have cut a's part
    adder = sched._new_admission_pass()
    free = sched.pool.available_size() + sched.cache.evictable_size()
    assert adder.rem_total_tokens == free - remaining


def test_optimistic_preempts_the_newest_request_and_requeues_it_at_the_head() -> None:
    # r0 has the longest prompt (140): SGLang's own order (fewest outputs, then longest prompt) would
    # retract it; optimistic takes the most recently admitted, r8.
    # Admission: 141 + 8 × 101 = 949 charged, r9 (101 < 51) waits. Prefill leaves 1000 − 940 = 60 slots;
    # six decode steps take 54, the seventh needs 9 of the 6 left.
    sched = make_scheduler(max_total_tokens=1000, admission_policy="optimistic")
    queue(sched, [140] + [100] * 11)
    batch, _ = step(sched)
    assert len(batch.reqs) == 9  # type: ignore[attr-defined]
    retractions: list[Retraction] = []
    for _ in range(7):
        step(sched)
        retractions += [e for e in sched.drain_events() if isinstance(e, Retraction)]
    assert [e.rids for e in retractions] == [("r8",)]
    assert [r.rid for r in sched.waiting] == ["r8", "r9", "r10", "r11"]
    assert [r.rid for r in sched.running.reqs] == [f"r{i}" for i in range(8)]


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ConfigError, match="--admission-policy 'greedy' is not supported"):
        ServerArgs(admission_policy="greedy")


def test_on_an_early_stop_workload_the_three_policies_make_the_missions_trade() -> None:
    # Clients ask for 1,024 tokens and stop uniformly within them (about 512 on average).
    def point(policy: str) -> object:
        cfg = SimConfig(
            args=ServerArgs(max_total_tokens=16384, admission_policy=policy),
            workload=WorkloadSpec(num_prompts=300, input_len=256, output_len=1024, range_ratio=1.0,
                                  ignore_eos=False),
            cost=CostModel.simple(decode_step_ms=20, prefill_tokens_per_s=10_000),
            max_concurrency=128,
        )  # fmt: skip
        return run_point(SweepPoint({"policy": policy}, cfg))

    reserve, forecast, optimistic = (point(p) for p in ("reserve-all", "sglang", "optimistic"))
    # Reserve-all leaves the pool emptiest and makes requests wait longest; nothing is retracted.
    assert reserve.kv_usage_mean < forecast.kv_usage_mean < optimistic.kv_usage_mean  # type: ignore[attr-defined]
    assert reserve.ttft_p50_ms > forecast.ttft_p50_ms > optimistic.ttft_p50_ms  # type: ignore[attr-defined]
    assert reserve.retractions == 0  # type: ignore[attr-defined]
    # Optimistic fills the pool and pays for it in preemptions.
    assert optimistic.retractions > forecast.retractions  # type: ignore[attr-defined]
    assert optimistic.kv_usage_mean > 0.8  # type: ignore[attr-defined]
