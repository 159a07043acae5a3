"""How well `kvadmit simulate` predicts the real engine: the same requests, real and replayed.

1. Profile: a probe workload (not one of the four below: 48 requests, concurrency 24) runs through a
   fresh `kvadmit serve` that logs every step, once in each round of real runs (below). `kvadmit
   profile` times the real executor (the default model, the dtype `serve` picks) over a grid of decode
   batch sizes × context lengths and prefill sizes, plus the engine loop's own time per step, four
   times: before, between and after the three rounds, so the machine's slow and fast spells fall on the
   profile as on the runs. Then `kvadmit profile --average` writes their mean (the decode grid kept as
   measured: a table the simulator reads) with `--serving-log` the probes' logs: what each of their
   decode steps took beyond the executor's time for that batch (the serving stack: HTTP and streaming
   threads and the client on the same two cores), fitted as a + b × running requests and added to
   every decode step; and, from the probes' step traces (--trace-steps), what each of their prefill
   steps took beyond the executor's time for it, the median added to every prefill step (1–106 ms in
   today's probes, larger than a + b × its requests; our reading: a new request's HTTP handling runs
   beside its prefill; at 17:51 C's prefills, of requests queued since the start, ran 13–24% faster
   than the model).
2. Four workloads, not used above (the fourth, D, is B's first 24 requests at 3 req/s, past what
   this machine's engine keeps up with: how far TTFT there follows the machine's drift): each runs
   against a fresh `kvadmit serve` (the default model, the same scheduler flags the simulation gets,
   --decode-log-interval 1 so every step prints a line, --trace-requests and --trace-steps) under
   `kvadmit bench --output-details`. Then two replays:
   * by time: the bench file replayed by `kvadmit simulate --replay` (each request made when the client
     made it, sent when the run's --max-concurrency allows, with its real output length, seen by the
     scheduler --request-latency-ms after it was sent): the timing columns, and how far the decisions
     still agree when the simulated clock, not the server's, decides which step a request arrives in;
   * by step: the server's own trace replayed with `--replay-arrival step` (each request handed to the
     scheduler right after the step it followed on the server, with its prompt ids and output length):
     every decision line of both logs compared field by field — the scheduler's fidelity, apart from
     the clock — and, the batches being the same, each step's time on the server (--trace-steps)
     against the cost model's for it.
3. Compared per workload: decisions (Prefill batch, Decode batch and retraction lines without times and
   throughputs), median TTFT, mean TPOT and output throughput (% error), and retractions. Each workload
   runs three times on the real server (rounds A B C, A B C, A B C, so the machine's drift falls on
   all): the times are compared with the median of the three, their spread shows how far the real
   engine itself moves between runs of the same requests, and each run's prefill and decode steps
   against the cost model's times for the same batches show how fast the machine was in that run
   compared with the profiles; each run's mean TPOT against its by-step replay's is the model's time
   for the server's own schedule, apart from the schedule the simulated clock makes. The by-time
   replay runs again with every send time moved by up to ±10 ms (ten seeded draws): how far the
   median TTFT moves with where arrivals land in steps alone; and once with each of the four profiles
   alone (its executor times, the same serving-stack fit) in place of their mean: how far the
   prediction moves with when, in the half hour of the runs, the machine was profiled.

Before each measured run the server gets a few settling requests (a fresh process runs its first steps
many times slower) and its cache is flushed; the logs and traces are compared from the measured run on.

Run: python benchmarks/sim_fidelity.py [--out DIR]   (about 33 minutes on 2 shared cores)
     python benchmarks/sim_fidelity.py --kept DIR       (simulate again against DIR's real runs)
The repository keeps only the printed tables (benchmarks/sim_fidelity.txt); a run's raw files (logs,
traces, bench files, cost models: a few MB) stay in the --out DIR, outside the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import httpx

from kvadmit.costmodel.costmodel import CostModel
from kvadmit.costmodel.serving_overhead import PrefillOverhead, ServingOverhead, add_overhead
from kvadmit.observe.decisions import Decision, compare, decisions
from machine import cpu_model

KVADMIT = [sys.executable, "-m", "kvadmit.cli"]
ROUNDS = 3  # real runs of each workload
PROFILE = ["--batch-sizes", ",".join(map(str, range(1, 25))), "--context-lens", "64,256",
           "--prefill-lens", "32,128,384",
           "--prefill-requests", "1,3", "--repeats", "3"]  # fmt: skip
# Every step prints its line (prefill or decode), so the logs compare step for step.
LOG_EVERY_STEP = ["--decode-log-interval", "1"]
BENCH_COMMON = ["--backend", "sglang", "--dataset-name", "random-ids", "--tokenize-prompt", "--disable-tqdm"]
# No warm-up request in the measured runs (the settling run before them warms the server), so both logs
# begin with the measured requests; a warm-up would also differ (its length follows --extra-request-body
# on the server, bench_serving's 32 tokens in the simulation).
NO_WARMUP = ["--warmup-requests", "0"]
# The settling run before each measured one (see the module's docstring).
SETTLE = ["--num-prompts", "6", "--random-input-len", "96", "--random-output-len", "24",
          "--max-concurrency", "3", "--warmup-requests", "0", "--seed", "7"]  # fmt: skip
# The simulated server sees a request this long after the client sent it: the probe's median http_ms
# (its trace: from the HTTP request reaching the server to its hand-over to the engine thread, which
# grows with the streams the HTTP thread serves; the wait for the step then running is the simulation's
# own), or this when the probe's trace does not have it (an older kept run).
REQUEST_LATENCY_MS = 5.0


def request_latency_ms(out: Path) -> tuple[float, str]:
    if not (out / "probe.trace.jsonl").is_file():
        return REQUEST_LATENCY_MS, "assumed"
    http = [r["http_ms"] for r in measured_requests(PROBE, out) if "http_ms" in r]
    if not http:
        return REQUEST_LATENCY_MS, "assumed"
    return round(statistics.median(http), 1), f"the probe's median http_ms over {len(http)} requests"


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


# The probe runs at up to 24 requests, the profile grid's largest batch, so the serving stack's time is
# measured over the batch sizes the simulation reads, not drawn beyond them (a probe at 16 gave 1–2 ms
# per running request, and workload B, at 19–20 running, ran 5–17% faster than the model said).
PROBE = Workload(
    "probe", "48 × (32–128 + 24–48), ignore_eos, concurrency 24",
    ["--max-total-tokens", "8192"],
    ["--num-prompts", "48", "--random-input-len", "128", "--random-output-len", "48",
     "--random-range-ratio", "0.25", "--max-concurrency", "24", "--seed", "100"],
)  # fmt: skip
EARLY_STOPS = ["--random-input-len", "128", "--random-output-len", "96", "--random-range-ratio", "0.25",
               "--seed", "2", "--extra-request-body", stop_at_newline(96)]  # fmt: skip
WORKLOADS = [
    Workload(
        "A steady", "20 × (64–256 + 24–48), ignore_eos, concurrency 4",
        ["--max-total-tokens", "8192"],
        ["--num-prompts", "20", "--random-input-len", "256", "--random-output-len", "48",
         "--random-range-ratio", "0.25", "--max-concurrency", "4", "--seed", "1"],
    ),
    Workload(
        "B early stops", "48 × (32–128 + ask 96, stop at newline), Poisson 0.4 req/s",
        ["--max-total-tokens", "8192"],
        # Each request's TTFT holds the rest of the step it arrived in (up to 300 ms here), and where each
        # lands differs between the server and the simulation: 24 of these requests at 1 req/s, their
        # sends moved by up to ±10 ms, gave simulated median TTFTs of 553–643 ms (16%; sim_fidelity.txt,
        # 12:28). 48 narrow that, but at 1 req/s they reach 40 running, beyond the profile's grid of 24
        # (TPOT −19.7%, 13:21); at 0.4 req/s the simulation of that run's 48 peaks at 20 running, its
        # sends-moved range 9% wide (the real runs since: 16–25 running at the peak, the range 5–9%).
        [*EARLY_STOPS, "--num-prompts", "48", "--request-rate", "0.4"],
    ),
    Workload(
        "C small pool", "16 × (28–32 + 72–80), no ignore_eos, all at once, 600-token pool",
        ["--max-total-tokens", "600"],
        ["--num-prompts", "16", "--random-input-len", "32", "--random-output-len", "80",
         "--random-range-ratio", "0.9", "--disable-ignore-eos", "--seed", "3"],
    ),
    # B's first 24 requests at 3 req/s (B's rate before): about 240 prompt tokens a second of an executor
    # that prefills 230–310 here, so prefill alone takes most of the engine; each slower step lets more
    # requests arrive, the next prefill batch grows (4–5 requests, 1.6–1.8 s), and TTFT multiplies the
    # machine's drift: the real runs' own TTFT spread here was 10–72% (sim_fidelity.txt's earlier B rows).
    Workload(
        "D past capacity", "B's first 24 requests, Poisson 3 req/s: prefill alone most of the engine's time",
        ["--max-total-tokens", "8192"],
        [*EARLY_STOPS, "--num-prompts", "24", "--request-rate", "3"],
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
    trace = out / f"{slug(w.name)}.trace.jsonl"
    with open(server_err, "w", encoding="utf-8") as err:
        proc = subprocess.Popen([*KVADMIT, "serve", "--port", str(port), "--log-file", str(server_log),
                                 "--trace-requests", str(trace), "--trace-steps", str(steps_file(w, out)),
                                 *LOG_EVERY_STEP, *w.server],
                                stdout=err, stderr=err)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        bench = [*KVADMIT, "bench", "--base-url", url, *BENCH_COMMON, "--ready-check-timeout-sec", "300"]
        run([*bench, *SETTLE], out / "bench.stderr")
        httpx.post(f"{url}/flush_cache", timeout=30)
        # Every settling request has ended (and is in the trace) before the flush: the measured run's
        # requests are the ones received after them.
        settled = len(trace.read_text(encoding="utf-8").splitlines())
        (out / f"{slug(w.name)}.settled").write_text(str(settled), encoding="utf-8")
        details = out / f"{slug(w.name)}.bench.jsonl"
        details.unlink(missing_ok=True)
        summary = run([*bench, *w.bench, *NO_WARMUP, "--output-file", str(details), "--output-details"],
                      out / "bench.stderr")  # fmt: skip
        (out / f"{slug(w.name)}.bench.txt").write_text(summary, encoding="utf-8")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return kept_run(w, out)


def steps_file(w: Workload, out: Path, tag: str = "served") -> Path:
    """A run's --trace-steps file: the server's, or its by-step replay's."""
    return out / f"{slug(w.name)}.{tag}-steps.jsonl"


