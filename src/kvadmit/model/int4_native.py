"""int4 linear layers through kvadmit's own CPU kernel (int4_kernel.c): 4-bit weights multiplied by int8
activations with integer dot products (AVX-512 VNNI, or AVX2), the way llama.cpp multiplies its Q4 blocks.

PyTorch's weight-only int4 kernel (`_weight_int4pack_mm_for_cpu`) converts every weight to bf16 and
multiplies in floating point; at one or a few sequences that conversion is most of a decode step
(docs/engine-profile.md). Here each activation row is quantized per group of 32 to int8 (a scale and the
float sum of the group kept), and the weights' nibbles are multiplied by it as bytes, four products summed
per instruction.

The kernel is compiled with the system's C compiler the first time it is needed (native_kernels). Without a
compiler, or on a CPU with neither AVX-512 VNNI nor AVX2, or with KVADMIT_INT4_KERNEL=torch in the
environment, `kernel()` is None and int4 layers use PyTorch's kernel (quant.Int4Linear). The kernel runs on
one thread.
"""

from __future__ import annotations

import ctypes
import logging
import os
from functools import cache

import torch
import torch.nn.functional as F
from torch import nn

from kvadmit.model import native_kernels
from kvadmit.model.device import cpu_has_bf16

ROWS = 16  # output rows per block of the packed layout
GROUP = 32  # inputs per group
RECORD = 320  # bytes per (row block, group): 256 of nibbles, 16 fp16 scales, 16 fp16 minimums
# On a CPU with native bf16 (AVX512-BF16, AMX), above this many rows the weight dequantized to bf16 and
# multiplied by oneDNN beats the kernel with 16-bit activations (benchmarks/int4_kernel.txt); None: the
# kernel at any length.
DENSE_ROWS = 32 if cpu_has_bf16() else None
ENV = "KVADMIT_INT4_KERNEL"  # "torch": PyTorch's int4 kernel instead of this one
log = logging.getLogger("kvadmit.executor")


class Kernel:
    """The loaded shared library and the instruction set it runs with (2: AVX-512 VNNI, 1: AVX2)."""

    def __init__(self, lib: ctypes.CDLL, isa: int) -> None:
        self.isa = isa
        self._linear = lib.kvadmit_int4_linear
        self._linear.restype = ctypes.c_int
        p, i = ctypes.c_void_p, ctypes.c_int
        self._linear.argtypes = [p, i, i, p, i, p, i, i]
        self._dequantize = lib.kvadmit_int4_dequantize
        self._dequantize.restype = None
        self._dequantize.argtypes = [p, i, i, p, i]

    @property
    def name(self) -> str:
        return "AVX-512 VNNI" if self.isa == 2 else "AVX2"

    def linear(self, x: torch.Tensor, packed: torch.Tensor, n: int, fine: bool = False) -> torch.Tensor:
        """x [M, K] float32 contiguous → [M, N] float32; `fine`: 16-bit activations (int4_kernel.c)."""
        m, k = x.shape
        out = torch.empty((m, n), dtype=torch.float32)
        if self._linear(x.data_ptr(), m, k, packed.data_ptr(), n, out.data_ptr(), self.isa, int(fine)):
            raise MemoryError(f"the int4 kernel could not allocate its {m} × {k} int8 activations")
        return out

    def dequantize(self, packed: torch.Tensor, n: int, k: int, dtype: torch.dtype) -> torch.Tensor:
        """The weight [n, k] (the first n/16 row blocks of `packed`): scale·q + minimum in float32, rounded
        once to bf16 when `dtype` is bf16."""
        bf16 = dtype == torch.bfloat16
        out = torch.empty((n, k), dtype=torch.bfloat16 if bf16 else torch.float32)
        self._dequantize(packed.data_ptr(), n, k, out.data_ptr(), int(bf16))
        return out if bf16 else out.to(dtype)


@cache
def library() -> ctypes.CDLL | None:
    """The compiled kernels (native_kernels), when their int4 layout is this module's."""
    lib = native_kernels.library()
    return lib if lib is not None and lib.kvadmit_int4_record_bytes() == RECORD else None


@cache
def kernel() -> Kernel | None:
    """The int4 kernel with the best instruction set this CPU has; None where it cannot run."""
    if os.environ.get(ENV, "").lower() == "torch":
        return None
    lib = library()
    if lib is None:
        return None
    isa = lib.kvadmit_int4_isa()
    if isa == 0:
        log.info("int4 kernel: this CPU has neither AVX-512 VNNI nor AVX2; PyTorch's kernel is used")
        return None
    return Kernel(lib, isa)


def kernel_for(isa: int) -> Kernel:
    """The kernel on a given instruction set (1: AVX2, 2: AVX-512 VNNI), one this CPU runs (for tests)."""
    lib = library()
    if lib is None or not 1 <= isa <= lib.kvadmit_int4_isa():
        raise ValueError(f"this CPU cannot run the int4 kernel's instruction set {isa}")
    return Kernel(lib, isa)


