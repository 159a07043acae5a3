"""Decode attention through kvadmit's own CPU kernel (decode_attention.c): each sequence's K and V read
from the pool (bf16, or int8 rows: kv_quant.py) through its slot list, with no gathered copy, in float32
arithmetic.

PyTorch's path (forward_batch._decode_attention) first gathers every sequence's keys and values into a
padded batch (index_select), then multiplies: at 16 sequences of ~580 tokens the gather alone took 0.75 ms
a layer and the two matmuls 0.87, of a decode step's ~100 ms (docs/engine-profile.md). The kernel reads
each key and value once. Used where the library builds (native_kernels), the pool is bf16 or int8 rows,
the queries float32 and the head size a multiple of 8; else PyTorch's path.
"""

from __future__ import annotations

import ctypes
import math
import os
from functools import cache

import torch

from kvadmit.model import kv_quant, native_kernels

ENV = "KVADMIT_ATTENTION_KERNEL"  # "torch": PyTorch's decode attention instead of this one
KINDS = {torch.bfloat16: 0, torch.int8: 1}  # the pools the kernel reads (its KIND_BF16, KIND_INT8)


@cache
def _function() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if os.environ.get(ENV, "").lower() == "torch":
        return None
    lib = native_kernels.library()
    if lib is None:
        return None
    fn = lib.kvadmit_decode_attention
    p, i = ctypes.c_void_p, ctypes.c_int
    fn.argtypes = [p, i, i, i, i, p, ctypes.c_int64, p, i, p, ctypes.c_float, p, i, i]
    fn.restype = ctypes.c_int
    return fn


_available: bool | None = None  # (a plain global: torch.compile reads it where it cannot trace ctypes)


def available() -> bool:
    """Whether the kernel runs here; call it once outside torch.compile first (CompiledDecode does)."""
    global _available
    if _available is None:
        _available = _function() is not None
    return _available


def applies(q: torch.Tensor, kv_pool: torch.Tensor) -> bool:
    """Whether the kernel takes this batch: CPU tensors, float32 queries over a bf16 pool or int8 rows, head
    size a multiple of 8 (at most 256)."""
    dim = q.shape[-1]
    return (
        available() and q.device.type == "cpu" and q.dtype == torch.float32 and kv_pool.dtype in KINDS
        and kv_pool.shape[-1] == kv_quant.row_width(dim, kv_pool.dtype) and dim % 8 == 0 and dim <= 256
    )  # fmt: skip


def decode_attention(
    q: torch.Tensor, kv_pool: torch.Tensor, gather: torch.Tensor, lengths: torch.Tensor, wide: bool = True
) -> torch.Tensor:
    """q [B, heads, dim] float32; kv_pool [2·kv_heads, slots, row] (bf16, or int8 rows); gather [B, L] int64
    slot lists (sequence b's first lengths[b]); → [B, heads·dim] float32. The caller checks `applies`.
    `wide` False keeps to the AVX2 code where AVX-512 would run (for tests)."""
    fn = _function()
    assert fn is not None
    b, heads, dim = q.shape
    kv_heads = kv_pool.shape[0] // 2
    # (each call costs ~1 us per tensor touched: the decode step of one sequence makes 30 of them)
    q = q if q.is_contiguous() else q.contiguous()
    gather = gather if gather.is_contiguous() else gather.contiguous()
    if lengths.dtype != torch.int32 or not lengths.is_contiguous():
        lengths = lengths.to(torch.int32).contiguous()
    if not kv_pool.is_contiguous():
        raise ValueError("the decode attention kernel reads a contiguous pool")
    out = torch.empty((b, heads * dim), dtype=torch.float32)
    failed = fn(
        q.data_ptr(), b, kv_heads, heads // kv_heads, dim, kv_pool.data_ptr(), kv_pool.shape[1],
        gather.data_ptr(), gather.shape[1], lengths.data_ptr(), 1 / math.sqrt(dim), out.data_ptr(),
        KINDS[kv_pool.dtype], int(wide),
    )  # fmt: skip
    if failed:
        raise RuntimeError(f"the decode attention kernel refused {b} sequences of head size {dim}")
    return out
