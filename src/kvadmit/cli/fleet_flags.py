"""The fleet flags of `simulate` and `sweep`: N replicas behind sglang-router 0.3.2 (`--replicas`,
`--router` and the router's own flags, with its names and defaults) or, with `--router-impl smg`, smg
1.13.0's power_of_two (its load flags, names and defaults), or SGLang's in-process data parallelism
(`--dp-size`, `--load-balance-method`, 0.5.22's choices)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from kvadmit.errors import UsageError
from kvadmit.fleet.router import ROUTER_IMPLS
from kvadmit.fleet.smg_policy import SMG_LOAD_METRICS

if TYPE_CHECKING:
    from kvadmit.fleet.driver import FleetSpec

ROUTER_POLICIES = ("random", "round_robin", "cache_aware", "power_of_two")
LOAD_BALANCE_METHODS = ("auto", "round_robin", "follow_bootstrap_room", "total_requests", "total_tokens")
UNMODELLED_METHODS = {
    "follow_bootstrap_room": "it routes by a PD-disaggregation bootstrap room, which a simulated request "
    "does not have",
    "total_requests": "it balances on load snapshots the schedulers publish through shared memory (re-read "
    "at most every 20 ms, with speculative increments in between), which kvadmit does not model",
    "total_tokens": "it balances on load snapshots the schedulers publish through shared memory (re-read "
    "at most every 20 ms, with speculative increments in between), which kvadmit does not model",
}


def add_fleet_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "fleet (N replicas behind sglang-router 0.3.2 or smg 1.13.0, or SGLang's --dp-size; "
        "docs/simulate.md, Fleets)"
    )
    g.add_argument("--replicas", type=int, default=None, metavar="N", help="simulate N replicas, each the "
                   "exact scheduler, behind the router (default: one server, no router)")  # fmt: skip
    g.add_argument("--router", choices=ROUTER_POLICIES, default=None, metavar="POLICY",
                   help="the router's --policy: random, round_robin, cache_aware (its default), "
                   "power_of_two")  # fmt: skip
    g.add_argument("--cache-threshold", type=float, default=0.3)
    g.add_argument("--balance-abs-threshold", type=int, default=64)
    g.add_argument("--balance-rel-threshold", type=float, default=1.5)
    g.add_argument("--eviction-interval-secs", type=int, default=60)
    g.add_argument("--max-tree-size", type=int, default=2**26)
    g.add_argument("--worker-startup-check-interval", type=int, default=30, help="seconds between the "
                   "router's polls of each worker's /get_load (0.3.2 polls at this interval)")  # fmt: skip
    g.add_argument("--router-seed", type=int, default=0, help="seed of random and power_of_two's draws")
    g.add_argument("--router-impl", choices=ROUTER_IMPLS, default="sglang-router", help="whose rules the "
                   "router follows: sglang-router 0.3.2 (default) or smg 1.13.0 (random, round_robin, "
                   "power_of_two; the flags below are smg's)")  # fmt: skip
    g.add_argument("--power-of-two-load-metric", choices=SMG_LOAD_METRICS, default=None, help="smg: what "
                   "power_of_two compares (default expected_wait)")  # fmt: skip
    g.add_argument("--load-monitor-interval", type=int, default=None, help="smg: seconds between its polls "
                   "of each worker's /v1/loads (default 10)")  # fmt: skip
    g.add_argument("--least-load-kv-pressure-weight", type=float, default=None, help="smg: (default 0.15)")
    g.add_argument("--least-load-default-throughput", type=float, default=None, help="smg: tokens/s for a "
                   "worker reporting no gen_throughput (default 2000)")  # fmt: skip
    g.add_argument("--least-load-mean-prefill-tokens", type=int, default=None, help="smg: tokens counted per "
                   "request it cannot measure (default 1024)")  # fmt: skip
    g.add_argument("--dp-size", type=int, default=1, help="SGLang's in-process data parallelism: N "
                   "schedulers behind its DP controller")  # fmt: skip
    g.add_argument(
        "--load-balance-method",
        choices=LOAD_BALANCE_METHODS,
        default="auto",
        help="the DP controller's dispatch (auto: round_robin, without PD disaggregation)",
    )


SMG_FLAGS = ("power_of_two_load_metric", "load_monitor_interval", "least_load_kv_pressure_weight",
             "least_load_default_throughput", "least_load_mean_prefill_tokens")  # fmt: skip


def smg_settings(ns: argparse.Namespace) -> dict[str, Any]:
    """RouterSettings' fields that depend on whose router it is (smg's flags, or sglang-router's poll)."""
    from kvadmit.fleet.smg_policy import LeastLoadTunables

    impl = getattr(ns, "router_impl", "sglang-router")
    if impl != "smg":
        given = [name for name in SMG_FLAGS if getattr(ns, name, None) is not None]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise UsageError(f"{flag} is smg's; add --router-impl smg (sglang-router 0.3.2 has no such flag)")
        return {"impl": impl, "poll_interval_secs": ns.worker_startup_check_interval}
    defaults = LeastLoadTunables()

    def pick(name: str, default: Any) -> Any:
        value = getattr(ns, name, None)
        return default if value is None else value

    tunables = LeastLoadTunables(
        pick("least_load_kv_pressure_weight", defaults.kv_pressure_weight),
        pick("least_load_default_throughput", defaults.default_throughput),
        pick("least_load_mean_prefill_tokens", defaults.mean_prefill_tokens),
    )
    metric = pick("power_of_two_load_metric", "expected_wait")
    return {"impl": "smg", "poll_interval_secs": pick("load_monitor_interval", 10), "load_metric": metric,
            "least_load": tunables}  # fmt: skip


def fleet_spec(ns: argparse.Namespace) -> FleetSpec | None:
    """The fleet the flags describe, or None for one plain server; UsageError names a bad flag."""
    from kvadmit.fleet.driver import FleetSpec
    from kvadmit.fleet.router import RouterSettings

    replicas, policy, dp = ns.replicas, ns.router, ns.dp_size
    if dp < 1:
        raise UsageError(f"--dp-size must be ≥ 1, got {dp}")
    if dp == 1 and replicas is None and policy is None:
        return None
    if dp > 1 and (replicas is not None or policy is not None):
        raise UsageError("--dp-size is SGLang's in-process data parallelism; --replicas/--router put "
                         "separate servers behind the router: give one or the other")  # fmt: skip
    if dp > 1:
        if ns.load_balance_method in UNMODELLED_METHODS:
            raise UsageError(f"--load-balance-method {ns.load_balance_method} is not modelled: "
                             f"{UNMODELLED_METHODS[ns.load_balance_method]}; use round_robin (SGLang's "
                             "default), or --replicas N --router power_of_two")  # fmt: skip
        replicas, policy = dp, "round_robin"
    replicas = 1 if replicas is None else replicas
    if replicas < 1:
        raise UsageError(f"--replicas must be ≥ 1, got {replicas}")
    settings = RouterSettings(
        **smg_settings(ns),
        policy=policy or "cache_aware",
        cache_threshold=ns.cache_threshold,
        balance_abs_threshold=ns.balance_abs_threshold,
        balance_rel_threshold=ns.balance_rel_threshold,
        eviction_interval_secs=ns.eviction_interval_secs,
        max_tree_size=ns.max_tree_size,
        seed=ns.router_seed,
    )
    try:
        settings.check()
    except ValueError as e:
        raise UsageError(str(e)) from None
    if getattr(ns, "replay_arrival", "time") == "step":
        raise UsageError("--replay-arrival step replays one server step for step; a fleet replays by time")
    return FleetSpec(replicas, settings, in_process=dp > 1)
