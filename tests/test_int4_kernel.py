"""kvadmit's int4 kernel (model/int4_kernel.c through model/int4_native.py): the packed layout by its
rule, exact products where the activations sit on the int8 grid, the activation rounding's bound
elsewhere, every instruction set this CPU runs giving the same bits, and the layer inside a model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kvadmit.model import int4_native
from kvadmit.model.int4_native import GROUP, RECORD, ROWS, Kernel, NativeInt4Linear, pack, unpack
from kvadmit.model.quant import QUANTIZATIONS, int4_quantize, quantized_twin

KERNEL = int4_native.kernel()
needs_kernel = pytest.mark.skipif(KERNEL is None, reason="kvadmit's int4 kernel does not run here")


def _kernels() -> list[Kernel]:
    """The kernel once per instruction set this CPU has (AVX-512 VNNI implies AVX2)."""
    assert KERNEL is not None
    isas = [1, 2] if KERNEL.isa == 2 else [1]
    return [int4_native.kernel_for(isa) for isa in isas]


def _grid_layer(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q in 0..15 with scales and minimums that fp16 and float32 hold exactly (powers of two, small
    multiples of them), so that the dequantized weight is exact."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.int32)
    scales = 2.0 ** -torch.randint(3, 8, (n, k // GROUP), generator=g).float()
    low = -torch.randint(0, 9, (n, k // GROUP), generator=g).float() * 2.0**-4
    return q, scales, low


def test_the_layout_by_its_rule() -> None:
    """Row r's input 4·(2L)+j of group g sits in the low nibble of byte 64·L + 4r + j of record (block, g),
    input 4·(2L+1)+j in its high nibble; scales from byte 256, minimums from 288, fp16."""
    n, k = 32, 64  # two row blocks, two groups
    q = torch.zeros(n, k, dtype=torch.int32)
    q[16 + 3, 32 + 9] = 7  # block 1, row 3; group 1, input 9: chunk 2 (inputs 8..11), j = 1 → L = 1, low
    q[16 + 3, 32 + 13] = 5  # input 13: chunk 3 → L = 1, high nibble of the same byte
    scales = torch.full((n, 2), 0.5)
    scales[16 + 3, 1] = 0.25
    low = torch.full((n, 2), -1.0)
    records = pack(q, scales, low)
    assert records.shape == (2, 2, RECORD) and records.dtype == torch.uint8
    record = records[1, 1]
    assert int(record[64 * 1 + 4 * 3 + 1]) == 7 | (5 << 4)
    assert int(record[:256].count_nonzero()) == 1
    assert record[256:288].view(torch.float16)[3].item() == 0.25
    assert record[288:320].view(torch.float16).tolist() == [-1.0] * ROWS


def test_unpack_gives_back_what_was_packed() -> None:
    q, scales, low = _grid_layer(48, 96, seed=1)
    got_q, got_scales, got_low = unpack(pack(q, scales, low), 48, 96)
    assert torch.equal(got_q, q.to(torch.uint8))
    assert torch.equal(got_scales, scales) and torch.equal(got_low, low)


@needs_kernel
@pytest.mark.parametrize("fine", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 16])
def test_activations_on_the_int8_grid_multiply_exactly(rows: int, fine: bool) -> None:
    """Each group of 32 activations holds ±127·c (c a power of two) and other integer multiples of c: the
    int8 rounding is then exact, Σ q·a8 is exact in integers, and every float step multiplies by powers of
    two or adds small multiples of them: the product is the float64 one, to float32's rounding."""
    n, k = 48, 96
    q, scales, low = _grid_layer(n, k, seed=2)
    layer = NativeInt4Linear(pack(q, scales, low), n, k, None)
    g = torch.Generator().manual_seed(3)
    a8 = torch.randint(-127, 128, (rows, k), generator=g)
    a8[:, ::GROUP] = 127
    x = (a8.float() * 2.0**-6).contiguous()
    want = x.double() @ layer.dequantized().double().T
    for kernel in _kernels():
        got = kernel.linear(x, layer.packed, n, fine)
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5 * float(want.abs().max()))


