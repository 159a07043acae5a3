"""The fewest replicas that meet a TTFT / TPOT target at a given load, by simulation (the style of
sim/rate_search.py, over whole numbers).

The replica count doubles from 1 while it fails the target, up to `highest`; once a count meets it, the
integers between the last failing count and it are bisected. The answer is the smallest count seen to
meet the target, so the search never reports a count it did not simulate. It assumes that more replicas
never make the target harder to meet (true of the load-balancing policies for a fixed request stream, up
to the noise of random draws).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvadmit.fleet.driver import FleetSpec
from kvadmit.sim.rate_search import Target, judge
from kvadmit.sim.run import SimConfig


@dataclass(frozen=True, slots=True)
class ReplicaProbe:
    replicas: int
    meets: bool
    ttft_ms: float
    tpot_ms: float


@dataclass(frozen=True, slots=True)
class ReplicaSearch:
    fewest: int | None  # None: not even `highest` replicas meet the target
    probes: tuple[ReplicaProbe, ...] = field(default=())


def search_min_replicas(
    cfg: SimConfig, fleet: FleetSpec, target: Target, highest: int = 256
) -> ReplicaSearch:
    probes: list[ReplicaProbe] = []

    def test(n: int) -> bool:
        ok, ttft, tpot = judge(replace(fleet, replicas=n).simulate(cfg), target)
        probes.append(ReplicaProbe(n, ok, ttft, tpot))
        return ok

    bad, n = 0, 1  # bad: the largest count seen to fail (0: none yet)
    while not test(n):
        bad = n
        if n >= highest:
            return ReplicaSearch(None, tuple(probes))
        n = min(2 * n, highest)
    good = n
    while good - bad > 1:
        mid = (good + bad) // 2
        if test(mid):
            good = mid
        else:
            bad = mid
    return ReplicaSearch(good, tuple(probes))