def kept_run(w: Workload, out: Path) -> tuple[Path, list[str]]:
    """The files a real run left in `out`: (the bench details file, the measured run's log lines)."""
    # The log file is written in blocks, stderr line by line with the HTTP access lines between: the
    # measured run is what follows the flush.
    lines = (out / f"{slug(w.name)}.server.stderr").read_text(encoding="utf-8").splitlines()
    flushed = max(i for i, line in enumerate(lines) if "POST /flush_cache" in line)
    return out / f"{slug(w.name)}.bench.jsonl", lines[flushed + 1 :]


def measured_requests(w: Workload, out: Path) -> list[dict]:
    """The rows of the server's request trace for the measured run (received after the settling ones)."""
    settled = int((out / f"{slug(w.name)}.settled").read_text(encoding="utf-8"))
    return [r for r in jsonl(out / f"{slug(w.name)}.trace.jsonl") if r["seq"] >= settled]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def measured_trace(w: Workload, out: Path) -> Path:
    """The server's trace cut to the measured run."""
    return write_jsonl(out / f"{slug(w.name)}.trace.measured.jsonl", measured_requests(w, out))


def measured_steps(w: Workload, out: Path) -> Path:
    """The server's --trace-steps cut to the measured run (the steps after the settling run's)."""
    base = min(r["arrival_step"] for r in measured_requests(w, out))
    rows = [r for r in jsonl(steps_file(w, out)) if r["step"] > base]
    return write_jsonl(out / f"{slug(w.name)}.served-steps.measured.jsonl", rows)


