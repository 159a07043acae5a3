"""The fleet verdict's rules on hand-made replicas (doctor/fleet_rules.py), at their thresholds: counts at
most one apart are dealt in turn; "more than their share" is over 1.25× the calm replicas' mean and at
least 2 requests more; a shared prefix needs the pressed replicas' cache to supply ≥ 50% of their prompt
tokens and ≥ 25 points more than the calm ones'; without Prefill lines the split is not seen."""

from __future__ import annotations

import pytest

from kvadmit.doctor.fleet import LIGHT, QUEUEING, SILENT, ReplicaVerdict
from kvadmit.doctor.fleet_read import ReplicaNumbers
from kvadmit.doctor.fleet_rules import (
    FLEET_HEALTHY,
    FLEET_HELD_BACK,
    FLEET_IMBALANCE,
    FLEET_OTHER,
    FLEET_OVERLOADED,
    IN_TURN,
    REQUEST_SIZES,
    SHARED_PREFIX,
    SPLIT_UNSEEN,
    UNEVEN_DRAWS,
    cause_of,
    fleet_finding,
)
from kvadmit.doctor.model import IDLE_POOL, Diagnosis, Finding
from kvadmit.doctor.timeline import Timeline


def replica(name: str, state: str, requests: int, new: int = 100, cached: int = 0, prefill: bool = True,
            verdict: str = "healthy-queue", advice: str = "") -> ReplicaVerdict:  # fmt: skip
    lines = 0 if state == SILENT else 5
    n = ReplicaNumbers(admissions=requests, new_tokens=new, cached_tokens=cached, batch_lines=lines,
                       prefill_lines=int(prefill and lines > 0))  # fmt: skip
    d = Diagnosis([Finding(verdict, verdict, 8, "t", advice=[advice] if advice else [])], [], Timeline())
    return ReplicaVerdict(name, d, n, 0, 0, state)


def cause(pressed: list[int], calm: list[int], p_cached: tuple[int, int] = (100, 0),
          c_cached: tuple[int, int] = (100, 0)) -> str:  # fmt: skip
    p = [replica(f"P{i}", QUEUEING, k, *p_cached) for i, k in enumerate(pressed)]
    c = [replica(f"C{i}", LIGHT, k, *c_cached) for i, k in enumerate(calm)]
    return cause_of(p, c, p + c)


@pytest.mark.parametrize(
    ("pressed", "calm", "expected"),
    [
        ([11], [10], IN_TURN),  # one apart
        ([10], [11, 10], IN_TURN),
        ([12], [10], REQUEST_SIZES),  # 12 is not over 1.25 × 10 = 12.5
        ([13], [10], UNEVEN_DRAWS),  # 13 > 12.5 and 3 more
        ([25], [20], REQUEST_SIZES),  # 25 is not over 1.25 × 20 = 25
        ([26], [20], UNEVEN_DRAWS),
        ([4], [3, 2], REQUEST_SIZES),  # 4 > 1.25 × 2.5 but only 1.5 more
        ([5], [3], UNEVEN_DRAWS),  # 5 > 3.75 and 2 more
        ([3], [10, 10], REQUEST_SIZES),  # fewer requests, still pressed: bigger ones
    ],
)
def test_the_split_rules(pressed: list[int], calm: list[int], expected: str) -> None:
    assert cause(pressed, calm) == expected


def test_a_shared_prefix_needs_half_the_prompt_from_the_cache_and_25_points_over_the_calm() -> None:
    # pressed: 100 new + 100 cached = 0.5; calm: 300 new + 100 cached = 0.25; lead exactly 0.25
    assert cause([13], [10], (100, 100), (300, 100)) == SHARED_PREFIX
    assert cause([13], [10], (101, 100), (300, 100)) == UNEVEN_DRAWS  # 100/201 < 0.5
    assert cause([13], [10], (100, 100), (299, 100)) == UNEVEN_DRAWS  # lead 0.5 − 100/399 < 0.25
    assert cause([12], [10], (0, 100), (100, 0)) == REQUEST_SIZES  # all cached, but no more than its share


def test_without_prefill_lines_the_split_is_unseen() -> None:
    p = [replica("P", QUEUEING, 0, 0, 0, prefill=False)]
    c = [replica("C", LIGHT, 0, 0, 0, prefill=False)]
    assert cause_of(p, c, p + c) == SPLIT_UNSEEN


def test_the_fleet_verdicts() -> None:
    light = [replica("A", LIGHT, 10), replica("B", LIGHT, 10)]
    assert fleet_finding(light).verdict == FLEET_HEALTHY
    mixed = [replica("A", QUEUEING, 10), replica("B", LIGHT, 10)]
    f = fleet_finding(mixed)
    assert f.verdict == FLEET_IMBALANCE and f.numbers["pressed"] == ["A"] and f.numbers["cause"] == IN_TURN
    assert fleet_finding([replica("A", QUEUEING, 10), replica("B", QUEUEING, 9)]).verdict == FLEET_OVERLOADED
    silent = [replica("A", SILENT, 0), replica("B", SILENT, 0)]
    assert fleet_finding(silent).verdict == FLEET_OTHER
    # an idle replica beside a queueing one: "admitted nothing"
    f = fleet_finding([replica("A", QUEUEING, 20), replica("B", SILENT, 0)])
    assert f.title.startswith("Imbalance: A queues (peak queue 0) while B has no queue; B admitted nothing")


def test_an_uneven_split_is_pointed_out_even_when_healthy() -> None:
    even = fleet_finding([replica("A", LIGHT, 12), replica("B", LIGHT, 10)])  # 12 is not over 12.5
    uneven = fleet_finding([replica("A", LIGHT, 13), replica("B", LIGHT, 10)])
    assert not any("uneven" in line for line in even.explanation)
    assert any(line.startswith("The split is uneven") for line in uneven.explanation)


def test_every_replica_queueing_with_an_idle_pool_is_held_back_not_overloaded() -> None:
    cap = "Raise --max-running-requests (now 4) if the pool has room: usage stays low at the cap."
    idle = [replica(k, QUEUEING, 10, verdict=IDLE_POOL, advice=cap) for k in "AB"]
    f = fleet_finding(idle)
    assert f.verdict == FLEET_HELD_BACK
    assert f.advice[0] == "Every replica's verdict says: " + cap  # the replicas agree: their advice
    # replicas with different advice: pointed to, not quoted
    other = replica("B", QUEUEING, 10, verdict=IDLE_POOL, advice="Lower --schedule-conservativeness.")
    assert fleet_finding([idle[0], other]).advice[0] == "Act on each replica's verdict below first."
    # one replica pressed otherwise: the fleet is short of capacity
    mixed = [idle[0], replica("B", QUEUEING, 10, verdict="healthy-queue")]
    assert fleet_finding(mixed).verdict == FLEET_OVERLOADED
    # an idle-pool replica beside a calm one is still an imbalance
    assert fleet_finding([idle[0], replica("B", LIGHT, 10)]).verdict == FLEET_IMBALANCE
