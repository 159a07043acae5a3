"""How fast `kvadmit doctor` reads a log, and in how much memory: 1,000,000 lines (issue #7's target:
under 10 s), and 100,000 for comparison (the memory should not grow with the log).

The log mixes what a busy SGLang server prints, in a busy server's proportions: Decode batch lines (55%),
Prefill batch lines (15%), HTTP access lines (25%), retractions (0.5%) and lines the doctor does not know
(4.5%), seven lines a second. Each size is diagnosed in a fresh process (the whole `diagnose`: read,
parse, collect, findings), which reports its wall and CPU time and its peak resident memory; a process
that only imports the doctor gives the baseline memory. What the reconstruction, replay check and
what-ifs add (issue 21's target: at most 10 s on an hour of log) is doctor_speed_whatif.py's to measure.

    usage: python benchmarks/doctor_speed.py [--lines N ...] [--output FILE | -]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import subprocess
import sys
import tempfile

from kvadmit.observe import loglines
from machine import cpu_model, publish

TARGET_S = 10.0

_CHILD = """
import json, resource, sys, time
from kvadmit.doctor.diagnose import Inputs, diagnose
path = sys.argv[1]
wall, cpu = time.perf_counter(), time.process_time()
d = diagnose(Inputs(log=path)) if path != "-" else None
out = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
       "max_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}
if d is not None:
    out.update(verdict=d.verdict, lines=d.inputs[0].lines, recognised=d.inputs[0].recognised)
print(json.dumps(out))
"""


def write_log(path: str, n: int, seed: int = 7) -> int:
    rng = random.Random(seed)
    start = dt.datetime(2026, 9, 13, 16, 0, 0)
    size = 0
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            stamp = loglines.timestamp_prefix(start + dt.timedelta(seconds=i // 7))
            r = rng.random()
            running, queued = 40 + i % 30, (i // 50) % 60
            if r < 0.55:
                line = loglines.DECODE.render(
                    running_req=running,
                    num_used_tokens=70_000 + i % 17_000,
                    token_usage=0.8 + (i % 20) / 100,
                    graph_label="cuda graph",
                    graph=True,
                    gen_throughput=1500 + i % 1000,
                    queue_req=queued,
                )
            elif r < 0.70:
                line = loglines.PREFILL.render(
                    new_seq=1 + i % 4,
                    new_token=351 * (1 + i % 4),
                    cached_token=36,
                    token_usage=0.85,
                    running_req=running,
                    queue_req=queued,
                    pending_token=350 * queued,
                    graph_label="cuda graph",
                    graph=True,
                    input_throughput=2000.0 + i % 500,
                )
            elif r < 0.95:
                line = f'INFO:     127.0.0.1:{40000 + i % 20000} - "POST /generate HTTP/1.1" 200 OK'
            elif r < 0.955:
                line = loglines.RETRACT.render(
                    num_retracted=1, new_tokens_gained=600 + i % 700, old_ratio=0.098, new_ratio=0.35
                )
            else:
                line = f"Receive: obj=GenerateReqInput(rid='{i:032x}', text='...', sampling_params={{...}})"
            text = stamp + line + "\n"
            size += len(text)
            f.write(text)
    return size


def child(path: str) -> dict[str, object]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, path], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "doctor_speed.txt"))
    ns = ap.parse_args()
    rows = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        baseline = child("-")
        for n in ns.lines:
            path = os.path.join(tmp, f"{n}.log")
            size = write_log(path, n)
            result = child(path)
            assert result["lines"] == n, result
            rows.append((n, size, result))
            os.remove(path)
    load_after = os.getloadavg()[0]
    base_mb = int(baseline["max_rss_kb"]) / 1024  # type: ignore[call-overload]
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        "# benchmarks/doctor_speed.py: kvadmit doctor reading a log (read, parse, collect, findings)",
        f"date: {now}",
        f"machine: {cpu_model()}, {os.cpu_count()} cores (one used); Python {platform.python_version()}",
        f"load average (1 min) before/after: {load_before:.1f} / {load_after:.1f} (shared machine: when it "
        "exceeds the core count, wall time exceeds CPU time by about that factor)",
        "log: Decode 55%, Prefill 15%, HTTP 25%, retraction 0.5%, unknown 4.5%; 7 lines a second",
        f"peak memory of a process that only imports the doctor: {base_mb:.1f} MiB",
        "",
        "| lines | MB | wall s | CPU s | lines/s (wall) | peak MiB | above import baseline MiB | verdict |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for n, size, r in rows:
        wall, cpu = float(r["wall_s"]), float(r["cpu_s"])  # type: ignore[arg-type]
        peak = int(r["max_rss_kb"]) / 1024  # type: ignore[call-overload]
        out.append(
            f"| {n:,} | {size / 1e6:.0f} | {wall:.2f} | {cpu:.2f} | {n / wall:,.0f} | {peak:.1f} | "
            f"{peak - base_mb:.1f} | {r['verdict']} |"
        )
    biggest = max(rows, key=lambda row: row[0])
    wall = float(biggest[2]["wall_s"])  # type: ignore[arg-type]
    cpu = float(biggest[2]["cpu_s"])  # type: ignore[arg-type]
    verdict = "meets it" if wall < TARGET_S else "misses it"
    out += [
        "",
        f"target: {biggest[0]:,} lines under {TARGET_S:.0f} s: {verdict} "
        f"({wall:.2f} s wall, {cpu:.2f} s of CPU)",
    ]
    publish(out, ns.output)


if __name__ == "__main__":
    main()
