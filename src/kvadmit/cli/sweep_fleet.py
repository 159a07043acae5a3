"""`kvadmit sweep --search-min-replicas`: for each combination of the other swept settings (routers,
server flags), the fewest replicas that meet --target-ttft-ms / --target-tpot-ms at the one
--request-rate given (fleet/replica_search.py), the searches run in parallel as the sweep's points do."""

from __future__ import annotations

import argparse
import math

from kvadmit.errors import UsageError


def _search_one(job: tuple[object, object, object, int]) -> object:
    from kvadmit.fleet.replica_search import search_min_replicas

    cfg, fleet, target, highest = job
    return search_min_replicas(cfg, fleet, target, highest)  # type: ignore[arg-type]


def run_replica_search(
    ns: argparse.Namespace, combos: list[tuple[dict[str, object], dict[str, object]]], workers: int
) -> int:
    from kvadmit.cli.fleet_flags import fleet_spec
    from kvadmit.cli.simulate import simulate_config
    from kvadmit.cli.sweep import _point_namespace, print_search_table, run_searches
    from kvadmit.fleet.replica_search import ReplicaSearch
    from kvadmit.sim.rate_search import Target

    if ns.target_ttft_ms is None and ns.target_tpot_ms is None:
        raise UsageError("--search-min-replicas needs --target-ttft-ms and/or --target-tpot-ms")
    rates = ns.request_rate or []
    if len(rates) != 1 or not math.isfinite(rates[0]):
        raise UsageError("--search-min-replicas needs one finite --request-rate: the load to meet")
    if ns.replicas:
        raise UsageError("--search-min-replicas searches --replicas itself; do not give it")
    if ns.dp_size != 1:
        raise UsageError("--search-min-replicas searches replicas behind the router; leave --dp-size at 1")
    if ns.max_replicas < 1:
        raise UsageError(f"--max-replicas must be ≥ 1, got {ns.max_replicas}")
    target = Target(ns.target_ttft_ms, ns.target_tpot_ms, ns.target_statistic)
    jobs: list[object] = []
    labels = []
    for shown, values in combos:
        shown.pop("request_rate", None)
        point_ns = _point_namespace(ns, {**values, "replicas": 1})
        jobs.append((simulate_config(point_ns), fleet_spec(point_ns), target, ns.max_replicas))
        labels.append(shown)
    found, closing = run_searches(ns, _search_one, jobs, workers)
    rows = []
    for result in found:
        assert isinstance(result, ReplicaSearch)
        best = next((p for p in result.probes if p.replicas == result.fewest), None)
        if best is None:
            cells = [f"none ≤ {ns.max_replicas}", "—", "—"]
        else:
            cells = [str(best.replicas), f"{best.ttft_ms:,.0f}", f"{best.tpot_ms:,.2f}"]
        rows.append([*cells, " ".join(f"{p.replicas}{'✓' if p.meets else '✗'}" for p in result.probes)])
    stat = target.statistic
    title = (f"fewest replicas meeting {target.describe()} at {rates[0]:g} req/s "
             f"({ns.num_prompts} requests per probe)")  # fmt: skip
    columns = ["fewest replicas", f"TTFT {stat} ms", f"TPOT {stat} ms", "probes"]
    print_search_table(title, labels, columns, rows, closing)
    return 0
