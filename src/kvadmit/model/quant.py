"""Weight-only quantized linear layers on the CPU (`--quantization`), through PyTorch's own kernels.

* int8: one scale per output row (symmetric: w ≈ s·q, q in −127..127, s = max|row| / 127), multiplied by
  `aten._weight_int8pack_mm`.
* int4: groups of G consecutive inputs of a row share a scale and a minimum (asymmetric: w ≈ m + s·q, q in
  0..15, s = (max − min) / 15), multiplied by `aten._weight_int4pack_mm_for_cpu`. That kernel reads
  w = (q − 8)·scale + zero, so zero = m + 8·s. With G = 32 the grid is the one of a GGUF's Q4_1 blocks
  (32 weights, a scale and a minimum): a model converted from such a file gets its blocks back.

The quantized model computes in float32 (residual stream, norms, attention) and rounds each quantized
matmul's input to bfloat16, the activation dtype these kernels are fast with (float32 activations take a
slow path, 10–50× slower on the machine measured in benchmarks/engine_speed.txt); scales are kept in it,
as the kernels require. Each layer is probed once against the weights dequantized by hand (`dequantized`);
a layer whose shape the kernel cannot take, or whose product differs, stays as it was. The output
projection is not quantized: 4 or 8 bits there moved the default model's greedy tokens (int8 cost ~3
points of agreement with float32, 4 bits changed the Paris answer). It becomes a RefinedHead: bf16
logits, the best few recomputed in float32. The KV pool is bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


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


class Int8Linear(nn.Module):
    def __init__(self, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.register_buffer("qweight", q, persistent=False)
        self.register_buffer("scales", scales, persistent=False)
        self.register_buffer("bias", bias, persistent=False)
        self.out_features, self.in_features = q.shape

    def weight_as(self, dtype: torch.dtype) -> torch.Tensor:
        return self.qweight.to(dtype) * self.scales.to(dtype)[:, None]

    def dequantized(self) -> torch.Tensor:
        """The weight this layer multiplies by, [N, K] float32: scale · q."""
        return self.weight_as(torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(self.scales.dtype)
        if flat.shape[0] > KERNEL_MAX_ROWS[8]:
            out = F.linear(flat, self.weight_as(flat.dtype), self.bias)
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
        # Our own copy for dequantizing (the kernel's layout is its own): two values a byte, even inputs
        # in the low nibble; scale and zero as [N, K/G, 1] each.
        self.register_buffer("nibbles", (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8), persistent=False)
        self.register_buffer("group_scale", scales.to(dtype)[..., None], persistent=False)
        self.register_buffer("group_zero", (low + 8 * scales).to(dtype)[..., None], persistent=False)

    def weight_as(self, dtype: torch.dtype) -> torch.Tensor:
        """(q − 8) · scale + zero, [N, K] in `dtype`."""
        n, k, g = self.out_features, self.in_features, self.group_size
        q = torch.stack((self.nibbles & 15, self.nibbles >> 4), dim=-1).view(n, k // g, g).to(dtype)
        return torch.addcmul(self.group_zero.to(dtype), q - 8, self.group_scale.to(dtype)).view(n, k)

    def dequantized(self) -> torch.Tensor:
        """The weight this layer multiplies by, [N, K] float32, with the scale and zero as stored (rounded
        to the activation dtype)."""
        return self.weight_as(torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(self.scales_zeros.dtype)
        if flat.shape[0] > KERNEL_MAX_ROWS[4]:
            out = F.linear(flat, self.weight_as(flat.dtype), self.bias)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(
                flat, self.packed, self.group_size, self.scales_zeros
            )
            if self.bias is not None:
                out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def quantized_twin(linear: nn.Linear, spec: QuantSpec, dtype: torch.dtype) -> Int8Linear | Int4Linear:
    """The quantized copy of a linear layer (not yet probed)."""
    w = linear.weight.detach()
    bias = None if linear.bias is None else linear.bias.detach().to(dtype)
    if spec.bits == 8:
        q, scales = int8_quantize(w)
        return Int8Linear(q, scales.to(dtype), bias)
    q, scales, low = int4_quantize(w, spec.group_size)
    return Int4Linear(q, scales, low, spec.group_size, bias, dtype)


def try_quantize(linear: nn.Linear, spec: QuantSpec, dtype: torch.dtype) -> Int8Linear | Int4Linear | None:
    """The quantized twin of a CPU linear layer, or None if this torch cannot multiply it faithfully: the
    probe multiplies a few activation rows and compares with the hand-dequantized weight's product."""
    w = linear.weight
    if w.device.type != "cpu" or (spec.group_size and w.shape[1] % spec.group_size):
        return None
    try:
        twin = quantized_twin(linear, spec, dtype)
        probe = torch.linspace(-1, 1, 3 * w.shape[1], dtype=torch.float32).view(3, w.shape[1])
        got = twin(probe.to(dtype)).float()
        want = probe.to(dtype).float() @ twin.dequantized().T
        if twin.bias is not None:
            want = want + twin.bias.float()
        # bf16 output rounding (2^-8 relative) plus summation order: a wrong layout is off by O(1)
        same = torch.allclose(got, want, rtol=2e-2, atol=2e-2 * float(want.abs().max()) + 1e-6)
    except (RuntimeError, AttributeError):
        return None
    return twin if same else None


class RefinedHead(nn.Module):
    """The output projection of a float32 model in two passes: every logit in bfloat16 (the oneDNN-packed
    weight, cpu_pack.py: its input and output are rounded to bf16), then the `refine` largest of each row
    recomputed in float32 from the float32 weight's rows and written back. Greedy decoding then picks the
    float32 model's token unless that token is not among the bf16 pass's top `refine` (bf16 rounding moves
    a logit by a few thousandths of its size: far less than the gap to the 8th best)."""

    def __init__(self, packed: nn.Module, weight: torch.Tensor, refine: int = 8) -> None:
        super().__init__()
        self.fast = packed
        self.weight = weight  # float32 [vocab, hidden]: the embedding table when tied (not a copy)
        self.refine = refine

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.fast(x.to(torch.bfloat16)).float()
        top = logits.topk(self.refine, dim=-1).indices  # [B, refine]
        exact = torch.einsum("bkh,bh->bk", self.weight[top], x.float())
        return logits.scatter_(-1, top, exact)


def quantize_linears(model: nn.Module, name: str, dtype: torch.dtype = torch.bfloat16) -> int:
    """Replace every quantizable nn.Linear of the decoder layers by its quantized twin per
    QUANTIZATIONS[name], whose kernels take `dtype` activations; returns how many were. The output
    projection (`model.lm_head`) becomes a RefinedHead when the model is float32."""
    from kvadmit.model.cpu_pack import try_pack

    spec = QUANTIZATIONS[name]
    count = 0
    head = getattr(model, "lm_head", None)
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and child is not head:
                twin = try_quantize(child, spec, dtype)
                if twin is not None:
                    setattr(parent, child_name, twin)
                    count += 1
    if isinstance(head, nn.Linear) and head.weight.dtype == torch.float32:
        w = head.weight.detach()
        bf16 = nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta")
        bf16.weight = nn.Parameter(w.to(torch.bfloat16), requires_grad=False)
        packed = try_pack(bf16)
        if packed is not None and head.bias is None:
            model.lm_head = RefinedHead(packed, w)
            # The KV pool in bf16 too: half the memory of float32's (1 point less of greedy agreement on
            # the default model: benchmarks/engine_speed.txt)
            model.kv_dtype = torch.bfloat16
    return count
