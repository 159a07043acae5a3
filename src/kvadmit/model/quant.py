"""Weight-only quantized linear layers on the CPU (`--quantization`), through PyTorch's own kernels.

* int8: one scale per output row (symmetric: w ≈ s·q, q in −127..127, s = max|row| / 127), multiplied by
  `aten._weight_int8pack_mm`.
* int4: groups of G consecutive inputs of a row share a scale and a minimum (asymmetric: w ≈ m + s·q, q in
  0..15, s = (max − min) / 15). With G = 32 the grid is the one of a GGUF's Q4_1 blocks (32 weights, a
  scale and a minimum): a model converted from such a file gets its blocks back. Multiplied by kvadmit's
  own kernel (int4_native: int8 activations, integer dot products, fp16 scale and minimum) where it
  builds and runs, else by `aten._weight_int4pack_mm_for_cpu` (Int4Linear below). That kernel reads
  w = (q − 8)·scale + zero, so zero = m + 8·s.

The quantized model computes in float32 (residual stream, norms, attention) and rounds each quantized
matmul's input to bfloat16, the activation dtype these kernels are fast with (float32 activations take a
slow path, 10–50× slower on the machine measured in benchmarks/engine_speed.txt); scales are kept in it,
as the kernels require. Each layer is probed once against the weights dequantized by hand (`dequantized`);
a layer whose shape the kernel cannot take, or whose product differs, stays as it was. The output
projection alone quantized moved the default model's greedy tokens (int8 cost ~3 points of agreement
with float32, 4 bits changed the Paris answer), so it becomes a RefinedHead: logits through its quantized
twin, the best 16 recomputed in float32 from the exact weight. The KV pool is bf16.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kvadmit.model import int4_native
from kvadmit.model.int4_native import NativeInt4Linear
from kvadmit.model.quant_embedding import Int8GroupEmbedding, exact_int8_groups, int8_group_rows


@dataclass(frozen=True, slots=True)
class QuantSpec:
    bits: int  # 8 or 4
    group_size: int  # inputs that share a scale (int8: the whole row, 0)
    what: str  # for the start-up log and the flag's help


# --quantization's values. SGLang 0.5.22 has no name for weight-only int8/int4 on a CPU, so these are
# kvadmit's. (Its mlx_q4, 4 bits in groups of 64, is not offered: on the default model, whose weights sit on
# a 32-weight Q4_1 grid, groups of 64 kept 73% greedy agreement with float32; groups of 32 keep 99%.)
QUANTIZATIONS: dict[str, QuantSpec] = {
    "int8": QuantSpec(8, 0, "int8 weights, one scale per output channel"),
    "int4": QuantSpec(4, 32, "int4 weights in groups of 32 (a GGUF's Q4_1 grid), a scale and zero each"),
}
NO_QUANTIZATION = (None, "none", "unquant")  # SGLang's "unquant": the weights as they are


def int8_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float → (int8 [N, K], float32 scales [N]) with w ≈ scales[:, None] · q."""
    w = w.float()
    scales = w.abs().amax(dim=1).clamp(min=1e-12) / 127
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


