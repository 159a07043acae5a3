"""kvadmit's CPU kernels against PyTorch's, in one run on this CPU, one thread: the int4 linear layers of a
decode step and a prefill (model/int4_kernel.c: 8-bit and 16-bit activations; PyTorch's weight-only int4
kernel; the weight dequantized to bf16 and multiplied by oneDNN), and decode attention over a bf16 pool
(model/decode_attention.c against the gather and two matmuls of forward_batch._decode_attention).

The layers have the default model's shapes (SmolLM2-135M: 30 layers of q/k/v 960 × 576, o 576 × 576,
gate/up 3072 × 576, down 576 × 1536) with random weights, 30 distinct copies of each, so that a pass reads
its weights from memory as a decode step does. Each figure is the fastest of ROUNDS rounds (a shared
machine's noise only slows).

Run: python benchmarks/int4_kernel.py [--rows 1 16 32 64 256]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from datetime import datetime, timezone

import torch
import torch.nn.functional as F

from machine import cpu_features, cpu_model

ROUNDS = 5
SHAPES = {"q/k/v": (960, 576), "o": (576, 576), "gate/up": (3072, 576), "down": (576, 1536)}
LAYERS = 30


def fastest_ms(fn: Callable[[], object], rounds: int = ROUNDS) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1000


def linear_sides(rows: int) -> dict[str, float]:
    """ms for one pass of `rows` activation rows through every int4 layer of the model, per side."""
    from kvadmit.model import int4_native
    from kvadmit.model.quant import Int4Linear, int4_quantize

    kernel = int4_native.kernel()
    assert kernel is not None, "kvadmit's int4 kernel does not run on this machine"
    torch.manual_seed(0)
    ours, theirs, dense, inputs = [], [], [], []
    for n, k in SHAPES.values():
        w = torch.randn(n, k) * 0.05
        q, scales, low = int4_quantize(w, 32)
        packed = int4_native.pack(q, scales, low)
        layer = Int4Linear(q, scales, low, 32, None, torch.bfloat16)
        bf16 = int4_native.NativeInt4Linear(packed, n, k, None).weight_as(torch.bfloat16)
        # distinct copies, so that the weights come from memory (clone: new storage each)
        ours += [(packed.clone(), n) for _ in range(LAYERS)]
        theirs += [(layer.packed.clone(), layer.scales_zeros.clone()) for _ in range(LAYERS)]
        dense += [bf16.clone() for _ in range(LAYERS)]
        inputs += [torch.randn(rows, k)] * LAYERS
    bf16_inputs = [x.bfloat16() for x in inputs]

    def run_ours(fine: bool) -> None:
        for (p, n), x in zip(ours, inputs, strict=True):
            kernel.linear(x, p, n, fine)

    def run_theirs() -> None:
        for (p, sz), x in zip(theirs, bf16_inputs, strict=True):
            torch.ops.aten._weight_int4pack_mm_for_cpu(x, p, 32, sz)

    def run_dense() -> None:
        for w, x in zip(dense, bf16_inputs, strict=True):
            F.linear(x, w)

    return {
        "kvadmit, 8-bit activations": fastest_ms(lambda: run_ours(False)),
        "kvadmit, 16-bit activations": fastest_ms(lambda: run_ours(True)),
        "PyTorch int4 (bf16 activations)": fastest_ms(run_theirs),
        "bf16 weight, oneDNN": fastest_ms(run_dense),
    }


def attention_sides(batch: int, context: int, shuffled: bool) -> dict[str, float]:
    """ms for one decode step's attention (30 layers) of `batch` sequences of `context` tokens, their
    slots in order (a fresh server's allocation) or shuffled (a pool fragmented by many requests)."""
    from kvadmit.model import attention_native
    from kvadmit.model.forward_batch import _decode_attention

    assert attention_native.available(), "kvadmit's attention kernel does not run on this machine"
    torch.manual_seed(1)
    slots = batch * context + 64
    pools = [torch.randn(6, slots, 64).bfloat16() for _ in range(LAYERS)]
    order = torch.randperm(slots) if shuffled else torch.arange(slots)
    gather = order[: batch * context].view(batch, context)
    lengths = torch.full((batch,), context, dtype=torch.int32)
    q = torch.randn(batch, 9, 64)

    def ours() -> None:
        for pool in pools:
            attention_native.decode_attention(q, pool, gather, lengths)

    def theirs() -> None:
        applies = attention_native.applies
        attention_native.applies = lambda q, pool: False  # type: ignore[assignment]
        try:
            for pool in pools:
                _decode_attention(q, pool, gather, None, lengths)
        finally:
            attention_native.applies = applies  # type: ignore[assignment]

    return {"kvadmit's kernel": fastest_ms(ours), "PyTorch (gather, matmuls)": fastest_ms(theirs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 32, 64, 256])
    ns = ap.parse_args()
    torch.set_num_threads(1)
    print("# benchmarks/int4_kernel.py: kvadmit's CPU kernels against PyTorch's, one thread")
    print(f"date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"machine: {cpu_model()} ({cpu_features()}); torch {torch.__version__}")
    print(f"command: python benchmarks/int4_kernel.py --rows {' '.join(map(str, ns.rows))}")
    print()
    print(f"## int4 linear layers: one pass through the {LAYERS} layers' q/k/v, o, gate/up and down, ms")
    print()
    rows = {r: linear_sides(r) for r in ns.rows}
    sides = list(next(iter(rows.values())))
    print("| rows | " + " | ".join(sides) + " | PyTorch int4 / kvadmit 16-bit |")
    print("| ---: | " + " | ".join("---:" for _ in sides) + " | ---: |")
    for r, t in rows.items():
        ratio = t["PyTorch int4 (bf16 activations)"] / t["kvadmit, 16-bit activations"]
        print(f"| {r} | " + " | ".join(f"{t[s]:.2f}" for s in sides) + f" | {ratio:.2f}× |")
    print()
    print(
        f"## decode attention: one step ({LAYERS} layers), 9 query heads over 3 KV heads of 64, bf16 pool, ms"
    )
    print()
    print("| sequences × context | slots | kvadmit's kernel, ms | PyTorch (gather, matmuls), ms | ratio |")
    print("| --- | --- | ---: | ---: | ---: |")
    for batch, context in ((1, 580), (16, 580), (16, 2048)):
        for shuffled in (False, True):
            t = attention_sides(batch, context, shuffled)
            ours, theirs = t["kvadmit's kernel"], t["PyTorch (gather, matmuls)"]
            slots = "shuffled" if shuffled else "in order"
            print(f"| {batch} × {context} | {slots} | {ours:.2f} | {theirs:.2f} | {theirs / ours:.2f}× |")


if __name__ == "__main__":
    main()