def profile_executor(cost: Path, out: Path) -> None:
    """`kvadmit profile` of the bare executor (the serving stack is fitted once, to the mean)."""
    run([*KVADMIT, "profile", *PROFILE, "-o", str(cost)], out / "profile.stderr")


def step_replay(w: Workload, trace: Path, cost: Path, out: Path) -> tuple[dict[str, float], list[str]]:
    """The measured run's trace replayed step by step: (its summary numbers, the simulated log's lines).
    Its TTFT is not the run's (each request reaches it at a step's end, after no wait), its TPOT is: the
    cost model's, for the server's own schedule."""
    log = out / f"{slug(w.name)}.sim-step.log"
    stdout = run([*KVADMIT, "simulate", "--replay", str(trace), "--replay-arrival", "step", "--cost-model",
                  str(cost), "--context-length", "8192", "--log-file", str(log), "--trace-steps",
                  str(steps_file(w, out, "sim")), *LOG_EVERY_STEP, *w.server],
                 out / "sim.stderr")  # fmt: skip
    return summary_numbers(stdout), log.read_text(encoding="utf-8").splitlines()


def by_time(w: Workload, details: Path, cost: Path, latency_ms: float) -> list[str]:
    """The `simulate` command that replays a bench file by its send times."""
    return [*KVADMIT, "simulate", "--replay", str(details), "--cost-model", str(cost), "--context-length",
            "8192", "--request-latency-ms", str(latency_ms), *NO_WARMUP, *w.server]  # fmt: skip


