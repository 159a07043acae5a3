"""kvadmit's engine against transformers' `generate` on SmolLM2-135M-Instruct, same prompts, one run.

1. single-stream decode tokens/s;  2. 64 requests of mixed lengths: kvadmit's continuous batching (all
queued at once) vs transformers `generate` in padded static batches of 16;  3. decode step time at batch 1
against the memory-bandwidth bound (weight bytes ÷ measured copy bandwidth);  4. peak resident memory.

    usage: python benchmarks/engine_vs_transformers.py [--dtype bfloat16|float32] [--output FILE | -]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import random
import resource
import time

import torch

from machine import cpu_model


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


def workload(n: int, seed: int = 0) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [
        ([rng.randrange(100, 40000) for _ in range(rng.randint(16, 256))], rng.randint(16, 128))
        for _ in range(n)
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "engine_vs_transformers.txt"))
    ns = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    from transformers import AutoModelForCausalLM

    import kvadmit
    from kvadmit.model.default import ensure_default_model

    folder = ensure_default_model()
    dtype = getattr(torch, ns.dtype)
    engine = kvadmit.Engine(str(folder), dtype=ns.dtype, max_total_tokens=65536)
    ref = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).eval()
    greedy = {"temperature": 0.0, "ignore_eos": True}

    # 1. single stream: 128 new tokens after a 32-token prompt (decode time = total − prefill).
    prompt = workload(1, seed=1)[0][0][:32]
    engine.generate(input_ids=prompt, sampling_params={**greedy, "max_new_tokens": 4})  # warm-up
    t = time.perf_counter()
    engine.generate(input_ids=prompt, sampling_params={**greedy, "max_new_tokens": 129})
    ours_single = 128 / (time.perf_counter() - t)
    with torch.no_grad():
        ref.generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False)
        t = time.perf_counter()
        ref.generate(torch.tensor([prompt]), max_new_tokens=129, min_new_tokens=129, do_sample=False)
        ref_single = 128 / (time.perf_counter() - t)

    # 2. many requests of mixed lengths.
    reqs = workload(ns.requests)
    total_out = sum(n for _, n in reqs)
    t = time.perf_counter()
    engine.generate(
        input_ids=[p for p, _ in reqs], sampling_params=[{**greedy, "max_new_tokens": n} for _, n in reqs]
    )
    ours_batch = total_out / (time.perf_counter() - t)
    t = time.perf_counter()
    with torch.no_grad():
        for i in range(0, len(reqs), 16):
            group = reqs[i : i + 16]
            width = max(len(p) for p, _ in group)
            ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in group])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in group])
            longest = max(n for _, n in group)
            ref.generate(
                ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest, do_sample=False
            )
    ref_batch = total_out / (time.perf_counter() - t)

    # 3. batch-1 decode step against the bandwidth bound.
    weight_bytes = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    bound = copy_bandwidth() / weight_bytes  # steps per second if each step streams the weights once
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    lines = [
        "# benchmarks/engine_vs_transformers.py: SmolLM2-135M-Instruct, kvadmit vs transformers generate",
        f"date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"machine: {cpu_model()}, {os.cpu_count()} cores; Python {platform.python_version()}, "
        f"torch {torch.__version__}, dtype {ns.dtype}",
        "",
        "| measure | kvadmit | transformers | ratio |",
        "| --- | ---: | ---: | ---: |",
        f"| single-stream decode tok/s | {ours_single:.1f} | {ref_single:.1f} | "
        f"{ours_single / ref_single:.2f}× |",
        f"| {ns.requests} mixed requests, output tok/s (continuous vs padded batches of 16) | "
        f"{ours_batch:.1f} | {ref_batch:.1f} | {ours_batch / ref_batch:.2f}× |",
        f"| batch-1 decode vs bandwidth bound ({bound:.1f} steps/s) | {ours_single:.1f} | | "
        f"{ours_single / bound:.2f} of the bound |",
        "",
        f"peak resident memory of this process (both models loaded): {peak_mb:,.0f} MB",
        "targets (issue #4): single stream ≥ 1.5×, batched ≥ 2×",
    ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if ns.output != "-":
        with open(ns.output, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
