"""Two small operations of an eager step through kvadmit's C code (decode_ops.c): the KV write into an
int8 pool (kv_quant.py's rows, byte for byte what quantize_rows gives) and RMSNorm over a few float32 rows.

At one sequence a decoder layer's PyTorch operators cost more in dispatch than in arithmetic: the int8
write is a dozen operators per layer (max, division, rounding, the scale's bytes, the scatter), ~2.5 ms of a
~14 ms token on the default model (benchmarks/engine_speed.txt), RMSNorm seven, twice per layer. Each is
one ctypes call here. Used eagerly on CPU tensors (torch.compile fuses the PyTorch form itself), where the
library builds (native_kernels); else the PyTorch form runs.
"""

from __future__ import annotations

import ctypes
from functools import cache

import torch

from kvadmit.model import native_kernels

NORM_ROWS = 64  # RMSNorm rows taken here; more (a prefill) go to PyTorch's vectorized, threaded operators


class Functions:
    def __init__(self, lib: ctypes.CDLL) -> None:
        p, i = ctypes.c_void_p, ctypes.c_int
        self.kv_store_int8 = lib.kvadmit_kv_store_int8
        self.kv_store_int8.argtypes = [p, i, i, i, p, p, ctypes.c_int64]
        self.kv_store_int8.restype = None
        self.rms_norm = lib.kvadmit_rms_norm
        self.rms_norm.argtypes = [p, i, i, p, ctypes.c_float, p]
        self.rms_norm.restype = None


@cache
def functions() -> Functions | None:
    lib = native_kernels.library()
    return None if lib is None else Functions(lib)


def kv_store_int8(rows: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor) -> bool:
    """rows [T, 2·kv_heads, dim] (K heads, then V heads) into an int8 pool [2·kv_heads, slots, dim + 4] at
    `slots` [T]; False (nothing written) where this code does not apply."""
    fns = functions()
    if fns is None or rows.device.type != "cpu" or pool.dtype != torch.int8 or not pool.is_contiguous():
        return False
    t, heads2, dim = rows.shape
    rows = rows.float().contiguous()
    slots = slots if slots.dtype == torch.int64 and slots.is_contiguous() else slots.long().contiguous()
    fns.kv_store_int8(rows.data_ptr(), t, heads2, dim, slots.data_ptr(), pool.data_ptr(), pool.shape[1])
    return True


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """w · x / sqrt(mean(x²) + eps) over the last dimension of float32 x, or None where this code does not
    apply (another dtype or device, over NORM_ROWS rows)."""
    fns = functions()
    if fns is None or x.dtype != torch.float32 or weight.dtype != torch.float32 or x.device.type != "cpu":
        return None
    dim = x.shape[-1]
    rows = x.numel() // dim if dim else 0
    if rows > NORM_ROWS or rows == 0:
        return None
    x = x.contiguous()
    out = torch.empty_like(x)
    fns.rms_norm(x.data_ptr(), rows, dim, weight.data_ptr(), eps, out.data_ptr())
    return out