def simulated_run(
    w: Workload, details: Path, cost: Path, out: Path, tag: str, latency_ms: float
) -> tuple[dict, list[str]]:
    log = out / f"{slug(w.name)}.sim-{tag}.log"
    stdout = run([*by_time(w, details, cost, latency_ms), "--log-file", str(log), *LOG_EVERY_STEP],
                 out / "sim.stderr")  # fmt: skip
    return summary_numbers(stdout), log.read_text(encoding="utf-8").splitlines()


# The simulation's own sensitivity to where arrivals land in steps: the same replay with every request's
# send time moved by up to ±JITTER_S, PHASE_DRAWS times (seeded).
JITTER_S, PHASE_DRAWS = 0.010, 10


def phase_range(w: Workload, details: Path, cost: Path, out: Path, latency_ms: float) -> tuple[float, float]:
    """The smallest and largest simulated median TTFT over PHASE_DRAWS replays of `details` whose send
    times each moved by up to ±JITTER_S: how far a median TTFT moves with the phase of arrivals alone."""
    rec = json.loads(details.read_text(encoding="utf-8"))
    key = "arrival_times" if rec.get("arrival_times") else "start_times"
    first = rec[key][0]
    medians = []
    for draw in range(PHASE_DRAWS):
        rng = random.Random(draw)
        moved = out / f"{slug(w.name)}.phase-{draw}.json"
        times = [first + max(0.0, t - first + rng.uniform(-JITTER_S, JITTER_S)) for t in rec[key]]
        moved.write_text(json.dumps({**rec, key: times}), encoding="utf-8")
        stdout = run([*by_time(w, moved, cost, latency_ms), "--quiet"], out / "sim.stderr")
        medians.append(summary_numbers(stdout)["ttft"])
    return min(medians), max(medians)


