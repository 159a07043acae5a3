"""power_of_two over equal `serve --simulate` workers behind a real router (smg 1.13.0 by default): the
worst worker's share of an even split, for the fleet test's old and new set-ups, alternating run by run so
both see the same load (tests/fleet/test_fleet_routers.py, docs/simulate.md "smg 1.13 and the decode window").

    python benchmarks/fleet_even_split.py --runs 10 --busy 6

old: 5 ms steps, 8 clients a worker, 160 requests of 40 tokens each (the test before 2026-12-02 noon);
new: 20 ms steps, 10 clients a worker, 60 requests of 40 tokens each (the test now). Every worker runs at
most 4 requests and is warmed right before each run, as in the test. --busy N adds N busy-loop processes
for the whole run (load on the shared cores). Needs the fleet extra (make test-fleet installs it)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "fleet"))
sys.path.insert(0, str(HERE.parent / "tests"))

from fleet_helpers import (  # noqa: E402
    Proc,
    requests_counted,
    running_router,
    send_all,
    start_worker,
    wait_idle,
    wait_worker,
    warm_equally,
)

from server_helpers import write_cost_model  # noqa: E402


@dataclass(frozen=True)
class SetUp:
    decode_ms: float
    clients_per_worker: int
    per_worker: int
    warm_tokens: int
    tokens: int = 40


SETUPS = {"old": SetUp(5.0, 8, 160, 100), "new": SetUp(20.0, 10, 60, 50)}


def one_run(router: str, workers: list[Proc], s: SetUp, folder: Path) -> tuple[list[int], float]:
    n = s.per_worker * len(workers)
    bodies = [{"model": "simulated", "prompt": f"request {i}: tell me about the number {i * 7919}",
               "max_tokens": s.tokens, "ignore_eos": True} for i in range(n)]  # fmt: skip
    with running_router(router, workers, "power_of_two", folder) as r:
        warm_equally(workers, per_worker=4, max_tokens=s.warm_tokens)
        before = requests_counted(workers)
        t0 = time.monotonic()
        answers = send_all(r.url, bodies, concurrency=s.clients_per_worker * len(workers))
        seconds = time.monotonic() - t0
        wait_idle(workers)
        split = [a - b for a, b in zip(requests_counted(workers), before, strict=True)]
    assert [status for status, _ in answers] == [200] * n
    return split, seconds


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--router", default="smg", choices=("smg", "sglang-router"))
    ap.add_argument("--workers", type=int, default=4, choices=(2, 3, 4))
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--busy", type=int, default=0, help="busy-loop processes running throughout")
    a = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="fleet_even_split-"))
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
    fleets: dict[str, list[Proc]] = {}
    shares: dict[str, list[tuple[float, float]]] = {name: [] for name in SETUPS}  # (lowest, highest)
    loads: list[float] = []
    try:
        for name, s in SETUPS.items():
            cost = write_cost_model(folder / f"cost-{name}.json", decode_ms=s.decode_ms)
            fleets[name] = [start_worker(cost, folder, ["--max-running-requests", "4"]) for _ in range(4)]
        for fleet in fleets.values():
            for w in fleet:
                wait_worker(w)
        for run in range(a.runs):
            for name, s in SETUPS.items():
                split, seconds = one_run(a.router, fleets[name][: a.workers], s, folder)
                low, high = min(split) / s.per_worker, max(split) / s.per_worker
                shares[name].append((low, high))
                loads.append(load_average())
                print(f"run {run} {name}: split {split}, shares {low:.2f}–{high:.2f}, {seconds:.1f} s, "
                      f"load average {loads[-1]:.1f}", flush=True)  # fmt: skip
    finally:
        for fleet in fleets.values():
            for w in fleet:
                w.stop()
        for b in busy:
            b.kill()
            b.wait()
    print(f"\n{a.router}, {a.workers} workers, {a.busy} busy loops, "
          f"load average {min(loads):.1f}–{max(loads):.1f}\n")  # fmt: skip
    print("| set-up | runs | lowest share | highest share | runs outside 0.8–1.2 |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, runs in shares.items():
        outside = sum(low < 0.8 or high > 1.2 for low, high in runs)
        lowest, highest = min(low for low, _ in runs), max(high for _, high in runs)
        print(f"| {name} | {len(runs)} | {lowest:.2f} | {highest:.2f} | {outside} |")


if __name__ == "__main__":
    main()
