"""How the KV pool stores a token's K and V: in a float dtype (the model's, or bf16), or as int8 rows
(`--kv-cache-dtype int8`).

An int8 row is one token's head, `dim` values q in −127..127 followed by the 4 bytes of a float32 scale s,
so a layer's pool stays one tensor, [2·kv_heads, slots, dim + 4] int8. The value stored for x is q·s
(rounded to float32), with s = max|x| / 127 over the row (float32) and q = x / s rounded to the nearest
integer, ties to even; a row of zeros has s = 0 and q = 0. That is 68 bytes a row of the default model's
head size 64 against bf16's 128: the pool takes 53% of the memory.

Measured on the default model (int4 weights, tests/data/agreement_text.txt, greedy next token against
float32): bf16 KV 99.2%, int8 rows 98.8%. SGLang's fp8_e4m3 (one scale of 1.0 per pool, as SGLang uses
without a checkpoint's scales) gave 95.4% and fp8_e5m2 91.7%, under the 97% the quantized model must keep,
so kvadmit does not offer them (docs/engine-profile.md).
"""

from __future__ import annotations

import torch

from kvadmit.model.kv_cache_dtypes import INT8_KV, KV_CACHE_DTYPES

SCALE_BYTES = 4  # the float32 scale after an int8 row's values


def pool_dtype(name: str) -> torch.dtype | None:
    """--kv-cache-dtype's choice → the pool's dtype; None for auto (the model's own choice: its dtype, or
    bf16 under --quantization)."""
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"--kv-cache-dtype {name}: choose {', '.join(KV_CACHE_DTYPES)}")
    return {"auto": None, INT8_KV: torch.int8}.get(name, torch.bfloat16)


def is_int8_rows(pool: torch.Tensor) -> bool:
    return pool.dtype == torch.int8


def row_width(head_dim: int, dtype: torch.dtype) -> int:
    """Elements of a pool row (a token's head) for a pool of `dtype`."""
    return head_dim + SCALE_BYTES if dtype == torch.int8 else head_dim


def bytes_per_row(head_dim: int, dtype: torch.dtype) -> int:
    return row_width(head_dim, dtype) * dtype.itemsize


def quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., dim] → int8 [..., dim + 4]: q, then the bytes of s (see the module's docstring)."""
    x = x.float()
    scale = x.abs().amax(-1, keepdim=True) / 127
    q = torch.where(scale > 0, x / scale, 0).round().clamp(-127, 127).to(torch.int8)
    return torch.cat((q, scale.contiguous().view(torch.int8)), dim=-1)


def dequantize_rows(rows: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """int8 rows [..., dim + 4] → the values they hold, [..., dim] in `dtype` (q·s in float32 first)."""
    scale = rows[..., -SCALE_BYTES:].contiguous().view(torch.float32)
    return (rows[..., :-SCALE_BYTES].float() * scale).to(dtype)


def to_pool(x: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """Rows [..., dim] as `pool` stores them."""
    return quantize_rows(x) if is_int8_rows(pool) else x.to(pool.dtype)


def as_stored(x: torch.Tensor, pool: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows [..., dim] rounded as `pool` stores them, read back in `dtype` (what attention over the pool
    would see: a prefill attends to its own new K and V without reading them back)."""
    if is_int8_rows(pool):
        return dequantize_rows(quantize_rows(x), dtype)
    return x.to(pool.dtype).to(dtype)


def read(pool_rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows read from a pool, [..., width] → [..., dim] in `dtype`."""
    return dequantize_rows(pool_rows, dtype) if is_int8_rows(pool_rows) else pool_rows.to(dtype)