def alone_models(profiles: list[Path], cost: CostModel, out: Path) -> list[Path]:
    """Each profile alone as the simulation's cost model: its executor times plus the serving stack the
    averaged model carries (fitted once, against the mean), written beside it."""
    fit = cost.meta["fit"]
    base, per_request = (fit.get(f"serving_overhead_{k}", 0.0) for k in ("base_ms", "per_request_ms"))
    stack = ServingOverhead(base, per_request, 0, (0, 0), 0.0)  # only its a and b are read
    prefill = None
    if "serving_prefill_overhead_ms" in fit:  # (a kept run from before has none)
        prefill = (PrefillOverhead(fit["serving_prefill_overhead_ms"], 0), "the averaged model's fit")
    alone = []
    for p in profiles:
        q = out / f"{p.stem}.alone.json"
        add_overhead(CostModel.from_file(str(p)), stack, "the averaged model's fit", prefill).write(str(q))
        alone.append(q)
    return alone


def profile_band(w: Workload, details: Path, alone: list[Path], real: dict[str, float], latency_ms: float,
                 out: Path) -> str:  # fmt: skip
    """The by-time replay with each profile alone (alone_models): the lowest–highest TTFT / TPOT /
    throughput against the real median. How far the prediction moves with when the machine was profiled,
    the same executor minutes apart; a real median outside it ran faster or slower than every profile."""
    sims = [summary_numbers(run([*by_time(w, details, m, latency_ms), "--quiet"], out / "sim.stderr"))
            for m in alone]  # fmt: skip
    cells = []
    for key in ("ttft", "tpot", "tput"):
        lo, hi = min(s[key] for s in sims), max(s[key] for s in sims)
        inside = "" if lo <= real[key] <= hi else " (outside)"
        cells.append(f"{pct(lo, real[key])} to {pct(hi, real[key])}{inside}")
    return " / ".join(cells)


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


def retracted(found: list[Decision]) -> int:
    return sum(int(v[0]) for kind, v in found if kind == "retract")  # type: ignore[call-overload]


def spread(values: list[float]) -> str:
    if len(values) < 2:
        return "one run"
    return f"{100 * (max(values) - min(values)) / statistics.median(values):.1f}%"


def jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x]


def steps_vs_model(w: Workload, out: Path) -> str:
    """How much slower (+) the run's steps were than the cost model says for the very same batches: the
    server's --trace-steps against its by-step replay's (whose decisions are the server's, so step k is
    the same batch on both sides), the sum of each kind's step times: prefill / decode. The machine's
    speed in that run against the profiles', and where a timing cell's error comes from."""
    served_file, sim_file = steps_file(w, out), steps_file(w, out, "sim")
    if not served_file.is_file() or not sim_file.is_file():
        return "n/a"  # a kept run from before serve wrote step traces
    served = jsonl(measured_steps(w, out))
    sim = jsonl(sim_file)
    same = [(a["kind"], a["batch_size"]) for a in served] == [(b["kind"], b["batch_size"]) for b in sim]
    if not same:
        return "steps differ"
    cells = []
    for kind in ("prefill", "decode"):
        real = sum(a["seconds"] for a in served if a["kind"] == kind)
        model = sum(b["seconds"] for b in sim if b["kind"] == kind)
        cells.append(f"{100 * (real / model - 1):+.0f}%" if model > 0 else "none")
    return " / ".join(cells)


def in_round(w: Workload, rnd: int) -> Workload:
    """The workload as run in round `rnd` (its files named apart)."""
    return w if rnd == 1 else replace(w, name=f"{w.name} {rnd}")


