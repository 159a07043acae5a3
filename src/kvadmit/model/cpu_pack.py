"""bf16 linear layers on CPU with their weights reordered once into oneDNN's blocked layout.

`F.linear` on a bf16 CPU tensor reorders the weight into oneDNN's layout on every call, which reads and
writes the whole matrix again; decode at small batch is bound by reading weights, so that doubles its
cost. Packing once at load time (`torch.ops.mkldnn._reorder_linear_weight`) and multiplying with the
packed weight (`_linear_pointwise`, the path inductor's CPU freezing uses) removes it. These are private
ops, so each layer is probed once: if packing fails or the packed product differs from `F.linear`, the
layer stays as it is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvadmit.model.heap import return_freed_memory

PACKED_DTYPES = (torch.bfloat16,)


class PackedLinear(nn.Module):
    """A frozen linear layer whose weight is oneDNN-packed; same results as the layer it replaces."""

    def __init__(self, packed: torch.Tensor, bias: torch.Tensor | None, shape: torch.Size) -> None:
        super().__init__()
        self.register_buffer("packed_weight", packed, persistent=False)
        self.register_buffer("bias", bias, persistent=False)
        self.out_features, self.in_features = shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # (the custom op's Python layer would cost eager calls ~10 us)
            return packed_linear(x, self.packed_weight, self.bias, self.out_features)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


@torch.library.custom_op("kvadmit::packed_linear", mutates_args=())
def packed_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    """The packed product, one opaque call for torch.compile (inductor cannot lower `_linear_pointwise` on a
    weight it did not pack itself: --enable-torch-compile on a bf16 model failed in warm-up)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@packed_linear.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], out_features))


def try_pack(linear: nn.Linear) -> PackedLinear | None:
    """The packed twin of a bf16 CPU linear layer, or None if this torch cannot pack it faithfully."""
    w = linear.weight.detach()
    if w.device.type != "cpu" or w.dtype not in PACKED_DTYPES or not torch.backends.mkldnn.is_available():
        return None
    bias = None if linear.bias is None else linear.bias.detach()
    try:
        packed = PackedLinear(torch.ops.mkldnn._reorder_linear_weight(w), bias, w.shape)
        probe = torch.linspace(-1, 1, 3 * w.shape[1], dtype=w.dtype).view(3, w.shape[1])
        same = torch.equal(packed(probe), F.linear(probe, w, bias))
    except (RuntimeError, AttributeError):
        return None
    return packed if same else None


def pack_linears(model: nn.Module) -> int:
    """Replace every packable nn.Linear inside `model` by its packed twin; returns how many were."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                packed = try_pack(child)
                if packed is not None:
                    setattr(parent, name, packed)
                    count += 1
    if count:
        return_freed_memory()
    return count
