"""What one more simulated request costs a fleet in its steady state, counted in instructions (callgrind),
for this checkout and, with --base REV, for another commit built beside it: a measure that the shared,
noisy cores of this machine do not move (CPU seconds of the same run vary by a third from one run to the
next here; instruction counts by well under 1%).

The workload is sim_speed.py's (input 1–2,048, output 1–1,024 with early stops) over 4 replicas at
concurrency 128 (32 running on each, as the million-request fleet of sim_speed.py has), round_robin, with
a 100,000-token pool per replica so that the prefix cache is full, and evicting, after about 75 requests
a replica. Each tree runs N and 2N requests under `valgrind --tool=callgrind`; (I(2N) − I(N)) / N is the
cost of a request once the pool is full, start-up and the first fill left out. The end-of-run metrics
grow with N too and are part of it.

Needs valgrind and a compiled core (`make fast`; --base builds the other commit's in a git worktree).

    usage: python benchmarks/fleet_step_cost.py [--requests 2000] [--base REV] [--output FILE | -]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import cpu_model, publish, source_commit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# One run: sim_speed.config(n) over 4 replicas (kept here as text: it runs in a fresh interpreter under
# valgrind, against whichever tree's src/ is first on PYTHONPATH).
PROXY = """
import dataclasses, sys
sys.path.insert(0, {bench!r})
import sim_speed
from kvadmit import native
from kvadmit.fleet.driver import FleetSpec, simulate_fleet
from kvadmit.fleet.router import RouterSettings
assert native.status().startswith("compiled"), native.status()
cfg = dataclasses.replace(sim_speed.config({n}, True), max_concurrency=128)
cfg = dataclasses.replace(cfg, args=dataclasses.replace(cfg.args, max_total_tokens=100_000))
res = simulate_fleet(cfg, FleetSpec(4, RouterSettings("round_robin")))
print(res.sim.steps, res.sim.leapt, res.sim.metrics.total_output)
"""


def instructions(src: Path, n: int) -> tuple[int, str]:
    """Instructions callgrind counts for one run of n requests against the tree whose src/ is `src`, and
    what the run printed (steps, leapt steps, output tokens: the same in every tree, or the trees differ
    in more than speed)."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
            sys.executable, "-c", PROXY.format(bench=str(HERE), n=n)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"no instruction count from callgrind:\n{done.stderr[-2000:]}")
    return int(found.group(1)), done.stdout.strip()


def built_worktree(rev: str, folder: Path) -> Path:
    """`rev` checked out in `folder` with its compiled core built; returns its src/."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), rev], check=True,
                   capture_output=True)  # fmt: skip
    src = folder / "src"
    env = {**os.environ, "PYTHONPATH": str(src)}
    subprocess.run([sys.executable, "-m", "kvadmit.native_build", "--strict"], env=env, check=True)
    return src


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=2000, help="N: runs of N and 2N requests")
    ap.add_argument("--base", default=None, help="a commit to compare with (built in a git worktree)")
    ap.add_argument("--output", default=str(HERE / "fleet_step_cost.txt"))
    ns = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("fleet_step_cost.py needs valgrind (apt install valgrind)")
    trees = [(f"this checkout ({source_commit(str(ROOT / 'src'))})", ROOT / "src")]
    scratch = Path(tempfile.mkdtemp(prefix="fleet-step-cost-"))
    try:
        if ns.base:
            trees.insert(0, (f"--base {ns.base}", built_worktree(ns.base, scratch / "base")))
        n = ns.requests
        lines = [
            "# benchmarks/fleet_step_cost.py: a request's instructions in a fleet's steady state (callgrind)",
            f"machine: {cpu_model()} (instruction counts do not depend on the machine's load)",
            "command: " + " ".join(["python", "benchmarks/fleet_step_cost.py", *sys.argv[1:]]),
            "workload: sim_speed.py's over 4 replicas, concurrency 128, 100,000-token pools; runs of "
            f"{n:,} and {2 * n:,} requests",
            "",
            f"| tree | instructions, {n:,} requests | {2 * n:,} requests | a request in the steady state | "
            "steps, leapt, output tokens |",
            "| --- | ---: | ---: | ---: | --- |",
        ]
        per = []
        for name, src in trees:
            small, (large, printed) = instructions(src, n)[0], instructions(src, 2 * n)
            per.append((large - small) / n)
            lines.append(f"| {name} | {small:,} | {large:,} | {per[-1]:,.0f} | {printed} |")
        if len(per) == 2:
            lines += [
                "",
                f"this checkout against the base: {per[0] / per[1]:.3f}× fewer instructions a request",
            ]
    finally:
        if ns.base:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(scratch / "base")],
                           check=False, capture_output=True)  # fmt: skip
        shutil.rmtree(scratch, ignore_errors=True)
    publish(lines, ns.output)


if __name__ == "__main__":
    main()
