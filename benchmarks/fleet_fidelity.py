"""The simulated router against the real ones: N `kvadmit serve --simulate` workers behind sglang-router
0.3.2 and smg 1.13.0 (each configuration run --repeats times, for the real runs' own spread), and
`kvadmit simulate --replicas N --router POLICY` on the same requests (benchmarks/fleet_workload.py).

The simulation gets the HTTP path's time as --request-latency-ms: the median TTFT of a few requests sent
one at a time, 0.5 s apart, to the idle workers through the router, measured first. It is run twice: with
the nominal cost model ('sim') and with the real workers' own loop times ('sim, measured': the mean decode
cycle and what a prefill adds to the loop, both from the workers' --trace-steps). Per worker: requests
served (from the workers' --trace-requests), peak queue (the largest #queue-req of its log,
--decode-log-interval 1), requests retracted (the #retracted_reqs of its log's 'Retract requests' lines)
and TTFT median (the client's, of that worker's requests). Under round_robin each real worker is paired
with the simulated replica that served its requests (the routers deal in an order of their own) and the
requests must be the same. Under cache_aware and power_of_two workers are listed by how many requests they
served (which one gets most is a draw), and the simulated value is compared with the real runs' range. A
second table compares every request's TTFT with its real ones under round_robin and cache_aware (workers
paired by the requests they served). The routers poll loads every second (the tests' setting;
sglang-router's default is 30 s). A real router's polls fall at an arbitrary point of that second relative
to the requests, so power_of_two is also simulated with the first poll at each tenth of the interval (the
third table: its range over those phases against the real runs' range) and at each fiftieth (the fourth:
for each real run, the phase that routes its requests as it did). The real runs also record when the
router's polls reached worker 0 (its access log, watched every millisecond), and the last two tables
simulate each power_of_two run with its first poll placed where that run's polls fell.
Needs the fleet extra (`make test-fleet` installs it).

    usage: python benchmarks/fleet_fidelity.py [--workers 2] [--requests 120] [--repeats 3]
                                               [--output FILE | -]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import itertools
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "fleet"))

from fleet_helpers import running_router, start_worker, wait_idle, wait_worker  # noqa: E402

from fleet_workload import (  # noqa: E402
    POLL_MARKERS,
    SimulatedRun,
    Stream,
    WorkerResult,
    idle_ttft_ms,
    make_stream,
    peak_queue,
    retracted,
    send_stream,
    served_from_trace,
    simulated,
)
from kvadmit.config import ServerArgs  # noqa: E402
from kvadmit.observe.load_snapshot import GEN_THROUGHPUT_STALE_S  # noqa: E402
from machine import cpu_model, publish, source_commit  # noqa: E402


def steps_file(log: Path) -> Path:
    return log.with_suffix(".steps.jsonl")


def tail(path: Path, start: int) -> list[str]:
    with path.open("rb") as f:
        f.seek(start)
        return f.read().decode(errors="replace").splitlines()


PHASES = 10  # power_of_two simulated with its first load poll at k / PHASES s
NEAR_MS = (-20, -10, 10, 20)  # the measured phase moved by these, to show how much it decides
POLL_S = 1.0  # the routers' load poll interval here (router_argv: 1 s)
FINE_PHASES = 50  # and at k / FINE_PHASES s, to find the phase that routes as a real run did
# smg's power_of_two divides each worker's queued work by its /v1/loads gen_throughput, and an idle SGLang
# worker can keep its last decode window there for up to 30 s (a prefill into an empty batch restores it and
# the idle pass leaves it; docs/simulate.md, "smg 1.13 and the decode window"). A run that starts within
# that time of the previous one inherits it; the simulation starts with 0 everywhere. So each smg
# power_of_two run starts after the workers idled past the 30 s, when every worker reports 0 again.
CLEAN_THROUGHPUT_S = GEN_THROUGHPUT_STALE_S + 1.0
STEPS: list[float] = []  # every real decode cycle (ms), from the workers' --trace-steps
# the real cycles into and out of a prefill step (ms): decode → prefill, prefill → decode
AROUND_PREFILL: dict[str, list[float]] = {"into": [], "out of": []}


def cycles_ms(lines: list[str], first: str, then: str) -> list[float]:
    """The time from the end of a `first` step to the end of the `then` step right after it, where the two
    follow each other within a second (--trace-steps' t) and requests were still running after the first
    (a step that ended the last one is followed by idle time, up to 985 ms on 2026-12-03, which raised the
    mean cycle into a prefill from 0.5 ms to 4-8): the step and whatever the server did between the two,
    in ms."""
    rows = [json.loads(line) for line in lines]
    return [1000 * (b["t"] - a["t"]) for a, b in itertools.pairwise(rows)
            if a["kind"] == first and b["kind"] == then and 0 < b["t"] - a["t"] < 1.0
            and a["running"] > 0]  # fmt: skip


def prefill_ms(decode_ms: float) -> float:
    """What a prefill step adds to the real serving loop: the cycle into it plus the cycle out of it, less
    the decode cycle the cycle out of it stands for (the decode step after it, slowed by its result)."""
    into, out = AROUND_PREFILL["into"], AROUND_PREFILL["out of"]
    return statistics.mean(into) + statistics.mean(out) - decode_ms if into and out else 0.0


def real_run(router: str, policy: str, workers: list, files: list[tuple[Path, Path]], stream, folder: Path):  # type: ignore[no-untyped-def]
    """One real run: each worker's results, and when the router's load polls reached worker 0 (s after the
    stream's start)."""
    for w in workers:
        httpx.post(f"{w.url}/flush_cache", timeout=10)
    wait_idle(workers)
    if router == "smg" and policy == "power_of_two":
        time.sleep(CLEAN_THROUGHPUT_S)
    marks = [(log.stat().st_size, trace.stat().st_size) for log, trace in files]
    step_marks = [steps_file(log).stat().st_size for log, _ in files]
    with running_router(router, workers, policy, folder) as r:
        sent = send_stream(r.url, stream, workers[0].log, POLL_MARKERS[router])
    ttfts = sent.ttfts_ms
    wait_idle(workers)
    out = []
    for (log, trace), (log_at, trace_at), steps_at in zip(files, marks, step_marks, strict=True):
        served = served_from_trace(tail(trace, trace_at))
        lines = tail(log, log_at)
        step_lines = tail(steps_file(log), steps_at)
        STEPS.extend(cycles_ms(step_lines, "decode", "decode"))
        AROUND_PREFILL["into"].extend(cycles_ms(step_lines, "decode", "prefill"))
        AROUND_PREFILL["out of"].extend(cycles_ms(step_lines, "prefill", "decode"))
        mine = [ttfts[i] for i in served]
        median = statistics.median(mine) if mine else 0.0
        out.append(WorkerResult(served, peak_queue(lines), median, retracted(lines), mine))
    return out, sent.polls_s


def ranked(results: list[WorkerResult], by_index: bool) -> list[WorkerResult]:
    return results if by_index else sorted(results, key=lambda w: -len(w.served))


def same_worker(run: list[WorkerResult], sim: list[WorkerResult]) -> int:
    """How many requests worker k of the real run served where simulated replica k did."""
    return sum(len(set(r.served) & set(w.served)) for r, w in zip(run, sim, strict=True))


def aligned(run: list[WorkerResult], sim: list[WorkerResult]) -> list[WorkerResult]:
    """The real run's workers in the order that puts the most requests where the simulation put them.
    Under round_robin the routers deal to their workers in turn, but in an order of their own that changes
    from one start of the router to the next, whatever the order of --worker-urls (benchmarks/
    router_http.txt), while the simulated router deals 0, 1, 2, …; and a router may take two requests
    sent a moment apart in the other order, and deal them the other way."""
    return list(max(itertools.permutations(run), key=lambda order: same_worker(list(order), sim)))


def span(values: list[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if lo == hi else f"{format(lo, fmt)}–{format(hi, fmt)}"


def table_rows(
    policy: str, router: str, runs: list[list[WorkerResult]], nominal: list[WorkerResult],
    fitted: list[WorkerResult],
) -> list[str]:  # fmt: skip
    """One row per worker: round_robin by worker index, the others by requests served (most first)."""
    by_index = policy == "round_robin"
    nominal, fitted = ranked(nominal, by_index), ranked(fitted, by_index)
    runs = [aligned(run, fitted) if by_index else ranked(run, False) for run in runs]
    out = []
    for k in range(len(nominal)):
        counts = [len(run[k].served) for run in runs]
        queues = [run[k].peak_queue for run in runs]
        ttft = [run[k].ttft_p50_ms for run in runs]
        retractions = [run[k].retracted for run in runs]
        a, b = nominal[k], fitted[k]
        pairs = ((len(b.served), counts), (b.peak_queue, queues), (b.retracted, retractions),
                 (b.ttft_p50_ms, ttft))  # fmt: skip
        inside = [min(v) <= x <= max(v) for x, v in pairs]
        names = ("count", "queue", "retracted", "TTFT")
        if by_index:  # round_robin: the very requests, not only as many
            inside[0] = all(run[k].served == b.served for run in runs)  # (run: aligned with `fitted`)
            names = ("requests", *names[1:])
        verdict = ", ".join(n for n, i in zip(names, inside, strict=True) if i) or "—"
        label = f"DP{k}" if by_index else f"#{k + 1}"
        out.append(
            f"| {policy} | {router} | {label} | {len(a.served)} / {span(counts, 'd')} | "
            f"{a.peak_queue} / {b.peak_queue} / {span(queues, 'd')} | "
            f"{a.retracted} / {b.retracted} / {span(retractions, 'd')} | "
            f"{a.ttft_p50_ms:,.0f} / {b.ttft_p50_ms:,.0f} / {span(ttft, ',.0f')} | {verdict} |"
        )
    return out


def per_request_row(
    policy: str, router: str, runs: list[list[WorkerResult]], fitted: list[WorkerResult]
) -> str | None:
    """Every request on its own: how many requests each real run served on the worker the
    simulation put them on; how many of the simulated TTFTs ('sim, measured') fall within that request's
    real range; and the simulated minus the real mean (median, 10th and 90th percentile over the
    requests). None when a real run did not record each TTFT (runs saved before they were)."""
    real: dict[int, list[float]] = {}
    for run in runs:
        if any(len(w.ttfts_ms) != len(w.served) for w in run):
            return None
        for w in run:
            for i, t in zip(w.served, w.ttfts_ms, strict=True):
                real.setdefault(i, []).append(t)
    placed = ", ".join(str(same_worker(aligned(run, fitted), fitted)) for run in runs)
    sim = {i: t for w in fitted for i, t in zip(w.served, w.ttfts_ms, strict=True)}
    inside = sum(min(real[i]) <= sim[i] <= max(real[i]) for i in sim)
    diffs = sorted(sim[i] - statistics.mean(real[i]) for i in sim)
    deciles = statistics.quantiles(diffs, n=10)
    spread = statistics.median(max(v) - min(v) for v in real.values())
    return (
        f"| {policy} | {router} | {len(sim)} | {placed} | {inside} | {statistics.median(diffs):+,.1f} | "
        f"{deciles[0]:+,.1f} | {deciles[-1]:+,.1f} | {spread:,.1f} |"
    )


def side_by_side(
    sim: list[WorkerResult], real: list[WorkerResult], value: Callable[[WorkerResult], str]
) -> str:
    """Each worker's value, simulated / real: `61 / 61, 59 / 59`."""
    return ", ".join(f"{value(a)} / {value(b)}" for a, b in zip(sim, real, strict=True))


def fit_cells(run: list[WorkerResult], sim: list[WorkerResult]) -> str:
    """A real run against one simulation (workers paired by the requests they served): requests on the
    same worker, of how many; then each worker's requests, peak queue and TTFT median, simulated / real."""
    real = aligned(run, sim)
    return (
        f"{same_worker(real, sim)} of {sum(len(w.served) for w in sim)} | "
        f"{side_by_side(sim, real, lambda w: str(len(w.served)))} | "
        f"{side_by_side(sim, real, lambda w: str(w.peak_queue))} | "
        f"{side_by_side(sim, real, lambda w: f'{w.ttft_p50_ms:,.0f}')}"
    )


def phase_fit_rows(router: str, runs: list[list[WorkerResult]], fine: list[list[WorkerResult]]) -> list[str]:
    """power_of_two, each real run: the first-poll phase (of FINE_PHASES) whose simulation put the most
    requests on the same worker as that run did, how many, how many phases come within 5 of that, and at
    the best phase each worker's requests, peak queue and TTFT median, simulated / real."""
    out = []
    for j, run in enumerate(runs):
        scores = [same_worker(aligned(run, sim), sim) for sim in fine]
        best = max(range(len(fine)), key=lambda k: scores[k])
        near = sum(x >= scores[best] - 5 for x in scores)
        out.append(
            f"| {router} | {j + 1} | {best / len(fine):.2f} s | {fit_cells(run, fine[best])} | {near} |"
        )
    return out


def power_of_two_sim(
    stream: Stream, args: ServerArgs, ns: argparse.Namespace, overhead_ms: float,
    measured: tuple[float, float], router: str, first_poll_s: float,
) -> SimulatedRun:  # fmt: skip
    """'sim, measured' (the real decode cycle, a prefill's added time) under power_of_two, behind `router`'s
    rules, with the first load poll at first_poll_s."""
    return simulated(stream, args, measured[0], "power_of_two", ns.workers, 1, overhead_ms / 1000,
                     first_poll_s, impl(router, "power_of_two"), measured[1])  # fmt: skip


def measured_phase_lines(
    stream: Stream, args: ServerArgs, ns: argparse.Namespace, overhead_ms: float,
    measured: tuple[float, float],  # decode cycle, a prefill's added time (ms)
    rows: list[tuple[str, str, list[list[WorkerResult]]]], polls: dict[tuple[str, str], list[list[float]]],
) -> list[str]:  # fmt: skip
    """power_of_two with each real run's own poll phase (measure_real watches worker 0's access log for
    the router's polls): each run against its simulation ('sim, measured'), then the simulations' range
    against the real runs' range."""

    def sim(router: str, first_poll_s: float) -> SimulatedRun:
        return power_of_two_sim(stream, args, ns, overhead_ms, measured, router, first_poll_s)

    fits, ranges = [], []
    for policy, router, runs in rows:
        if policy != "power_of_two" or (policy, router) not in polls:
            continue
        start = sim(router, 0.0).start_s  # (the warm-ups take as long whatever the phase: checked below)
        sims = []
        for j, (run, seen) in enumerate(zip(runs, polls[policy, router], strict=True)):
            phase = measured_phase(seen, start)
            if phase is None:
                fits.append(
                    f"| {router} | {j + 1} | {spacing_ms(seen)} | no poll seen before the start | ||||"
                )
                continue
            got = sim(router, phase)
            assert abs(got.start_s - start) < 1e-9, (got.start_s, start)
            sims.append(got.workers)
            # how sensitive the run is to its phase: the same count with the first poll moved by a few ms
            near = [sim(router, (phase + d / 1000) % POLL_S).workers for d in NEAR_MS]
            nearby = ", ".join(str(same_worker(aligned(run, w), w)) for w in near)
            cells = fit_cells(run, got.workers)
            fits.append(f"| {router} | {j + 1} | {spacing_ms(seen)} | {phase:.3f} s | {cells} | {nearby} |")
        if sims:
            ranges += phase_rows(policy, router, runs, sims)
    if not fits:
        return []
    return [
        "",
        "power_of_two at each real run's own poll phase: the router's polls as worker 0's access log showed "
        "them, and the simulation ('sim, measured') with its first poll placed as the run's last poll before "
        "the stream's start (workers paired by the requests they served):",
        "",
        "| router | real run | real polls' spacing, ms: mean (range) | first poll | requests on the same "
        "worker | requests, sim / real | peak queue, sim / real | TTFT p50 ms, sim / real | requests on the "
        f"same worker with the first poll moved by {', '.join(f'{d:+d}' for d in NEAR_MS)} ms |",
        "| --- | ---: | --- | ---: | ---: | --- | --- | --- | --- |",
        *fits,
        "",
        "power_of_two, the simulations at the real runs' own phases: their range / the real range (how many "
        "of them fall inside it):",
        "",
        "| policy | router | worker | requests | peak queue | retracted | TTFT p50 ms | ranges overlap |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *ranges,
    ]


def measured_phase(polls_s: list[float], start_s: float, interval_s: float = POLL_S) -> float | None:
    """The simulated router's first load poll that puts its polls where the real router's were relative to
    the stream's start: the last real poll before that start (seen while the workers idled, so within about
    a millisecond of when it was sent), moved to the simulated stream's start. None if none was seen."""
    before = [q for q in polls_s if q <= 0.0]
    return (start_s + max(before)) % interval_s if before else None


def spacing_ms(polls_s: list[float]) -> str:
    """The real polls' mean spacing, first to last, ms (one poll logged late, at a busy worker, moves the gaps
    next to it, not this), and the smallest and largest gap."""
    if len(polls_s) < 2:
        return "—"
    gaps = [1000 * (b - a) for a, b in itertools.pairwise(polls_s)]
    mean = 1000 * (polls_s[-1] - polls_s[0]) / (len(polls_s) - 1)
    return f"{mean:,.1f} ({min(gaps):,.0f}–{max(gaps):,.0f})"


METRICS = (("count", lambda w: len(w.served), "d"), ("queue", lambda w: w.peak_queue, "d"),
           ("retracted", lambda w: w.retracted, "d"), ("TTFT", lambda w: w.ttft_p50_ms, ",.0f"))  # fmt: skip


def phase_rows(
    policy: str, router: str, runs: list[list[WorkerResult]], phased: list[list[WorkerResult]]
) -> list[str]:
    """One row per worker (by requests served): the simulated range over the poll phases / the real range,
    how many phases fall inside the real range, and which ranges overlap."""
    runs = [ranked(run, False) for run in runs]
    phased = [ranked(sim, False) for sim in phased]
    out = []
    for k in range(len(runs[0])):
        cells, overlap = [], []
        for name, value, fmt in METRICS:
            sim, real = [value(p[k]) for p in phased], [value(r[k]) for r in runs]
            inside = sum(min(real) <= x <= max(real) for x in sim)
            cells.append(f"{span(sim, fmt)} / {span(real, fmt)} ({inside})")
            if min(sim) <= max(real) and min(real) <= max(sim):
                overlap.append(name)
        verdict = ", ".join(overlap) or "—"
        out.append(f"| {policy} | {router} | #{k + 1} | " + " | ".join(cells) + f" | {verdict} |")
    return out


def clean_start(real: dict) -> str:  # type: ignore[type-arg]
    """How the real smg power_of_two runs started (runs saved before CLEAN_THROUGHPUT_S: right after the
    previous run)."""
    idle = real.get("smg_power_of_two_idle_s")
    if idle is None:
        return "; each real run started right after the previous one"
    return (
        f"; each real smg power_of_two run started after the workers idled {idle:g} s, so that every "
        "worker's gen_throughput was 0 at its start, as in the simulation (CLEAN_THROUGHPUT_S says why)"
    )


def header(
    ns: argparse.Namespace,
    overhead_ms: float,
    measured: tuple[float, float],  # decode cycle, a prefill's added time (ms)
    loads: tuple[float, ...],
    real: dict,  # type: ignore[type-arg]
) -> list[str]:
    """The lines above the tables: when, where, how (the machine's load before and after included)."""
    return [
        "# benchmarks/fleet_fidelity.py: simulate --replicas N --router POLICY against the real routers",
        f"date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; commit {source_commit()}",
        f"real runs: measured {real['date']} at commit {real['commit']} (saved in {Path(ns.save_real).name})",
        "command: " + shlex.join(["python", "benchmarks/fleet_fidelity.py", *sys.argv[1:]]),
        f"machine: {cpu_model()}, {os.cpu_count()} cores, shared with other jobs; "
        f"Python {platform.python_version()}",
        f"workers: {ns.workers} × kvadmit serve --simulate ({ns.decode_ms:g} ms decode steps, "
        f"--max-running-requests {ns.max_running}); routers poll loads every 1 s",
        f"simulated with --request-latency-ms {overhead_ms:.0f}: the median TTFT of 7 requests sent one at a "
        "time, 0.5 s apart, through the router to the idle workers (HTTP, router, server loop on this "
        "machine; fleet_workload.idle_ttft_ms says why apart)",
        f"and with two cost models: the nominal one, {ns.decode_ms:g} ms decode steps ('sim'), and the "
        f"real workers' own ('sim, measured'): {measured[0]:.1f} ms decode steps, the mean time between two "
        f"consecutive decode steps ({len(STEPS):,} of them, from their --trace-steps: the step and the "
        f"server's work between steps), and {measured[1]:.2f} ms more a prefill step, the cycles into and "
        "out of a prefill less a decode cycle (fleet_fidelity.prefill_ms)",
        f"requests: {ns.requests} at {ns.rate:g}/s (Poisson), 4 shared system prompts, "
        f"{ns.max_tokens} tokens each; {ns.repeats} real runs per configuration",
        (
            "smg's power_of_two simulated with --router-impl smg (its expected wait over /v1/loads, polled "
            "every 1 s: --load-monitor-interval 1), the other rows with sglang-router 0.3.2's rules"
            + clean_start(real)
            if ns.smg_power_of_two_as == "smg"
            else "every row simulated with sglang-router 0.3.2's rules (smg's power_of_two too)"
        ),
        f"load average (1 min) before / after: {loads[0]:.1f} / {loads[1]:.1f} "
        "(the cores are shared with other jobs, whose load moves the real steps, queues and TTFTs)",
    ]


def measure_real(ns: argparse.Namespace, stream) -> dict:  # type: ignore[no-untyped-def,type-arg]
    """The real runs: N workers behind each router and policy, --repeats times each, as JSON-ready data."""
    folder = Path(tempfile.mkdtemp(prefix="fleet-fidelity-"))
    cost = folder / "cost.json"
    cost.write_text(json.dumps({"decode": {"base_ms": ns.decode_ms}, "prefill": {"tokens_per_s": 1e6}}))
    files = [(folder / f"w{k}.log", folder / f"w{k}.jsonl") for k in range(ns.workers)]
    workers = []
    for log, trace in files:
        extra = ["--max-running-requests", str(ns.max_running), "--max-total-tokens", "20000",
                 "--decode-log-interval", "1", "--log-level", "info", "--log-file", str(log),
                 "--trace-requests", str(trace), "--trace-steps", str(steps_file(log))]  # fmt: skip
        workers.append(start_worker(str(cost), folder, extra))
    load_before = os.getloadavg()[0]
    rows = []
    try:
        for w in workers:
            wait_worker(w)
        for log, trace in files:
            log.touch()
            trace.touch()
            steps_file(log).touch()
        with running_router("sglang-router", workers, "round_robin", folder) as r:
            overhead_ms = idle_ttft_ms(r.url, ns.max_tokens)
        wait_idle(workers)
        for policy in ns.policies.split(","):
            for router in ns.routers.split(","):
                done = [real_run(router, policy, workers, files, stream, folder) for _ in range(ns.repeats)]
                runs, polls = [run for run, _ in done], [seen for _, seen in done]
                rows.append((policy, router, runs, polls))
                print(f"{router} {policy}: {[[len(w.served) for w in run] for run in runs]}", file=sys.stderr)
    finally:
        for w in workers:
            w.stop()
    load_after = os.getloadavg()[0]
    return {"rows": [[p, r, [[dataclasses.asdict(w) for w in run] for run in runs], polls]
                     for p, r, runs, polls in rows],
            "overhead_ms": overhead_ms, "steps": len(STEPS), "step_ms": statistics.mean(STEPS),
            "prefill_ms": prefill_ms(statistics.mean(STEPS)),
            "loads": [load_before, load_after], "commit": source_commit(),
            "smg_power_of_two_idle_s": CLEAN_THROUGHPUT_S,
            "date": f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC"}  # fmt: skip


SMG_POWER_OF_TWO_AS = ["smg"]  # --smg-power-of-two-as


def impl(router: str, policy: str) -> str:
    """Whose rules simulate the router: smg's for its power_of_two (--router-impl smg; sglang-router's with
    --smg-power-of-two-as sglang-router, as before smg's was modelled), sglang-router 0.3.2's otherwise
    (round_robin is the same rule in both; smg's cache_aware is not modelled)."""
    smg = router == "smg" and policy == "power_of_two"
    return SMG_POWER_OF_TWO_AS[0] if smg else "sglang-router"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--decode-ms", type=float, default=20.0)
    ap.add_argument("--max-running", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--routers", default="sglang-router,smg")
    ap.add_argument("--policies", default="round_robin,cache_aware,power_of_two")
    ap.add_argument("--output", default=str(HERE / "fleet_fidelity.txt"))
    ap.add_argument("--save-real", default=str(HERE / "fleet_fidelity_real.json"),
                    help="where the real runs' results are written (JSON)")  # fmt: skip
    ap.add_argument("--real-from", default=None, help="simulate against real runs saved by --save-real "
                    "instead of running the routers again")  # fmt: skip
    ap.add_argument("--smg-power-of-two-as", choices=("smg", "sglang-router"), default="smg",
                    help="whose rules simulate smg's power_of_two rows (sglang-router: as before smg "
                    "1.13.0's rule was modelled)")  # fmt: skip
    ns = ap.parse_args()
    SMG_POWER_OF_TWO_AS[0] = ns.smg_power_of_two_as
    stream = make_stream(ns.requests, ns.rate, ns.max_tokens)
    args = ServerArgs(max_total_tokens=20000, max_running_requests=ns.max_running, decode_log_interval=1)
    if ns.real_from:
        real = json.loads(Path(ns.real_from).read_text())
    else:
        real = measure_real(ns, stream)
        Path(ns.save_real).write_text(json.dumps(real))
    rows = [(row[0], row[1], [[WorkerResult(**w) for w in run] for run in row[2]]) for row in real["rows"]]
    overhead_ms, measured = real["overhead_ms"], real["step_ms"]
    prefill = real.get("prefill_ms", 0.0)  # (runs saved before it was measured: none)
    STEPS[:] = [measured] * real["steps"]  # (the header reports their count)
    load_before, load_after = real["loads"]
    policies, routers = ns.policies.split(","), ns.routers.split(",")
    sims = {}
    for policy in policies:
        for router in routers:
            for label, step, extra in (("sim", ns.decode_ms, 0.0), ("measured", measured, prefill)):
                sims[router, policy, label] = simulated(
                    stream, args, step, policy, ns.workers, 1, overhead_ms / 1000, impl=impl(router, policy),
                    prefill_ms=extra,
                ).workers  # fmt: skip
    fine = {router: [power_of_two_sim(stream, args, ns, overhead_ms, (measured, prefill), router,
                                      k / FINE_PHASES).workers for k in range(FINE_PHASES)]
            for router in routers} if "power_of_two" in policies else {}  # fmt: skip
    # the tenths among the fiftieths (k / 10 and 5k / 50 are the same rational, so the same double)
    phased = {router: sims[:: FINE_PHASES // PHASES] for router, sims in fine.items()}
    lines = [
        *header(ns, overhead_ms, (measured, prefill), (load_before, load_after), real),
        "",
        "| policy | router | worker | requests: sim / real | peak queue: sim / sim, measured / real | "
        "retracted: sim / sim, measured / real | TTFT p50 ms: sim / sim, measured / real | "
        "sim, measured within the real range |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for policy, router, runs in rows:
        nominal, fitted = sims[router, policy, "sim"], sims[router, policy, "measured"]
        lines += table_rows(policy, router, runs, nominal, fitted)
    per_request = [
        row
        for policy, router, runs in rows
        if policy in ("round_robin", "cache_aware")
        if (row := per_request_row(policy, router, runs, sims[router, policy, "measured"])) is not None
    ]
    if per_request:
        lines += [
            "",
            "round_robin and cache_aware request by request ('sim, measured'; real workers paired with the "
            "simulated ones by the requests they served): TTFT, simulated against the real runs",
            "",
            "| policy | router | requests | on the simulated worker, each real run | simulated within the "
            "request's real range | simulated − real mean, ms: median | 10th percentile | 90th percentile | "
            "the real range's width, median, ms |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            *per_request,
        ]
    if phased:
        lines += [
            "",
            f"power_of_two, 'sim, measured' with the first load poll at 0, 0.1, …, {(PHASES - 1) / PHASES:g} "
            f"s: the {PHASES} phases' range / the real range (how many phases fall inside it):",
            "",
            "| policy | router | worker | requests | peak queue | retracted | TTFT p50 ms | ranges overlap |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for policy, router, runs in rows:
            if policy == "power_of_two":
                lines += phase_rows(policy, router, runs, phased[router])
        lines += [
            "",
            "power_of_two, each real run against the simulation ('sim, measured') with the first load poll "
            f"at the one of 0, {1 / FINE_PHASES:g}, …, {(FINE_PHASES - 1) / FINE_PHASES:g} s that routes the "
            "most requests as the run did (workers paired by the requests they served):",
            "",
            "| router | real run | first poll | requests on the same worker | requests, sim / real | "
            "peak queue, sim / real | TTFT p50 ms, sim / real | phases within 5 of it |",
            "| --- | ---: | ---: | ---: | --- | --- | --- | ---: |",
        ]
        for policy, router, runs in rows:
            if policy == "power_of_two":
                lines += phase_fit_rows(router, runs, fine[router])
    polls = {(row[0], row[1]): row[3] for row in real["rows"] if len(row) > 3}  # (saved before: none)
    lines += measured_phase_lines(stream, args, ns, overhead_ms, (measured, prefill), rows, polls)
    publish(lines, ns.output)


if __name__ == "__main__":
    main()