@needs_kernel
@pytest.mark.parametrize("fine", [False, True])
def test_other_activations_stay_within_their_rounding(fine: bool) -> None:
    """Each activation is rounded to its group's int8 grid (step s = max|a| / 127): each output is off the
    exact product by at most Σ_k |w_k| · s_k / 2. `fine` adds the rounding residual in 256ths of a step,
    itself rounded (s/512) or, at exactly half a step, saturated at 127/256 (s/256): at most Σ |w|·s / 256."""
    n, k, rows = 64, 128, 6
    torch.manual_seed(4)
    w = torch.randn(n, k) * 0.05
    q, scales, low = int4_quantize(w, GROUP)
    layer = NativeInt4Linear(pack(q, scales, low), n, k, None, fine=fine)
    x = torch.randn(rows, k)
    step = (x.view(rows, k // GROUP, GROUP).abs().amax(-1) / 127).repeat_interleave(GROUP, dim=1)
    wd = layer.dequantized().double()
    bound = (step.double() / (256 if fine else 2)) @ wd.abs().T
    err = (layer(x).double() - x.double() @ wd.T).abs()
    assert bool((err <= bound * (1 + 1e-4) + 1e-5).all())
    assert float(err.max()) > 0  # (the activations are not on the grid: the rounding shows)


@needs_kernel
def test_every_instruction_set_gives_the_same_bits() -> None:
    """AVX2 sums the integer products in int16 then int32, VNNI in int32: both exact, and the float steps
    are the same, lane by lane (with 8-bit and with 16-bit activations)."""
    n, k = 64, 192
    torch.manual_seed(5)
    q, scales, low = int4_quantize(torch.randn(n, k), GROUP)
    packed = pack(q, scales, low)
    x = torch.randn(7, k)
    for fine in (False, True):
        outs = [kernel.linear(x, packed, n, fine) for kernel in _kernels()]
        assert all(torch.equal(outs[0], out) for out in outs)
    # and a row's product does not depend on the rows multiplied with it (tiles of 4 rows, then 3)
    rows = [_kernels()[0].linear(x[i : i + 1].contiguous(), packed, n, True) for i in range(7)]
    assert torch.equal(outs[0], torch.cat(rows))


@needs_kernel
def test_quantization_takes_the_kernel_and_keeps_bias_and_dtype() -> None:
    torch.manual_seed(6)
    lin = nn.Linear(64, 32, bias=True).requires_grad_(False)
    twin = quantized_twin(lin, QUANTIZATIONS["int4"], torch.bfloat16)
    assert isinstance(twin, NativeInt4Linear)
    x = torch.randn(2, 3, 64)
    out = twin(x)
    assert out.shape == (2, 3, 32) and out.dtype == torch.float32
    want = x @ twin.dequantized().T + lin.bias
    torch.testing.assert_close(out, want, rtol=3e-2, atol=3e-2)
    assert twin(x.bfloat16()).dtype == torch.bfloat16


@needs_kernel
def test_a_large_matrix_packed_in_blocks_equals_the_whole() -> None:
    """Above QUANTIZE_ROWS rows the twin is quantized and packed a block of rows at a time: the records
    concatenate to those of the whole matrix."""
    from kvadmit.model.quant import QUANTIZE_ROWS

    torch.manual_seed(7)
    lin = nn.Linear(64, QUANTIZE_ROWS + 32, bias=False).requires_grad_(False)
    twin = quantized_twin(lin, QUANTIZATIONS["int4"], torch.bfloat16)
    assert isinstance(twin, NativeInt4Linear)
    assert torch.equal(twin.packed, pack(*int4_quantize(lin.weight, GROUP)))


def test_a_layer_the_layout_cannot_hold_is_refused() -> None:
    """Rows not a multiple of 16, or a scale fp16 holds only as a subnormal: PyTorch's kernel instead."""
    _, scales, low = _grid_layer(16, 32, seed=8)
    assert int4_native.packable(16, 32, scales, low)
    assert not int4_native.packable(24, 32, scales, low)
    assert not int4_native.packable(16, 32, scales * 1e-4, low)
    assert not int4_native.packable(16, 32, scales, low * 1e6)


def test_the_environment_can_choose_pytorchs_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(int4_native.ENV, "torch")
    int4_native.kernel.cache_clear()
    try:
        assert int4_native.kernel() is None
        from kvadmit.model.quant import Int4Linear

        twin = quantized_twin(nn.Linear(64, 32, bias=False), QUANTIZATIONS["int4"], torch.bfloat16)
        assert isinstance(twin, Int4Linear)
    finally:
        monkeypatch.delenv(int4_native.ENV)
        int4_native.kernel.cache_clear()


@needs_kernel
def test_the_compiled_graph_calls_the_kernel() -> None:
    """Inside torch.compile the layer is one opaque op (kvadmit::int4_linear): the same output as eager."""
    torch.manual_seed(9)
    lin = nn.Linear(64, 32, bias=False).requires_grad_(False)
    twin = quantized_twin(lin, QUANTIZATIONS["int4"], torch.bfloat16)
    x = torch.randn(3, 64)
    compiled = torch.compile(lambda t: twin(t * 2) + 1, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), twin(x * 2) + 1)


@needs_kernel
def test_the_weight_dequantized_in_c_is_the_one_the_layout_holds() -> None:
    """float32: scale·q + minimum as torch computes it from `unpack`, bit for bit; bf16: that, rounded once
    (to nearest, ties to even)."""
    n, k = 48, 96
    torch.manual_seed(10)
    q, scales, low = int4_quantize(torch.randn(n, k), GROUP)
    layer = NativeInt4Linear(pack(q, scales, low), n, k, None)
    uq, us, ul = unpack(layer.packed, n, k)
    want = (uq.view(n, k // GROUP, GROUP).float() * us[..., None] + ul[..., None]).reshape(n, k)
    assert torch.equal(layer.weight_as(torch.float32), want)
    assert torch.equal(layer.weight_as(torch.bfloat16), want.bfloat16())
    assert torch.equal(layer.weight_as(torch.float32, rows=20), want[:20])


@needs_kernel
def test_long_inputs_take_the_dense_bf16_path_where_the_cpu_has_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over DENSE_ROWS rows a 16-bit layer multiplies by its bf16 weight (held or dequantized per call: the
    same bits); an 8-bit layer (the head's fast pass) stays on the kernel."""
    from kvadmit.model.quant import dense_weights_held

    monkeypatch.setattr(int4_native, "DENSE_ROWS", 8)
    n, k = 32, 64
    torch.manual_seed(11)
    q, scales, low = int4_quantize(torch.randn(n, k), GROUP)
    layer = NativeInt4Linear(pack(q, scales, low), n, k, None, fine=True)
    x = torch.randn(9, k)
    want = torch.nn.functional.linear(x.bfloat16(), layer.weight_as(torch.bfloat16)).float()
    assert torch.equal(layer(x), want)
    with dense_weights_held((layer,)):
        assert layer.held is not None and torch.equal(layer(x), want)
    assert layer.held is None
    assert torch.equal(layer(x[:8]), KERNEL.linear(x[:8].contiguous(), layer.packed, n, True))  # 8 rows
    layer.fine = False
    assert torch.equal(layer(x), KERNEL.linear(x, layer.packed, n, False))
    assert layer(x[:0]).shape == (0, n)  # no rows: an empty product, not an error
