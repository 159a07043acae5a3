"""Where a batch-1 decode step's time goes in float32 on this CPU: the model's own linear layers alone
(the floor any engine built on torch's F.linear meets), the same layers with MKL-packed float32 weights
(`torch.ops.mkl._mkl_reorder_linear_weight`, the path inductor's CPU freezing takes for float32), and
kvadmit's whole single-stream decode step. The question it answers: why kvadmit's lead over
transformers (benchmarks/engine_vs_transformers.py) is smaller in float32 than in bfloat16.

Each layer is timed on its own weights, in model order, as many times as one decode step calls it
(the 30 layers' q/k/v, o, gate/up and down; the output projection once): a step's weights are read
from memory once each, as in decode, not held in cache between calls.

Run: python benchmarks/decode_matmul_floor.py [--dtype float32] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from datetime import datetime, timezone

import torch
import torch.nn.functional as F
from torch import nn

from machine import cpu_model

ROUNDS = 5  # the fastest round of each measure is reported (a shared machine's noise only slows)
PASSES = 4  # passes over a group's layers in a round
Linear = Callable[[torch.Tensor], torch.Tensor]


def pass_ms(fns: list[Linear], x: torch.Tensor) -> float:
    """One decode step's calls, each fn once in turn on x: the fastest of ROUNDS rounds of PASSES such
    passes, in ms per pass."""
    for f in fns:  # warm
        f(x)
    best = float("inf")
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(PASSES):
            for f in fns:
                f(x)
        best = min(best, (time.perf_counter() - t0) / PASSES)
    return 1000 * best


def layer_groups(model: nn.Module) -> dict[str, list[nn.Linear]]:
    groups: dict[str, list[nn.Linear]] = {}
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            groups.setdefault(name.rsplit(".", 1)[-1], []).append(m)
    return groups


def packed_twin(w: torch.Tensor) -> Linear | None:
    """F.linear(x, w) for a batch-1 x through MKL's packed float32 weight, or None if this torch has no
    such op."""
    try:
        packed = torch.ops.mkl._mkl_reorder_linear_weight(w, 1)
    except (AttributeError, RuntimeError):
        return None
    return lambda x: torch.ops.mkl._mkl_linear(x, packed, w, None, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    ns = ap.parse_args()
    torch.set_num_threads(ns.threads)
    import kvadmit
    from kvadmit.model.default import ensure_default_model
    from kvadmit.model.loading import load_hf_folder

    folder = ensure_default_model()
    model = load_hf_folder(folder, getattr(torch, ns.dtype), "cpu")
    rows: list[tuple[str, int, float, float | None, float]] = []  # name, MB, ms plain, ms packed, max diff
    with torch.inference_mode():
        for name, layers in layer_groups(model).items():
            weights = [m.weight.detach() for m in layers]
            x = torch.linspace(-1, 1, weights[0].shape[1], dtype=weights[0].dtype).view(1, -1)
            plain: list[Linear] = [lambda x, w=w: F.linear(x, w) for w in weights]
            plain_ms = pass_ms(plain, x)
            twins = [packed_twin(w) for w in weights]
            packed_ms, diff = None, 0.0
            if all(t is not None for t in twins):
                fns = [t for t in twins if t is not None]
                packed_ms = pass_ms(fns, x)
                diff = max(float((f(x) - g(x)).abs().max()) for f, g in zip(fns, plain, strict=True))
            mb = sum(w.numel() * w.element_size() for w in weights) // 1_000_000
            rows.append((f"{name} × {len(weights)}", mb, plain_ms, packed_ms, diff))
    del model
    engine = kvadmit.Engine(str(folder), dtype=ns.dtype, max_total_tokens=2048)
    prompt, new = list(range(1000, 1064)), 64
    greedy = {"temperature": 0.0, "max_new_tokens": new, "ignore_eos": True}
    engine.generate(input_ids=prompt, sampling_params={**greedy, "max_new_tokens": 8})
    step_ms = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        engine.generate(input_ids=prompt, sampling_params=greedy)
        step_ms = min(step_ms, 1000 * (time.perf_counter() - t0) / new)  # the prefill included, 1 of 65

    plain_total = sum(r[2] for r in rows)
    packed_total = sum(r[3] for r in rows) if all(r[3] is not None for r in rows) else None
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# benchmarks/decode_matmul_floor.py: SmolLM2-135M-Instruct, batch-1 decode, {ns.dtype}")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"date: {when}\nmachine: {cpu_model()}, {os.cpu_count()} cores; torch {torch.__version__}, "
          f"{ns.threads} torch threads; load average {load}")  # fmt: skip
    print(f"command: python benchmarks/decode_matmul_floor.py --dtype {ns.dtype} --threads {ns.threads}")
    print("fastest of 5 rounds each\n")
    print("| layers | MB | F.linear ms a step | MKL-packed ms a step | packed / plain | max abs difference |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, mb, p, q, d in rows:
        packed_cell = "n/a" if q is None else f"{q:.2f}"
        ratio = "n/a" if q is None else f"{q / p:.2f}"
        print(f"| {name} | {mb} | {p:.2f} | {packed_cell} | {ratio} | {d:.1e} |")
    total_packed = "n/a" if packed_total is None else f"{packed_total:.2f}"
    print(f"| all linear layers | {sum(r[1] for r in rows)} | {plain_total:.2f} | {total_packed} | "
          f"{'n/a' if packed_total is None else f'{packed_total / plain_total:.2f}'} | |")  # fmt: skip
    print(f"| kvadmit's whole decode step (64 tokens after a 64-token prompt) | | {step_ms:.2f} | | | |")
    print(f"\nthe linear layers take {plain_total / step_ms:.0%} of kvadmit's step; the rest "
          f"({step_ms - plain_total:.1f} ms: attention, rope, norms, sampling, Python) is what an engine "
          "can save over transformers on top of the same F.linear calls")  # fmt: skip


if __name__ == "__main__":
    main()
