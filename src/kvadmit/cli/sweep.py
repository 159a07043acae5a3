"""`kvadmit sweep`: `simulate` over a grid of server flags and loads, in parallel, as one table.

Every `simulate` flag is accepted; these take comma-separated lists and span the grid:
--schedule-conservativeness, --max-running-requests, --max-total-tokens, --chunked-prefill-size,
--admission-policy (server), --replicas, --router (fleet) and --max-concurrency, --request-rate (load).
With --search-max-rate the request rate is searched instead: for each server setting, the largest rate
that meets the target; with --search-min-replicas, the fewest replicas that meet it at the given rate.
Points run in worker processes on this machine's cores, or with --ray ADDRESS as tasks on a Ray cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
import time
from collections.abc import Callable, Iterator

from kvadmit.cli.flags import add_simulate_flags
from kvadmit.cli.fleet_flags import ROUTER_POLICIES, add_fleet_flags, fleet_spec
from kvadmit.cli.simulate import simulate_config
from kvadmit.config import ADMISSION_POLICIES, ServerArgs
from kvadmit.errors import UsageError


def _maybe_int(text: str) -> int | None:
    return None if text.lower() in ("none", "default") else int(text)


def _policy(text: str) -> str:
    if text not in ADMISSION_POLICIES:
        raise ValueError(text)
    return text


def _router(text: str) -> str:
    if text not in ROUTER_POLICIES:
        raise ValueError(text)
    return text


def _replicas(text: str) -> int:
    n = int(text)
    if n < 1:
        raise ValueError(text)
    return n


# flag dest → how one value is read ("none" reads as None: SGLang's default for that flag)
SWEPT: dict[str, Callable[[str], object]] = {
    "schedule_conservativeness": float,
    "max_running_requests": _maybe_int,
    "max_total_tokens": _maybe_int,
    "chunked_prefill_size": _maybe_int,
    "admission_policy": _policy,
    "replicas": _replicas,
    "router": _router,
    "max_concurrency": _maybe_int,
    "request_rate": float,
}
LOADS = ("max_concurrency", "request_rate")
FLEET = ("replicas", "router")  # unset: one server, no router


def _list_of(read: Callable[[str], object]) -> Callable[[str], list[object]]:
    def parse(text: str) -> list[object]:
        try:
            return [read(v.strip()) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of values") from None

    return parse


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "sweep",
        conflict_handler="resolve",
        help="simulate a grid of server flags × loads in parallel; table, CSV, SVG; max rate for a target",
        description=__doc__.split("\n\n")[0],
    )
    add_simulate_flags(p)
    add_fleet_flags(p)
    g = p.add_argument_group("swept flags (comma-separated lists)")
    for dest, read in SWEPT.items():
        g.add_argument("--" + dest.replace("_", "-"), type=_list_of(read), default=None, metavar="A,B,…")
    o = p.add_argument_group("sweep")
    o.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core)")
    o.add_argument("--ray", metavar="ADDRESS", default=None, help="run the points as tasks on the Ray "
                   "cluster at ADDRESS (auto, HOST:PORT or ray://HOST:PORT; local: a private Ray instance "
                   "on this machine) instead of worker processes; needs `pip install 'kvadmit[ray]'` here "
                   "and, on a remote cluster, the same kvadmit installed on every node (or in the "
                   "runtime_env of a `ray job submit` running this with --ray auto)")  # fmt: skip
    o.add_argument("--csv", metavar="FILE", help="write the results as CSV")
    o.add_argument("--svg", metavar="FILE", help="write charts of each metric against the load")
    o.add_argument("--search-max-rate", action="store_true", help="find the largest --request-rate "
                   "that meets --target-ttft-ms / --target-tpot-ms for each server setting")  # fmt: skip
    o.add_argument("--target-ttft-ms", type=float, default=None)
    o.add_argument("--target-tpot-ms", type=float, default=None)
    o.add_argument("--target-statistic", choices=("p50", "p90", "p95", "p99", "mean"), default="p99")
    o.add_argument("--rate-tolerance", type=float, default=0.02, help="relative width of the final bracket")
    o.add_argument("--search-min-replicas", action="store_true", help="find the fewest --replicas that "
                   "meet the target at the one --request-rate given, for each other setting")  # fmt: skip
    o.add_argument("--max-replicas", type=int, default=256, help="the most replicas the search tries")
    p.set_defaults(func=run)


def _default(dest: str) -> object:
    """What `simulate` uses when the flag is not given."""
    if dest in LOADS:
        return None if dest == "max_concurrency" else float("inf")
    if dest in FLEET:
        return None
    return getattr(ServerArgs(), dest)


def grid(ns: argparse.Namespace) -> list[tuple[dict[str, object], dict[str, object]]]:
    """Every combination of the swept values, in flag order: (the settings shown in the table — flags
    given more than one value, and the load — and every swept flag's value)."""
    axes = {dest: getattr(ns, dest) or [_default(dest)] for dest in SWEPT}
    shown = [k for k in SWEPT if getattr(ns, k) and (len(getattr(ns, k)) > 1 or k in LOADS)]
    out = []
    for combo in itertools.product(*axes.values()):
        values = dict(zip(axes, combo, strict=True))
        out.append(({k: values[k] for k in shown}, values))
    return out


def _point_namespace(ns: argparse.Namespace, values: dict[str, object]) -> argparse.Namespace:
    out = argparse.Namespace(**vars(ns))
    for k, v in values.items():
        setattr(out, k, v)
    return out


def _load_axis(ns: argparse.Namespace) -> str | None:
    return next((k for k in LOADS if len(getattr(ns, k) or []) > 1), None)


def run(ns: argparse.Namespace) -> int:
    from kvadmit.sim.sweep import SweepPoint, default_workers, run_points
    from kvadmit.sim.sweep_report import render_csv, render_plots, render_table

    workers = ns.workers or default_workers()
    if workers <= 0:
        raise UsageError(f"--workers must be positive, got {ns.workers}")
    if ns.ray is not None and ns.workers is not None:
        raise UsageError("--workers is for worker processes on this machine; with --ray each point is a "
                         "one-CPU task on the cluster: give one or the other")  # fmt: skip
    if ns.ray is not None and not ns.ray.strip():
        raise UsageError("--ray needs an address: auto, local, HOST:PORT or ray://HOST:PORT")
    combos = grid(ns)
    if ns.search_max_rate and ns.search_min_replicas:
        raise UsageError("--search-max-rate and --search-min-replicas: one search at a time")
    if ns.search_max_rate:
        return _run_search(ns, combos, workers)
    if ns.search_min_replicas:
        from kvadmit.cli.sweep_fleet import run_replica_search

        return run_replica_search(ns, combos, workers)
    load = _load_axis(ns)
    if ns.svg and load is None:
        raise UsageError("--svg plots against the load: give --max-concurrency or --request-rate a list")
    points = []
    for shown, values in combos:
        point_ns = _point_namespace(ns, values)
        points.append(SweepPoint(shown, simulate_config(point_ns), fleet_spec(point_ns)))
    cluster_cpus: list[int] = []
    started = time.perf_counter()
    with _ray_errors():
        results = run_points(points, workers, ray_address=ns.ray, on_ray_connect=cluster_cpus.append)
    wall = time.perf_counter() - started
    print("\n".join(render_table(results)))
    print(
        f"\n{len(results)} points, {_where(ns.ray, cluster_cpus, min(workers, len(results)))}, "
        f"{wall:.1f} s wall ({sum(r.wall_s for r in results):.1f} s of simulation)"
    )
    if ns.csv:
        _write(ns.csv, render_csv(results))
    if ns.svg and load is not None:
        _write(ns.svg, render_plots(results, load, title="kvadmit sweep"))
    return 0


@contextlib.contextmanager
def _ray_errors() -> Iterator[None]:
    """Ray missing, a bad address or an unreachable cluster: one line, exit status 2."""
    from kvadmit.sim.ray_pool import RayError

    try:
        yield
    except RayError as e:
        raise UsageError(f"--ray: {e}") from None


def _where(ray_address: str | None, cluster_cpus: list[int], workers: int) -> str:
    """Where the points ran, for the summary line."""
    if ray_address is None:
        return f"{workers} worker process(es)"
    cpus = f"{cluster_cpus[0]} CPUs" if cluster_cpus else "CPUs unknown"
    if ray_address == "local":
        return f"on a local Ray instance ({cpus})"
    if ray_address == "auto":
        return f"on the Ray cluster --ray auto found ({cpus})"
    return f"on the Ray cluster at {ray_address} ({cpus})"


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise UsageError(f"cannot write {path!r}: {e.strerror}") from None
    print(f"wrote {path}", file=sys.stderr)


def _search_one(job: tuple[object, object, float, object]) -> object:
    from kvadmit.sim.rate_search import search_max_rate
    from kvadmit.sim.run import simulate

    cfg, target, tol, fleet = job
    run = simulate if fleet is None else fleet.simulate  # type: ignore[attr-defined]
    return search_max_rate(cfg, target, rel_tol=tol, run=run)  # type: ignore[arg-type]


def run_searches(
    ns: argparse.Namespace, fn: Callable[[object], object], jobs: list[object], workers: int
) -> tuple[list[object], str]:
    """Run one search per job in parallel (locally or on Ray, as the sweep's points run); the results and
    the closing line saying where and how long."""
    from kvadmit.sim.sweep import parallel_map

    cluster_cpus: list[int] = []
    started = time.perf_counter()
    with _ray_errors():
        found = parallel_map(fn, jobs, workers, ray_address=ns.ray, on_ray_connect=cluster_cpus.append)
    wall = time.perf_counter() - started
    return found, f"\n{len(jobs)} searches, {_where(ns.ray, cluster_cpus, workers)}, {wall:.1f} s wall"


def print_search_table(
    title: str, labels: list[dict[str, object]], columns: list[str], rows: list[list[str]], closing: str
) -> None:
    """A search's table: the swept settings of each search (its label), then its result's columns."""
    from kvadmit.sim.sweep_report import LABELS

    keys = list(labels[0]) if labels else []
    print(title)
    print("")
    print("| " + " | ".join([*(LABELS.get(k, k) for k in keys), *columns]) + " |")
    print("|" + " --- |" * len(keys) + " ---: |" * len(columns))
    for label, cells in zip(labels, rows, strict=True):
        print("| " + " | ".join([*(str(label[k]) for k in keys), *cells]) + " |")
    print(closing)


def _run_search(ns: argparse.Namespace, combos: list[dict[str, object]], workers: int) -> int:
    from kvadmit.sim.rate_search import RateSearch, Target

    if ns.target_ttft_ms is None and ns.target_tpot_ms is None:
        raise UsageError("--search-max-rate needs --target-ttft-ms and/or --target-tpot-ms")
    if ns.request_rate:
        raise UsageError("--search-max-rate searches --request-rate itself; do not give it")
    if not 0 < ns.rate_tolerance < 1:
        raise UsageError(f"--rate-tolerance must be in (0, 1), got {ns.rate_tolerance}")
    target = Target(ns.target_ttft_ms, ns.target_tpot_ms, ns.target_statistic)
    jobs: list[object] = []
    labels = []
    for shown, values in combos:
        shown.pop("request_rate", None)
        point_ns = _point_namespace(ns, {**values, "request_rate": 1.0})
        jobs.append((simulate_config(point_ns), target, ns.rate_tolerance, fleet_spec(point_ns)))
        labels.append(shown)
    found, closing = run_searches(ns, _search_one, jobs, workers)
    rows = []
    for result in found:
        assert isinstance(result, RateSearch)
        best = next((p for p in result.probes if p.rate == result.best_rate), None)
        if best is None:
            cells = ["none", "—", "—"]
        else:
            cells = [f"{best.rate:,.3g}", f"{best.ttft_ms:,.0f}", f"{best.tpot_ms:,.2f}"]
        rows.append([*cells, str(len(result.probes))])
    stat = target.statistic
    title = f"largest request rate meeting {target.describe()} ({ns.num_prompts} requests per probe)"
    print_search_table(
        title, labels, ["max req/s", f"TTFT {stat} ms", f"TPOT {stat} ms", "probes"], rows, closing
    )
    return 0