def int4_quantize(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N, K] float → (int32 q in 0..15 [N, K], float32 scales [N, K/G], float32 minimums [N, K/G]) with
    w ≈ minimum + scale · q inside each group of G inputs."""
    n, k = w.shape
    wg = w.float().reshape(n, k // group, group)
    low, high = wg.amin(dim=-1), wg.amax(dim=-1)
    scales = ((high - low) / 15).clamp(min=1e-12)
    q = torch.round((wg - low[..., None]) / scales[..., None]).clamp(0, 15).to(torch.int32)
    return q.reshape(n, k), scales, low


# Above this many rows a product dequantizes the weight to the activation dtype and multiplies it with
# oneDNN (AMX on this CPU) instead: the weight-only kernels cost about linearly in the rows (a 512-row
# prefill through the int8 kernel took 23× the bf16 matmul's time; dequantizing plus the matmul, 2×), while
# dequantizing costs the same at any row count. Where the two cross, from single-thread timings of SmolLM2's
# 3072 × 576 layer: about 130 rows for int8 (its dequantization is one multiply), about 330 for int4.
KERNEL_MAX_ROWS = {8: 128, 4: 256}
PROBE_ROWS = 256  # output rows a layer's probe compares
QUANTIZE_ROWS = 4096  # a larger int4 matrix is quantized this many rows at a time
# The same for kvadmit's kernel, whose blocks are written straight into the packed weight: the default
# model's output projection (49,152 rows) in blocks of 4,096 had raised loading's peak by ~150 MB of float32
# temporaries and the packed parts' concatenation; 512 rows, ~20 MB (measured with /proc's VmRSS)
NATIVE_QUANTIZE_ROWS = 512


class Int8Linear(nn.Module):
    def __init__(self, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.register_buffer("qweight", q, persistent=False)
        self.register_buffer("scales", scales, persistent=False)
        self.register_buffer("bias", bias, persistent=False)
        self.out_features, self.in_features = q.shape
        self.held: torch.Tensor | None = None  # the dequantized weight, inside `dense_weights_held`

    def weight_as(self, dtype: torch.dtype, rows: int | None = None) -> torch.Tensor:
        return self.qweight[:rows].to(dtype) * self.scales[:rows].to(dtype)[:, None]

    def dequantized(self, rows: int | None = None) -> torch.Tensor:
        """The weight this layer multiplies by, [N, K] float32: scale · q (the first `rows` rows if given)."""
        return self.weight_as(torch.float32, rows)

    @property
    def activation_dtype(self) -> torch.dtype:
        """The dtype its kernel multiplies in (its inputs are converted to it)."""
        return self.scales.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(self.activation_dtype)
        if flat.shape[0] > KERNEL_MAX_ROWS[8]:
            out = F.linear(flat, self.weight_as(flat.dtype) if self.held is None else self.held, self.bias)
        else:
            out = torch.ops.aten._weight_int8pack_mm(flat, self.qweight, self.scales)
            if self.bias is not None:
                out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


class Int4Linear(nn.Module):
    def __init__(
        self, q: torch.Tensor, scales: torch.Tensor, low: torch.Tensor, group: int,
        bias: torch.Tensor | None, dtype: torch.dtype,
    ) -> None:  # fmt: skip
        super().__init__()
        n, k = q.shape
        self.out_features, self.in_features = n, k
        self.group_size = group
        # The kernel's layout: [K/G, N, 2] of (scale, zero), zero = minimum + 8·scale (it subtracts 8 from q)
        scales_zeros = torch.stack((scales, low + 8 * scales), dim=-1).transpose(0, 1).contiguous()
        self.register_buffer(
            "packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1), persistent=False
        )
        self.register_buffer("scales_zeros", scales_zeros.to(dtype), persistent=False)
        self.register_buffer("bias", bias, persistent=False)
        # Dequantizing (for long prefills) reads the nibbles back from the kernel's own copy when its layout
        # is the one unpack_cpu_int4 knows (checked here); else from our own copy, two values a byte.
        nibbles = None
        if not torch.equal(unpack_cpu_int4(self.packed, n, k), q.to(torch.uint8)):
            nibbles = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)
        self.register_buffer("nibbles", nibbles, persistent=False)
        self.held: torch.Tensor | None = None  # the dequantized weight, inside `dense_weights_held`

    @classmethod
    def concatenate(cls, parts: list[Int4Linear], bias: torch.Tensor | None) -> Int4Linear:
        """One layer whose output rows are the parts' (each a multiple of 64 rows, packed on its own)."""
        if any(p.nibbles is not None for p in parts):
            raise RuntimeError("the kernel's int4 layout is not the known one")
        out = parts[0]
        out.packed = torch.cat([p.packed for p in parts])
        out.scales_zeros = torch.cat([p.scales_zeros for p in parts], dim=1)
        out.bias = bias
        out.out_features = out.packed.shape[0]
        return out

    def weight_as(self, dtype: torch.dtype, rows: int | None = None) -> torch.Tensor:
        """(q − 8) · scale + zero, [N, K] in `dtype` (the first `rows` rows only, if given)."""
        n, k, g = self.out_features, self.in_features, self.group_size
        n = n if rows is None else min(rows, n)
        if self.nibbles is None:  # whole blocks of 64 rows, then the first n of them
            blocks = -(-n // 64) * 64
            q = unpack_cpu_int4(self.packed[:blocks], blocks, k)[:n]
        else:
            q = torch.stack((self.nibbles[:n] & 15, self.nibbles[:n] >> 4), dim=-1).view(n, k)
        q = q.view(n, k // g, g).to(dtype)
        scale_zero = self.scales_zeros[:, :n].transpose(0, 1).to(dtype)  # [N, K/G, 2]
        return torch.addcmul(scale_zero[..., 1:], q - 8, scale_zero[..., :1]).reshape(n, k)

    def dequantized(self, rows: int | None = None) -> torch.Tensor:
        """The weight this layer multiplies by, [N, K] float32, with the scale and zero as stored (rounded
        to the activation dtype)."""
        return self.weight_as(torch.float32, rows)

    @property
    def activation_dtype(self) -> torch.dtype:
        """The dtype its kernel multiplies in (its inputs are converted to it)."""
        return self.scales_zeros.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(self.activation_dtype)
        if flat.shape[0] > KERNEL_MAX_ROWS[4]:
            out = F.linear(flat, self.weight_as(flat.dtype) if self.held is None else self.held, self.bias)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(
                flat, self.packed, self.group_size, self.scales_zeros
            )
            if self.bias is not None:
                out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


@contextmanager
def dense_weights_held(layers: tuple[nn.Module, ...]) -> Iterator[None]:
    """Inside, each quantized layer of `layers` multiplies long inputs (over KERNEL_MAX_ROWS rows) by one
    dequantized copy of its weight, made on entry, instead of dequantizing at every call: for a caller that
    feeds a long prefill through the same layers a block of rows at a time (llama.MLP)."""
    quantized = [m for m in layers if isinstance(m, (Int8Linear, Int4Linear))]
    # (kvadmit's int4 kernel takes long inputs itself where the CPU has no native bf16)
    quantized += [m for m in layers if isinstance(m, NativeInt4Linear) and int4_native.DENSE_ROWS is not None]
    for m in quantized:
        m.held = m.weight_as(m.activation_dtype)
    try:
        yield
    finally:
        for m in quantized:
            m.held = None


def unpack_cpu_int4(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """q [N, K] (uint8, 0..15) back from `_convert_weight_to_int4pack_for_cpu`'s layout as measured on
    torch 2.13: blocks of 64 output rows; within a block, input after input, a byte per row pair (i, 32+i),
    row i in the low nibble. Int4Linear checks this against the q it packed before relying on it."""
    if n % 64 or packed.shape != (n, k // 2):
        return torch.full((n, k), 255, dtype=torch.uint8)
    nib = torch.stack((packed & 15, packed >> 4), dim=-1).view(n // 64, k, 32, 2)
    return nib.permute(0, 3, 2, 1).reshape(n, k)


def quantized_twin(
    linear: nn.Linear, spec: QuantSpec, dtype: torch.dtype
) -> Int8Linear | Int4Linear | NativeInt4Linear:
    """The quantized copy of a linear layer (not yet probed)."""
    w = linear.weight.detach()
    bias = None if linear.bias is None else linear.bias.detach().to(dtype)
    if spec.bits == 8:
        q, scales = int8_quantize(w)
        return Int8Linear(q, scales.to(dtype), bias)
    if spec.group_size == int4_native.GROUP and int4_native.kernel() is not None:
        native = _native_int4(w, None if linear.bias is None else linear.bias.detach().float())
        if native is not None:
            return native
    if w.shape[0] <= QUANTIZE_ROWS or w.shape[0] % 64:
        q, scales, low = int4_quantize(w, spec.group_size)
        return Int4Linear(q, scales, low, spec.group_size, bias, dtype)
    # A large matrix (an output projection) a block of rows at a time: the kernel packs blocks of 64 rows
    # on their own, so the packed blocks concatenate; each block's float32 temporaries stay small.
    parts = [quantized_twin(_rows(w, i), spec, dtype) for i in range(0, w.shape[0], QUANTIZE_ROWS)]
    return Int4Linear.concatenate(parts, bias)


def _native_int4(w: torch.Tensor, bias: torch.Tensor | None) -> NativeInt4Linear | None:
    """The layer through kvadmit's int4 kernel, quantized NATIVE_QUANTIZE_ROWS rows at a time (whole row
    blocks of the kernel's layout) straight into the packed weight; None if it does not fit the layout."""
    n, k = w.shape
    if n % int4_native.ROWS or k % int4_native.GROUP:
        return None
    packed = torch.empty(
        (n // int4_native.ROWS, k // int4_native.GROUP, int4_native.RECORD), dtype=torch.uint8
    )
    for start in range(0, n, NATIVE_QUANTIZE_ROWS):
        q, scales, low = int4_quantize(w[start : start + NATIVE_QUANTIZE_ROWS], int4_native.GROUP)
        if not int4_native.packable(q.shape[0], k, scales, low):
            return None
        block = start // int4_native.ROWS
        packed[block : block + q.shape[0] // int4_native.ROWS] = int4_native.pack(q, scales, low)
    # 16-bit activations (fine): a decoder layer's input has outlier channels, which one int8 step per 32
    # inputs blurs; on the default model 8 bits kept 94.7% greedy agreement with float32, 16 keep 99.6%
    return NativeInt4Linear(packed, n, k, bias, fine=True)


def _rows(w: torch.Tensor, start: int) -> nn.Linear:
    part = nn.Linear(w.shape[1], min(QUANTIZE_ROWS, w.shape[0] - start), bias=False, device="meta")
    part.weight = nn.Parameter(w[start : start + QUANTIZE_ROWS], requires_grad=False)
    return part


def try_quantize(
    linear: nn.Linear, spec: QuantSpec, dtype: torch.dtype
) -> Int8Linear | Int4Linear | NativeInt4Linear | None:
    """The quantized twin of a CPU linear layer, or None if this torch cannot multiply it faithfully: the
    probe multiplies a few activation rows and compares with the hand-dequantized weight's product."""
    w = linear.weight
    if w.device.type != "cpu" or (spec.group_size and w.shape[1] % spec.group_size):
        return None
    try:
        twin = quantized_twin(linear, spec, dtype)
        probe = torch.linspace(-1, 1, 3 * w.shape[1], dtype=torch.float32).view(3, w.shape[1])
        rows = min(PROBE_ROWS, w.shape[0])  # (an output projection has 50k rows; a few hundred tell)
        got = twin(probe.to(dtype)).float()[:, :rows]
        want = probe.to(dtype).float() @ twin.dequantized(rows).T
        if twin.bias is not None:
            want = want + twin.bias[:rows].float()
        # bf16 output rounding (2^-8 relative) plus summation order: a wrong layout is off by O(1)
        same = torch.allclose(got, want, rtol=2e-2, atol=2e-2 * float(want.abs().max()) + 1e-6)
    except (RuntimeError, AttributeError):
        return None
    return twin if same else None


class RefinedHead(nn.Module):
    """The output projection of a float32 model in two passes: every logit through a fast approximation
    of the weight (`fast`: its quantized twin), then the `refine` largest of each row recomputed in float32
    from the exact weight's rows and written back. Greedy decoding then picks the float32 model's token
    unless that token is not among the fast pass's top `refine`. `weight` is the embedding table when tied
    (not a copy), in the checkpoint's dtype (bf16 rows are exact in float32)."""

    def __init__(
        self, fast: nn.Module, weight: torch.Tensor, refine: int = 16, fast_input: torch.dtype | None = None,
        scales: torch.Tensor | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.fast = fast
        self.fast_input = fast_input  # the dtype `fast` takes, if it does not convert its input itself
        self.weight = weight  # [vocab, hidden]
        self.scales = scales  # with int8 `weight`: quant_embedding's exact form of the bf16 table
        self.refine = refine

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.fast(x if self.fast_input is None else x.to(self.fast_input)).float()
        top = logits.topk(self.refine, dim=-1).indices  # [B, refine]
        rows = self.weight[top] if self.scales is None else int8_group_rows(self.weight, self.scales, top)
        exact = torch.einsum("bkh,bh->bk", rows.float(), x.float())
        return logits.scatter_(-1, top, exact)


def quantize_linears(model: nn.Module, name: str, dtype: torch.dtype = torch.bfloat16) -> int:
    """Replace every quantizable nn.Linear of the decoder layers by its quantized twin per
    QUANTIZATIONS[name], whose kernels take `dtype` activations; returns how many were. The output
    projection (`model.lm_head`) becomes a RefinedHead over its own quantized twin (4 or 8 bits alone moved
    the default model's greedy tokens: int8 cost ~3 points of agreement with float32, 4 bits changed the
    Paris answer; refining the best 16 in float32 restores them: tests/test_quant_quality.py)."""
    from kvadmit.model.cpu_pack import try_pack

    spec = QUANTIZATIONS[name]
    count = 0
    head = getattr(model, "lm_head", None)
    # (the parents only: a list of every module would keep each replaced weight alive until the end)
    for parent in [m for m in model.modules() if not isinstance(m, nn.Linear)]:
        names = [n for n, c in parent.named_children() if isinstance(c, nn.Linear) and c is not head]
        for child_name in names:
            twin = try_quantize(getattr(parent, child_name), spec, dtype)
            if twin is not None:
                setattr(parent, child_name, twin)
                count += 1
    if isinstance(head, nn.Linear) and head.bias is None:
        fast, fast_input = try_quantize(head, spec, dtype), None
        if isinstance(fast, NativeInt4Linear):  # 8-bit activations: the refined pass restores the top tokens
            fast.fine = False
        if fast is None:  # a shape the kernel does not take: the bf16 weight, oneDNN-packed
            bf16 = nn.Linear(head.in_features, head.out_features, bias=False, device="meta")
            bf16.weight = nn.Parameter(head.weight.detach().to(torch.bfloat16), requires_grad=False)
            fast, fast_input = try_pack(bf16), torch.bfloat16
        if fast is not None:
            model.lm_head = _refined_head(model, head, fast, fast_input)
            # The KV pool in bf16: half the memory of float32's (1 point less of greedy agreement on the
            # default model: benchmarks/engine_speed.txt)
            model.kv_dtype = torch.bfloat16
    return count


def _refined_head(
    model: nn.Module, head: nn.Linear, fast: nn.Module, fast_input: torch.dtype | None
) -> RefinedHead:
    """The RefinedHead over `fast`; a table tied to the embedding that exact_int8_groups reproduces is
    kept that way for both (30 MB instead of 54 MB on the default model, the same values)."""
    embedding = getattr(getattr(model, "model", None), "embed_tokens", None)
    if isinstance(embedding, nn.Embedding) and embedding.weight is head.weight:
        table = exact_int8_groups(head.weight.detach())
        if table is not None:
            model.model.embed_tokens = Int8GroupEmbedding(*table)  # type: ignore[union-attr]
            return RefinedHead(fast, table[0], fast_input=fast_input, scales=table[1])
    return RefinedHead(fast, head.weight.detach(), fast_input=fast_input)
