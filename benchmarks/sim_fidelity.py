"""How well `kvadmit simulate` predicts the real engine: the same requests, real and replayed.

1. Profile: `kvadmit profile` times the real executor (the default model) over a quick grid and writes a
   cost model. A probe workload (not one of the three below) then runs through the real server and is
   replayed with that cost model; the difference of their mean TPOT is the per-step overhead of the
   serving stack that the executor's grid does not see (scheduler, engine loop, HTTP and streaming
   threads on the same cores). It is added to the decode and prefill step as a second cost model.
2. Three workloads, not used above: each runs against a fresh `kvadmit serve` (the default model, the
   same scheduler flags the simulation gets) under `kvadmit bench --output-details`, and the file that
   writes is replayed by `kvadmit simulate --replay` with both cost models (each request made when the
   client made it, sent when the run's --max-concurrency allows, with its real output length, seen by
   the scheduler --request-latency-ms after it was sent).
3. Compared per workload: the admission decisions (the `Prefill batch` lines' #new-seq, #running-req
   and #queue-req, and the retraction lines, of the server's log against the simulated log), median TTFT,
   mean TPOT and output throughput (% error), and retractions.

Before each measured run the server gets a few settling requests (a fresh process runs its first steps
many times slower) and its cache is flushed; the logs are compared from the measured run's warm-up on.

Run: python benchmarks/sim_fidelity.py [--out DIR]   (about 5 minutes on 2 shared cores)
     python benchmarks/sim_fidelity.py --kept DIR       (simulate again against DIR's real runs)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import httpx

from machine import cpu_model

KVADMIT = [sys.executable, "-m", "kvadmit.cli"]
PROFILE = ["--batch-sizes", "1,4,12", "--context-lens", "64,256", "--prefill-lens", "32,128,384",
           "--prefill-requests", "1,3", "--repeats", "7"]  # fmt: skip
BENCH_COMMON = ["--backend", "sglang", "--dataset-name", "random-ids", "--tokenize-prompt", "--disable-tqdm"]
# The simulated server sees a request this long after the client sent it (HTTP, parsing, the engine's
# queue; assumed, not measured). What matters for the decisions is only that it is above 0: a request
# sent as a step ends then waits for the next step, as on the real server, where the engine loop starts
# the next decode step before the client's next request has arrived.
REQUEST_LATENCY_MS = "5"
SETTLE = ["--num-prompts", "6", "--random-input-len", "96", "--random-output-len", "24",
          "--max-concurrency", "3", "--warmup-requests", "0", "--seed", "7"]  # fmt: skip


def stop_at_newline(max_new_tokens: int) -> str:
    """sampling_params that ask for `max_new_tokens` but stop at the first newline: early stops."""
    params = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": False, "stop": ["\n"]}
    return json.dumps({"sampling_params": params})


@dataclass(frozen=True)
class Workload:
    name: str
    describe: str
    server: list[str]  # scheduler flags, given to both `serve` and `simulate`
    bench: list[str]


PROBE = Workload(
    "probe", "16 × (64–128 + 32), ignore_eos, concurrency 6",
    ["--max-total-tokens", "8192"],
    ["--num-prompts", "16", "--random-input-len", "128", "--random-output-len", "32",
     "--random-range-ratio", "0.5", "--max-concurrency", "6", "--seed", "100"],
)  # fmt: skip
WORKLOADS = [
    Workload(
        "A steady", "20 × (64–256 + 24–48), ignore_eos, concurrency 4",
        ["--max-total-tokens", "8192"],
        ["--num-prompts", "20", "--random-input-len", "256", "--random-output-len", "48",
         "--random-range-ratio", "0.25", "--max-concurrency", "4", "--seed", "1"],
    ),
    Workload(
        "B early stops", "24 × (32–128 + ask 96, stop at newline), Poisson 3 req/s",
        ["--max-total-tokens", "8192"],
        ["--num-prompts", "24", "--random-input-len", "128", "--random-output-len", "96",
         "--random-range-ratio", "0.25", "--request-rate", "3", "--seed", "2",
         "--extra-request-body", stop_at_newline(96)],
    ),
    Workload(
        "C small pool", "16 × (28–32 + 72–80), no ignore_eos, all at once, 600-token pool",
        ["--max-total-tokens", "600"],
        ["--num-prompts", "16", "--random-input-len", "32", "--random-output-len", "80",
         "--random-range-ratio", "0.9", "--disable-ignore-eos", "--seed", "3"],
    ),
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(cmd: list[str], log: Path) -> str:
    """Run a kvadmit command; its stdout (stderr goes to `log`)."""
    with open(log, "a", encoding="utf-8") as err:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}; see {log}")
    return done.stdout


def real_run(w: Workload, out: Path) -> tuple[Path, list[str]]:
    """Serve, settle, flush, bench; (the bench details file, the server's log lines of the measured run)."""
    port = free_port()
    server_log = out / f"{slug(w.name)}.server.log"
    server_log.unlink(missing_ok=True)
    server_err = out / f"{slug(w.name)}.server.stderr"
    with open(server_err, "w", encoding="utf-8") as err:
        proc = subprocess.Popen([*KVADMIT, "serve", "--port", str(port), "--log-file", str(server_log),
                                 *w.server], stdout=err, stderr=err)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        bench = [*KVADMIT, "bench", "--base-url", url, *BENCH_COMMON, "--ready-check-timeout-sec", "300"]
        run([*bench, *SETTLE], out / "bench.stderr")
        httpx.post(f"{url}/flush_cache", timeout=30)
        details = out / f"{slug(w.name)}.bench.jsonl"
        details.unlink(missing_ok=True)
        summary = run([*bench, *w.bench, "--output-file", str(details), "--output-details"],
                      out / "bench.stderr")  # fmt: skip
        (out / f"{slug(w.name)}.bench.txt").write_text(summary, encoding="utf-8")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return kept_run(w, out)


def kept_run(w: Workload, out: Path) -> tuple[Path, list[str]]:
    """The files a real run left in `out`: (the bench details file, the measured run's log lines)."""
    # The log file is written in blocks, stderr line by line with the HTTP access lines between: the
    # measured run is what follows the flush.
    lines = (out / f"{slug(w.name)}.server.stderr").read_text(encoding="utf-8").splitlines()
    flushed = max(i for i, line in enumerate(lines) if "POST /flush_cache" in line)
    return out / f"{slug(w.name)}.bench.jsonl", lines[flushed + 1 :]


def simulated_run(w: Workload, details: Path, cost: Path, out: Path, tag: str) -> tuple[dict, list[str]]:
    log = out / f"{slug(w.name)}.sim-{tag}.log"
    cmd = [*KVADMIT, "simulate", "--replay", str(details), "--cost-model", str(cost),
           "--context-length", "8192", "--request-latency-ms", REQUEST_LATENCY_MS,
           "--log-file", str(log), *w.server]  # fmt: skip
    stdout = run(cmd, out / "sim.stderr")
    return summary_numbers(stdout), log.read_text(encoding="utf-8").splitlines()


def summary_numbers(text: str) -> dict[str, float]:
    labels = {"Median TTFT (ms)": "ttft", "Mean TPOT (ms)": "tpot", "Output token throughput (tok/s)": "tput"}
    found = {}
    for line in text.splitlines():
        label, _, value = line.partition(":")
        if label.strip() in labels:
            found[labels[label.strip()]] = float(value)
    return found


def bench_numbers(details: Path) -> dict[str, float]:
    rec = json.loads(details.read_text(encoding="utf-8"))
    return {"ttft": rec["median_ttft_ms"], "tpot": rec["mean_tpot_ms"], "tput": rec["output_throughput"]}


PREFILL = re.compile(r"Prefill batch, #new-seq: (\d+), .*#running-req: (\d+), #queue-req: (\d+)")
RETRACT = re.compile(r"Retract requests\. #retracted_reqs: (\d+)")


def decisions(lines: list[str]) -> tuple[list[tuple[int, ...]], int, int]:
    """(each Prefill batch's (#new-seq, #running-req, #queue-req), retraction lines, requests retracted)."""
    prefills, events, retracted = [], 0, 0
    for line in lines:
        if m := PREFILL.search(line):
            prefills.append(tuple(int(g) for g in m.groups()))
        elif m := RETRACT.search(line):
            events += 1
            retracted += int(m.group(1))
    return prefills, events, retracted


def compare(real: list[tuple[int, ...]], sim: list[tuple[int, ...]]) -> str:
    same = sum(1 for a, b in zip(real, sim, strict=False) if a == b)
    first = next((i for i, (a, b) in enumerate(zip(real, sim, strict=False)) if a != b), None)
    if first is None and len(real) == len(sim):
        return f"all {len(real)} identical"
    where = f"first differs at #{first + 1}" if first is not None else "one is longer"
    return f"{same}/{max(len(real), len(sim))} identical ({where})"


def pct(sim: float, real: float) -> str:
    return f"{100 * (sim - real) / real:+.1f}%" if real else "n/a"


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def with_overhead(cost: Path, overhead_ms: float, target: Path) -> None:
    model = json.loads(cost.read_text(encoding="utf-8"))
    model["decode"]["base_ms"] += overhead_ms
    model["prefill"]["base_ms"] += overhead_ms
    model.setdefault("notes", []).append(
        f"+ {overhead_ms:.2f} ms per step: the serving stack's overhead, measured on the probe workload"
    )
    target.write_text(json.dumps(model, indent=2), encoding="utf-8")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="keep the logs, bench files and cost models here (default: a temp dir)")
    ap.add_argument(
        "--torch-threads",
        default="1",
        help="OMP_NUM_THREADS for the profile and the servers (default 1: two intra-op threads "
        "on two cores shared with the HTTP threads, the client and other jobs stall each other)",
    )
    ap.add_argument(
        "--kept",
        metavar="DIR",
        help="no real runs: simulate again against the profile and real runs an earlier --out DIR kept",
    )
    ns = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = ns.torch_threads
    out = Path(ns.kept or ns.out or tempfile.mkdtemp(prefix="sim-fidelity-"))
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    loads = [load()]
    real_or_kept = kept_run if ns.kept else real_run

    cost = out / "profile.json"
    if ns.kept:
        fit = json.loads(cost.read_text(encoding="utf-8"))["fit"]
        fit_line = (f"fit error: decode {fit['decode_mean_abs_error_pct']}% mean (kept from {out}; "
                    "the load averages below are of this re-simulation, not of the real runs)")  # fmt: skip
    else:
        profile_text = run([*KVADMIT, "profile", *PROFILE, "-o", str(cost)], out / "profile.stderr")
        fit_line = next((x for x in profile_text.splitlines() if x.startswith("fit error")), "")
    details, _ = real_or_kept(PROBE, out)
    probe_real = bench_numbers(details)
    probe_sim, _ = simulated_run(PROBE, details, cost, out, "profile")
    overhead = probe_real["tpot"] - probe_sim["tpot"]
    cost_oh = out / "profile+overhead.json"
    with_overhead(cost, overhead, cost_oh)
    loads.append(load())

    rows, notes = [], []
    for w in WORKLOADS:
        details, real_log = real_or_kept(w, out)
        real = bench_numbers(details)
        loads.append(load())
        real_p, real_events, real_retracted = decisions(real_log)
        line = [w.name]
        for tag, model in (("profile", cost), ("overhead", cost_oh)):
            sim, sim_log = simulated_run(w, details, model, out, tag)
            sim_p, sim_events, sim_retracted = decisions(sim_log)
            if tag == "profile":
                line += [compare(real_p, sim_p), f"{real_retracted} / {sim_retracted}"]
                notes.append(f"{w.name}: {w.describe}; {len(real_p)} real and {len(sim_p)} simulated "
                             f"Prefill batch lines; retraction lines {real_events} real, {sim_events} "
                             "simulated")  # fmt: skip
                if real_p != sim_p:
                    notes.append(f"  real: {real_p}\n  sim:  {sim_p}")
            for key, fmt in (("ttft", "{:,.0f}"), ("tpot", "{:.1f}"), ("tput", "{:.1f}")):
                line.append(f"{fmt.format(real[key])} / {fmt.format(sim[key])} ({pct(sim[key], real[key])})")
        rows.append(line)

    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# sim_fidelity: {when}; {cpu_model()}, {os.cpu_count()} cores; "
          f"load average (1, 5, 15 min) {' → '.join(loads)}")  # fmt: skip
    print(f"# OMP_NUM_THREADS={ns.torch_threads}; profile: {' '.join(PROFILE)}; {fit_line}")
    print(f"# probe ({PROBE.describe}): mean TPOT real {probe_real['tpot']:.1f} ms, simulated "
          f"{probe_sim['tpot']:.1f} ms → per-step overhead {overhead:.1f} ms")  # fmt: skip
    print("# each cell: real / simulated (error); 'sim' = the executor profile alone, "
          "'sim+oh' = with the probe's per-step overhead; simulated request latency "
          f"{REQUEST_LATENCY_MS} ms")  # fmt: skip
    head = ["workload", "Prefill decisions (#new-seq, #running, #queue)", "requests retracted real / sim",
            "TTFT p50 ms (sim)", "TPOT mean ms (sim)", "out tok/s (sim)",
            "TTFT p50 ms (sim+oh)", "TPOT mean ms (sim+oh)", "out tok/s (sim+oh)"]  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for line in rows:
        print("| " + " | ".join(line) + " |")
    print()
    for n in notes:
        print(n)
    print(f"\n# {time.monotonic() - began:.0f} s in all; files in {out}")
    if not ns.out and not ns.kept:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
