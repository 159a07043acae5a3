"""Two facts about the real routers that a fleet simulation must be compared with, measured: the order in
which round_robin deals to its workers, and what the HTTP path through the router adds to a request's
TTFT depending on how soon it follows the previous answer (benchmarks/fleet_fidelity.py relies on both).

* Dealing order: N `kvadmit serve --simulate` workers behind each router, --worker-urls given in two
  orders; after the router's own check request, 5 requests one at a time, each attributed to the worker
  whose request counter moved. The simulated router deals 0, 1, 2, …; a real one deals in its own order.
* Hold: 7 requests (40 tokens, streamed) sent one at a time through each router to 2 idle workers, with a
  gap of 0 to 0.5 s between an answer and the next request; and the same straight to a worker.

Needs the fleet extra (`make test-fleet` installs it).

    usage: python benchmarks/router_http.py [--output FILE | -]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "fleet"))

from fleet_helpers import (  # noqa: E402
    Proc,
    requests_counted,
    running_router,
    start_worker,
    wait_idle,
    wait_worker,
)

from fleet_workload import probe_ttfts_ms  # noqa: E402
from machine import cpu_model, publish  # noqa: E402

ROUTERS = ("sglang-router", "smg")
GAPS_S = (0.0, 0.01, 0.03, 0.05, 0.1, 0.5)


def dealt(router: str, workers: list[Proc], order: list[Proc], folder: Path, n: int = 5) -> list[int]:
    """The workers (by index in `workers`) that `n` requests sent one at a time through the router went to."""
    out = []
    with running_router(router, order, "round_robin", folder) as r:
        for i in range(n):
            wait_idle(workers)
            before = requests_counted(workers)
            body = {"model": "simulated", "prompt": f"question {i}", "max_tokens": 2}
            httpx.post(f"{r.url}/v1/completions", json=body, timeout=10)
            wait_idle(workers)
            moved = [a - b for a, b in zip(requests_counted(workers), before, strict=True)]
            out.append(moved.index(1))
    return out


def span(values: list[float]) -> str:
    return f"{min(values):.1f}–{max(values):.1f} (median {statistics.median(values):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--output", default=str(HERE / "router_http.txt"))
    ns = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="router-http-"))
    cost = folder / "cost.json"
    cost.write_text(json.dumps({"decode": {"base_ms": 20.0}, "prefill": {"tokens_per_s": 1e6}}))
    load_before = os.getloadavg()[0]
    lines = [
        "# benchmarks/router_http.py: the real routers' round_robin order and their HTTP hold",
        f"date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"machine: {cpu_model()}, {os.cpu_count()} cores; Python {platform.python_version()}",
        "workers: kvadmit serve --simulate, 20 ms decode steps, on free ports of 127.0.0.1",
        "",
        "round_robin: the worker each of 5 requests (sent one at a time, after the router's own check) went"
        " to, by index in the order the workers were started",
        "",
        "| router | workers | --worker-urls order | dealt to |",
        "| --- | ---: | --- | --- |",
    ]
    for size in (2, 3):
        workers = [start_worker(str(cost), folder, []) for _ in range(size)]
        try:
            for w in workers:
                wait_worker(w)
            for router in ROUTERS:
                for order in (workers, workers[::-1]):
                    to = dealt(router, workers, order, folder)
                    lines.append(f"| {router} | {size} | {[workers.index(w) for w in order]} | {to} |")
        finally:
            for w in workers:
                w.stop()
    lines += [
        "",
        "TTFT of 7 requests (40 tokens, streamed) sent one at a time to 2 idle workers, each the given gap"
        " after the previous answer, ms: min–max (median)",
        "",
        "| path | " + " | ".join(f"gap {g:g} s" for g in GAPS_S) + " |",
        "| --- | " + " | ".join("---" for _ in GAPS_S) + " |",
    ]
    workers = [start_worker(str(cost), folder, []) for _ in range(2)]
    try:
        for w in workers:
            wait_worker(w)
        for router in ROUTERS:
            with running_router(router, workers, "round_robin", folder) as r:
                cells = [span(probe_ttfts_ms(r.url, 40, gap_s=gap)) for gap in GAPS_S]
            lines.append(f"| through {router} | " + " | ".join(cells) + " |")
        cells = [span(probe_ttfts_ms(workers[0].url, 40, gap_s=gap)) for gap in GAPS_S]
        lines.append("| straight to a worker | " + " | ".join(cells) + " |")
    finally:
        for w in workers:
            w.stop()
    lines += ["", f"load average (1 min) before / after: {load_before:.1f} / {os.getloadavg()[0]:.1f}"]
    publish(lines, ns.output)


if __name__ == "__main__":
    main()