def packable(n: int, k: int, scales: torch.Tensor, low: torch.Tensor) -> bool:
    """Whether a [N, K] layer fits the layout and its scales and minimums survive fp16 (GGUF's Q4_1 keeps
    them in fp16 too; a weight so small its scale is subnormal there stays on PyTorch's kernel)."""
    if n % ROWS or k % GROUP:
        return False
    tiny = torch.finfo(torch.float16).tiny
    finite = bool(torch.isfinite(scales.half()).all() and torch.isfinite(low.half()).all())
    return finite and bool((scales >= tiny).all())


def pack(q: torch.Tensor, scales: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """q [N, K] in 0..15, scales and minimums [N, K/32] → the kernel's records, uint8 [N/16, K/32, 320]."""
    n, k = q.shape
    blocks, groups = n // ROWS, k // GROUP
    # [block, row, group, load, half, j] → [block, group, load, row, j] nibble pairs (see int4_kernel.c)
    qq = q.to(torch.uint8).view(blocks, ROWS, groups, 4, 2, 4)
    nibbles = (qq[..., 0, :] | (qq[..., 1, :] << 4)).permute(0, 2, 3, 1, 4).reshape(blocks, groups, 256)

    def fp16(t: torch.Tensor) -> torch.Tensor:
        return t.half().view(blocks, ROWS, groups).transpose(1, 2).contiguous().view(torch.uint8)

    return torch.cat((nibbles, fp16(scales), fp16(low)), dim=-1).contiguous()


def unpack(packed: torch.Tensor, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """pack's inverse: (q uint8 [N, K], scales float32 [N, K/32], minimums float32 [N, K/32])."""
    blocks, groups = n // ROWS, k // GROUP
    nib = packed[..., :256].reshape(blocks, groups, 4, ROWS, 4)
    pairs = torch.stack((nib & 15, nib >> 4), dim=3)  # [block, group, load, half, row, j]
    q = pairs.permute(0, 4, 1, 2, 3, 5).reshape(n, k)

    def fp32(part: torch.Tensor) -> torch.Tensor:
        half = part.contiguous().view(torch.float16).view(blocks, groups, ROWS)
        return half.transpose(1, 2).reshape(n, groups).float()

    return q, fp32(packed[..., 256:288]), fp32(packed[..., 288:320])


class NativeInt4Linear(nn.Module):
    """An int4 linear layer (groups of 32: scale·q + minimum) through `kernel()`. On a CPU that multiplies
    bf16 natively, a 16-bit layer's input of over DENSE_ROWS rows (a prefill) is multiplied by the weight
    dequantized to bf16 instead (oneDNN); elsewhere the kernel takes every row count."""

    group_size = GROUP

    def __init__(
        self, packed: torch.Tensor, n: int, k: int, bias: torch.Tensor | None, fine: bool = False
    ) -> None:
        super().__init__()
        self.fine = fine  # activations in 16 bits (two int8 each), not 8
        self.register_buffer("packed", packed, persistent=False)
        self.register_buffer("bias", bias, persistent=False)
        self.out_features, self.in_features = n, k
        self.held: torch.Tensor | None = None  # the bf16 weight, inside quant.dense_weights_held

    def weight_as(self, dtype: torch.dtype, rows: int | None = None) -> torch.Tensor:
        """scale · q + minimum, [N, K] in `dtype` (the first `rows` rows, if given)."""
        n, k = self.out_features, self.in_features
        blocks = n // ROWS if rows is None else min(-(-rows // ROWS), n // ROWS)
        w = _kernel().dequantize(self.packed[:blocks], blocks * ROWS, k, dtype)
        return w if rows is None else w[:rows]

    @property
    def activation_dtype(self) -> torch.dtype:
        """The dtype long inputs are multiplied in (quant.dense_weights_held holds the weight in it)."""
        return torch.bfloat16

    def dequantized(self, rows: int | None = None) -> torch.Tensor:
        """The weight this layer multiplies by, [N, K] float32 (scale and minimum as stored, in fp16)."""
        return self.weight_as(torch.float32, rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        # (an 8-bit layer, the refined head's fast pass, stays on the kernel: its rows are a batch's last
        # tokens, and its bf16 weight would be 56 MB on the default model)
        if self.fine and DENSE_ROWS is not None and flat.shape[0] > DENSE_ROWS:
            w = self.weight_as(torch.bfloat16) if self.held is None else self.held
            out = F.linear(flat.to(torch.bfloat16), w, None if self.bias is None else self.bias.bfloat16())
            return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        flat = flat.float().contiguous()
        if torch.compiler.is_compiling():  # (the custom op's Python layer would cost eager calls ~10 us)
            out = int4_linear(flat, self.packed, self.out_features, self.fine)
        else:
            out = _kernel().linear(flat, self.packed, self.out_features, self.fine)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def _kernel() -> Kernel:
    k = kernel()
    if k is None:
        raise RuntimeError("the int4 kernel is not available on this machine")
    return k


@torch.library.custom_op("kvadmit::int4_linear", mutates_args=())
def int4_linear(x: torch.Tensor, packed: torch.Tensor, out_features: int, fine: bool) -> torch.Tensor:
    """The kernel's product as one opaque call for torch.compile."""
    return _kernel().linear(x, packed, out_features, fine)


@int4_linear.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, out_features: int, fine: bool) -> torch.Tensor:
    return x.new_empty((x.shape[0], out_features), dtype=torch.float32)