def pct(sim: float, real: float) -> str:
    return f"{100 * (sim - real) / real:+.1f}%" if real else "n/a"


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


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

    # Each workload runs ROUNDS times on the real server, the rounds in turn (A B C, A B C, A B C), so the
    # machine's drift falls on all: the simulation is compared with the median of the runs (a run that a
    # slow spell of the machine caught moves it little), and the runs' spread shows how far the real
    # engine moves from one run to the next. The executor is profiled before, between and after the
    # rounds, and the simulation reads the mean of those profiles: profiled once, minutes away from the
    # runs, a shared machine's slow or fast spell is taken for its speed (two profiles a minute apart
    # differed by 8–12% at every batch size here). The probe runs in every round too, and the serving
    # stack is fitted over all the probes' steps against that mean: a single probe once ran in a slow
    # spell, its steps 20% slower than every profile, and the stack came out at 21 ms a step, not 3-6.
    runs: dict[tuple[str, int], tuple[Path, list[str]]] = {}
    profiles = [out / f"profile-{rnd}.json" for rnd in range(1, ROUNDS + 2)]
    serving_logs: list[Path] = []
    serving_steps: list[Path] = []
    for rnd in range(1, ROUNDS + 1):
        if not ns.kept:
            profile_executor(profiles[rnd - 1], out)
            loads.append(load())
            probe = in_round(PROBE, rnd)
            _, probe_log = real_run(probe, out)
            serving_logs.append(out / f"{slug(probe.name)}.serving.log")
            serving_logs[-1].write_text("\n".join(probe_log) + "\n", encoding="utf-8")
            serving_steps.append(measured_steps(probe, out))
        for w in WORKLOADS:
            ww = in_round(w, rnd)
            if ns.kept and not (out / f"{slug(ww.name)}.bench.jsonl").is_file():
                continue  # kept from fewer rounds
            runs[(w.name, rnd)] = real_or_kept(ww, out)
            loads.append(load())
    if not ns.kept:
        profile_executor(profiles[-1], out)  # after the last round
        loads.append(load())
        mean = [*KVADMIT, "profile", "--average", *map(str, profiles), "--serving-log",
                *map(str, serving_logs), "--serving-steps", *map(str, serving_steps),
                "-o", str(cost)]  # fmt: skip
        profile_text = run(mean, out / "profile.stderr")
        fit_line = "; ".join(
            x for x in profile_text.splitlines() if x.startswith(("fit error", "averaged", "serving stack"))
        )
    latency_ms, latency_source = request_latency_ms(out)
    cost_model = CostModel.from_file(str(cost))
    dtype = next((n.split("dtype ")[-1] for n in cost_model.meta["notes"] if "dtype" in n), "?")
    loop_ms = cost_model.meta["fit"].get("loop_overhead_ms", 0.0)
    alone = alone_models([p for p in profiles if p.is_file()], cost_model, out)

    rows, notes = [], []
    for w in WORKLOADS:
        done = [r for r in range(1, ROUNDS + 1) if (w.name, r) in runs]
        if not done:
            continue  # a kept run from before this workload was in the benchmark
        details, real_log = runs[(w.name, 1)]
        measured = [bench_numbers(runs[(w.name, r)][0]) for r in done]
        real = {k: statistics.median(x[k] for x in measured) for k in measured[0]}
        real_d = decisions(real_log)
        sim, sim_log = simulated_run(w, details, cost, out, "time", latency_ms)
        sim_d = decisions(sim_log)
        step_cells, step_times, step_tpots = [], [], []
        for r, real_r in zip(done, measured, strict=True):
            wr = in_round(w, r)
            trace = measured_trace(wr, out)
            rd = decisions(runs[(w.name, r)][1])
            step_numbers, step_log = step_replay(wr, trace, cost, out)
            by_step = compare(rd, decisions(step_log))
            step_cells.append(by_step.describe().removesuffix(" identical"))
            step_times.append(steps_vs_model(wr, out))
            tpot = step_numbers["tpot"]
            step_tpots.append(f"{real_r['tpot']:.0f} / {tpot:.0f} ({pct(tpot, real_r['tpot'])})")
            if not by_step.identical:
                notes.append(f"  {w.name} run {r} by step: {by_step.describe()}")
        step_d = decisions((out / f"{slug(w.name)}.sim-step.log").read_text(encoding="utf-8").splitlines())
        by_time = compare(real_d, sim_d)
        line = [w.name, "; ".join(step_cells), by_time.describe().split(", then")[0],
                f"{retracted(real_d)} / {retracted(step_d)} / {retracted(sim_d)}"]  # fmt: skip
        for key, fmt in (("ttft", "{:,.0f}"), ("tpot", "{:.1f}"), ("tput", "{:.1f}")):
            line.append(f"{fmt.format(real[key])} / {fmt.format(sim[key])} ({pct(sim[key], real[key])})")
        lo, hi = phase_range(w, details, cost, out, latency_ms)
        line.append(f"{lo:,.0f}–{hi:,.0f} ({pct(lo, real['ttft'])} to {pct(hi, real['ttft'])})")
        line.append(" / ".join(spread([x[k] for x in measured]) for k in ("ttft", "tpot", "tput")))
        line.append("; ".join(step_times))
        line.append("; ".join(step_tpots))
        line.append(profile_band(w, details, alone, real, latency_ms, out) if alone else "n/a")
        rows.append(line)
        notes.append(f"{w.name}: {w.describe}; decision lines: {len(real_d)} real, {len(step_d)} by step, "
                     f"{len(sim_d)} by time (run 1)")  # fmt: skip
        if not by_time.identical:
            notes.append(f"  by time: {by_time.describe()}")

    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# sim_fidelity: {when}; {cpu_model()}, {os.cpu_count()} cores; "
          f"load average (1, 5, 15 min) {' → '.join(loads)}")  # fmt: skip
    print(f"# OMP_NUM_THREADS={ns.torch_threads}; dtype {dtype}; profile: {' '.join(PROFILE)}; {fit_line}; "
          f"engine loop {loop_ms:.2f} ms per step")  # fmt: skip
    print("# decisions: Prefill batch, Decode batch and retraction lines (every step logs one) without times "
          "and throughputs, server vs simulation; by step = the server's --trace-requests replayed with "
          "--replay-arrival step; by time = the bench file replayed with each request's send time, "
          f"seen by the scheduler {latency_ms:g} ms later ({latency_source})")  # fmt: skip
    print("# timing cells: the median of the real runs / simulated by time, replaying run 1's requests "
          "(error); decisions by step: each real run against its own step replay (lines identical); by time "
          "and retractions: run 1; sends moved: the by-time replay again with every send time moved by up "
          "to the amount shown, smallest–largest median TTFT (against the real median): how far the "
          "phase of arrivals alone moves it; spread: (largest − smallest) / median of the real runs; "
          "steps vs model: "
          "each real run's step times (serve --trace-steps), summed over its prefill and its decode steps, "
          "against the cost model's for the same batches (its by-step replay's --trace-steps), "
          "+ slower; the server's own schedule: each real run's mean TPOT against its by-step replay's "
          "(the same batches, in the same order, at the cost model's times); each profile alone: the by-time "
          "replay with one profile's executor times (plus the same serving-stack fit) instead of their mean, "
          "once for each: how far the prediction moves with when the machine was profiled")  # fmt: skip
    head = ["workload", "decisions by step (runs 1; 2; 3)", "decisions by time", "requests retracted real / "
            "step / time", "TTFT p50 ms", "TPOT mean ms", "out tok/s",
            f"sim TTFT p50, sends moved ±{1000 * JITTER_S:g} ms ({PHASE_DRAWS} draws)",
            "real runs' spread: TTFT / TPOT / tok/s",
            "served steps vs model: prefill / decode (runs 1; 2; 3)",
            "TPOT mean ms, the server's own schedule: real / by step (runs 1; 2; 3)",
            f"by time with each profile alone ({len(alone)}): TTFT / TPOT / tok/s, lowest to highest "
            "against the real median"]  # fmt: skip
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
