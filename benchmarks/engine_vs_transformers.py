"""kvadmit's engine against transformers' `generate` on SmolLM2-135M-Instruct, same prompts, one run.

1. single-stream decode tokens/s;  2. 64 requests of mixed lengths at concurrency 16: kvadmit's continuous
batching (all queued at once, at most 16 running: --max-running-requests 16; an 8,192-token pool) vs
transformers `generate` in padded static batches of 16;  3. decode step time at batch 1 against the
memory-bandwidth bound (bytes of weights a step reads ÷ measured copy bandwidth);  4. peak resident memory
of each, measured in a child process per side that loads one model and runs the first 16 requests (the
peak is at full concurrency).

The machine may be shared, so both sides run alternately, `--rounds` times, and each side's best round
counts (the round least disturbed by other processes); the load average is printed with the results. By
default torch gets one thread per core not already busy (cores − the 1-minute load average, at least 1):
an OpenMP thread that shares its core with another process stalls every parallel region. On this 2-core
machine with other processes busy (load average 3–4), 2 threads decoded a single stream at 1–2 tok/s where
1 thread made 13 (transformers: 1.3 against 8.2).

    usage: python benchmarks/engine_vs_transformers.py [--dtype bfloat16|float32] [--threads N]
                                                       [--rounds R] [--output FILE | -]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import random
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from machine import cpu_model

GREEDY = {"temperature": 0.0, "ignore_eos": True}
Workload = list[tuple[list[int], int]]


def copy_bandwidth() -> float:
    """Bytes per second of a large tensor copy (read + write counted once each)."""
    src = torch.empty(64 * 2**20, dtype=torch.uint8)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * src.numel() / best


def workload(n: int, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    return [
        ([rng.randrange(100, 40000) for _ in range(rng.randint(16, 256))], rng.randint(16, 128))
        for _ in range(n)
    ]


def load(side: str, dtype: str, concurrency: int) -> Any:
    from kvadmit.model.default import ensure_default_model

    folder = str(ensure_default_model())
    if side == "kvadmit":
        import kvadmit

        return kvadmit.Engine(folder, dtype=dtype, max_total_tokens=8192, max_running_requests=concurrency)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()


def ours_single(engine: Any, prompt: list[int], new: int) -> None:
    engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": new})


def ref_single(ref: Any, prompt: list[int], new: int) -> None:
    with torch.no_grad():
        ref.generate(torch.tensor([prompt]), max_new_tokens=new, min_new_tokens=new, do_sample=False)


def ours_batch(engine: Any, reqs: Workload, concurrency: int) -> None:
    params = [{**GREEDY, "max_new_tokens": n} for _, n in reqs]
    engine.generate(input_ids=[p for p, _ in reqs], sampling_params=params)


def ref_batch(ref: Any, reqs: Workload, concurrency: int) -> None:
    with torch.no_grad():
        for i in range(0, len(reqs), concurrency):
            group = reqs[i : i + concurrency]
            width = max(len(p) for p, _ in group)
            ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in group])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in group])
            longest = max(n for _, n in group)
            ref.generate(
                ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest, do_sample=False
            )


def timed(fn: Callable[[], None]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def peak_memory_mb(side: str, ns: argparse.Namespace) -> float:
    """Peak RSS of a child process that loads one side and runs the first `concurrency` requests."""
    cmd = [sys.executable, __file__, "--memory-of", side, "--dtype", ns.dtype, "--threads", str(ns.threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def memory_child(ns: argparse.Namespace) -> None:
    model = load(ns.memory_of, ns.dtype, ns.concurrency)
    run = ours_batch if ns.memory_of == "kvadmit" else ref_batch
    run(model, workload(ns.requests)[: ns.concurrency], ns.concurrency)
    print(peak_rss_mb())


def peak_rss_mb() -> float:
    """This process's peak resident memory: VmHWM (ru_maxrss would carry the parent's over exec)."""
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: idle cores)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds; each side's best counts")
    ap.add_argument("--memory-of", choices=["kvadmit", "transformers"], help=argparse.SUPPRESS)
    ap.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "engine_vs_transformers.txt"))
    ns = ap.parse_args()
    load_before = os.getloadavg()[0]
    auto = ns.threads is None
    if ns.threads is None:
        ns.threads = max(1, (os.cpu_count() or 1) - round(load_before))
    torch.set_num_threads(ns.threads)
    if ns.memory_of:
        memory_child(ns)
        return
    engine = load("kvadmit", ns.dtype, ns.concurrency)
    ref = load("transformers", ns.dtype, ns.concurrency)

    # 1. single stream: 128 new tokens after a 32-token prompt; 2. many requests of mixed lengths.
    prompt = workload(1, seed=1)[0][0][:32]
    reqs = workload(ns.requests)
    total_out = sum(n for _, n in reqs)
    ours_single(engine, prompt, 4)  # warm-up
    ref_single(ref, prompt, 4)
    times: dict[str, list[float]] = {"os": [], "rs": [], "ob": [], "rb": []}
    for _ in range(ns.rounds):
        times["os"].append(timed(partial(ours_single, engine, prompt, 129)))
        times["rs"].append(timed(partial(ref_single, ref, prompt, 129)))
        times["ob"].append(timed(partial(ours_batch, engine, reqs, ns.concurrency)))
        times["rb"].append(timed(partial(ref_batch, ref, reqs, ns.concurrency)))
    single_o, single_r = 128 / min(times["os"]), 128 / min(times["rs"])
    batch_o, batch_r = total_out / min(times["ob"]), total_out / min(times["rb"])

    # 3. batch-1 decode step against the bandwidth bound.
    read_bytes = engine.model.step_read_bytes()  # every weight but the embedding table; lm_head included
    bound = copy_bandwidth() / read_bytes  # steps per second if each step streams the weights once
    load_after = os.getloadavg()[0]
    del engine, ref
    mem_o, mem_r = peak_memory_mb("kvadmit", ns), peak_memory_mb("transformers", ns)

    def rounds(key: str, work: int) -> str:
        return ", ".join(f"{work / t:.1f}" for t in times[key])

    lines = [
        "# benchmarks/engine_vs_transformers.py: SmolLM2-135M-Instruct, kvadmit vs transformers generate",
        f"date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"machine: {cpu_model()}, {os.cpu_count()} cores; Python {platform.python_version()}, "
        f"torch {torch.__version__}, dtype {ns.dtype}, {ns.threads} torch threads"
        f"{' (auto: cores not busy at the start)' if auto else ''}; "
        f"load average {load_before:.2f} before, {load_after:.2f} after",
        "command: " + " ".join(["python", "benchmarks/engine_vs_transformers.py", *sys.argv[1:]]),
        "",
        "| measure | kvadmit | transformers | ratio |",
        "| --- | ---: | ---: | ---: |",
        f"| single-stream decode tok/s | {single_o:.1f} | {single_r:.1f} | {single_o / single_r:.2f}× |",
        f"| {ns.requests} mixed requests at concurrency {ns.concurrency}, output tok/s "
        f"(continuous vs padded batches of {ns.concurrency}) | "
        f"{batch_o:.1f} | {batch_r:.1f} | {batch_o / batch_r:.2f}× |",
        f"| batch-1 decode vs bandwidth bound ({bound:.1f} steps/s: {read_bytes / 1e6:.0f} MB a step) | "
        f"{single_o:.1f} | {single_r:.1f} | {single_o / bound:.2f} of the bound (transformers "
        f"{single_r / bound:.2f}) |",
        f"| peak resident memory, MB (one model, first {ns.concurrency} requests) | {mem_o:,.0f} | "
        f"{mem_r:,.0f} | {mem_o / mem_r:.2f}× |",
        "",
        f"every round (tok/s), kvadmit single: {rounds('os', 128)}; "
        f"transformers single: {rounds('rs', 128)}; kvadmit batched: {rounds('ob', total_out)}; "
        f"transformers batched: {rounds('rb', total_out)}",
        "targets (issue #4): single stream ≥ 1.5×, batched ≥ 2×",
    ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if ns.output != "-":
        with open(ns.output, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
