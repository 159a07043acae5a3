"""The router in front of a fleet: a policy (policies.py), the router's in-flight counts, and its two
periodic jobs on the virtual clock, both from the router's start (time 0 of the run):

* the load poll (power_of_two): at 0, I, 2I, … (tokio's interval ticks at once), I = sglang-router 0.3.2's
  --worker-startup-check-interval (30 s; its load monitor is built with that interval), or smg 1.13.0's
  --load-monitor-interval (10 s) under `impl="smg"`, where the poll reads each worker's /v1/loads
  snapshot instead of /get_load's token count (smg_policy.py). A poll inside a
  replica's step reads it as it stands once that step's results are processed (the driver runs a step
  whole), as SGLang answers /get_load between iterations of its loop. `first_poll_s` (no flag; 0 by
  default) moves the series to P, P + I, …: a real router starts before the first request, at an
  arbitrary point of its interval, so a comparison with real runs tries P across [0, I).
* the tree's eviction (cache_aware): at E, 2E, … (the eviction thread sleeps first),
  E = --eviction-interval-secs (60; 0 turns it off), down to --max-tree-size characters per worker.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvadmit.fleet.policies import CacheAware, Policy, RouterView, make_policy
from kvadmit.fleet.smg_policy import SMG_LOAD_METRICS, LeastLoadTunables, SmgPowerOfTwo

INF = float("inf")
ROUTER_IMPLS = ("sglang-router", "smg")  # whose rules: sglang-router 0.3.2's, or smg 1.13.0's
SMG_POLICIES = ("random", "round_robin", "power_of_two")  # the ones modelled as smg 1.13.0 has them


@dataclass(frozen=True, slots=True)
class RouterSettings:
    policy: str = "cache_aware"  # sglang-router's --policy default
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    eviction_interval_secs: int = 60
    max_tree_size: int = 2**26
    poll_interval_secs: int = 30  # --worker-startup-check-interval
    first_poll_s: float = 0.0  # when the first load poll falls (the router's phase; no flag)
    seed: int = 0  # random and power_of_two draws
    impl: str = "sglang-router"  # whose rules (ROUTER_IMPLS)
    load_metric: str = "expected_wait"  # smg's --power-of-two-load-metric
    least_load: LeastLoadTunables = field(default_factory=LeastLoadTunables)  # smg's --least-load-* flags

    def check(self) -> None:
        """ValueError naming the first setting out of range."""
        if self.impl not in ROUTER_IMPLS:
            raise ValueError(f"unknown router {self.impl!r}; choose from {', '.join(ROUTER_IMPLS)}")
        if self.impl == "smg":
            self._check_smg()
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"--cache-threshold must be in [0, 1], got {self.cache_threshold:g}")
        if self.balance_abs_threshold < 0:
            raise ValueError(f"--balance-abs-threshold must be ≥ 0, got {self.balance_abs_threshold}")
        if not self.balance_rel_threshold >= 0:
            raise ValueError(f"--balance-rel-threshold must be ≥ 0, got {self.balance_rel_threshold:g}")
        if self.eviction_interval_secs < 0:
            raise ValueError(f"--eviction-interval-secs must be ≥ 0, got {self.eviction_interval_secs}")
        if self.max_tree_size < 0:
            raise ValueError(f"--max-tree-size must be ≥ 0, got {self.max_tree_size}")
        if not self.first_poll_s >= 0.0:
            raise ValueError(f"the first load poll must be at or after time 0, got {self.first_poll_s:g} s")
        if self.poll_interval_secs <= 0:
            flag = "--load-monitor-interval" if self.impl == "smg" else "--worker-startup-check-interval"
            raise ValueError(f"{flag} must be ≥ 1 (the load poll's period), got {self.poll_interval_secs}")

    def _check_smg(self) -> None:
        if self.policy not in SMG_POLICIES:
            raise ValueError(
                f"smg 1.13.0's {self.policy} is not modelled (its spill gate and scores differ from "
                f"sglang-router's); with smg choose from {', '.join(SMG_POLICIES)}"
            )
        if self.load_metric not in SMG_LOAD_METRICS:
            raise ValueError(
                f"--power-of-two-load-metric must be one of {', '.join(SMG_LOAD_METRICS)}, got "
                f"{self.load_metric!r}"
            )
        self.least_load.check()


class FleetRouter:
    def __init__(self, settings: RouterSettings, workers: int) -> None:
        self.settings = settings
        self.policy: Policy
        if settings.impl == "smg" and settings.policy == "power_of_two":
            rng = random.Random(settings.seed)
            self.policy = SmgPowerOfTwo(rng, settings.load_metric, settings.least_load)
        else:
            self.policy = make_policy(
                settings.policy, workers, settings.seed, settings.cache_threshold,
                settings.balance_abs_threshold, settings.balance_rel_threshold,
            )  # fmt: skip
        self.view = RouterView([0] * workers)
        self.next_poll = settings.first_poll_s if self.policy.polls_load else INF
        evicting = isinstance(self.policy, CacheAware) and settings.eviction_interval_secs > 0
        self.next_evict = float(settings.eviction_interval_secs) if evicting else INF

    @property
    def needs_text(self) -> bool:
        return self.policy.needs_text

    def route(self, text: str | None) -> int:
        k = self.policy.choose(self.view, text)
        if self.policy.counts_in_flight:
            self.view.in_flight[k] += 1
        return k

    def answered(self, k: int) -> None:
        if self.policy.counts_in_flight:
            self.view.in_flight[k] -= 1

    def next_periodic(self) -> float:
        return min(self.next_poll, self.next_evict)

    @property
    def reads_snapshot(self) -> bool:
        """Whether the poll reads each worker's /v1/loads snapshot (smg) rather than its token load."""
        return isinstance(self.policy, SmgPowerOfTwo)

    def run_periodic(
        self,
        loads: Callable[[], Sequence[int]],
        snapshots: Callable[[], Sequence[Mapping[str, Any]]] | None = None,
    ) -> None:
        """The periodic job due first (a poll before an eviction at the same time). A poll reads `loads`
        (/get_load's token counts), or `snapshots` (/v1/loads) where the policy is smg's."""
        if self.next_poll <= self.next_evict:
            if isinstance(self.policy, SmgPowerOfTwo):
                assert snapshots is not None, "smg's power_of_two polls /v1/loads snapshots"
                self.policy.update_loads(snapshots())
            else:
                self.view.polled = list(loads())
            self.next_poll += self.settings.poll_interval_secs
        else:
            policy = self.policy
            assert isinstance(policy, CacheAware)
            policy.tree.evict(self.settings.max_tree_size)
            self.next_evict += self.settings.eviction_interval_secs
