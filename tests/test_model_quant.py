"""Weight-only quantized linear layers (model/quant.py) on tiny layers: the quantization arithmetic by hand,
PyTorch's kernels' products against the hand-dequantized weights, and a tiny model loaded with
--quantization. kvadmit's own int4 kernel (int4_native) has its tests in test_int4_kernel.py; the int4 tests
here run on PyTorch's kernel, the path taken where kvadmit's does not build or run."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
from torch import nn

from kvadmit.model.quant import (
    QUANTIZATIONS,
    Int4Linear,
    RefinedHead,
    int4_quantize,
    int8_quantize,
    quantized_twin,
    try_quantize,
)


def test_int8_quantize_by_hand() -> None:
    # row max |w| = 2.54 → scale 0.02; 1.0 / 0.02 = 50, −2.54 / 0.02 = −127, 0.011 / 0.02 = 0.55 → 1
    q, scales = int8_quantize(torch.tensor([[1.0, -2.54, 0.011]]))
    assert scales.tolist() == pytest.approx([0.02])
    assert q.tolist() == [[50, -127, 1]]


def test_int4_quantize_by_hand() -> None:
    # one group of 4: min −1, max 2 → scale 3/15 = 0.2; (w + 1) / 0.2 = 0, 15, 5, 7.1 → 7
    q, scales, low = int4_quantize(torch.tensor([[-1.0, 2.0, 0.0, 0.42]]), group=4)
    assert scales.item() == pytest.approx(0.2) and low.tolist() == [[-1.0]]
    assert q.tolist() == [[0, 15, 5, 7]]


def test_the_names_and_their_grids() -> None:
    assert (QUANTIZATIONS["int8"].bits, QUANTIZATIONS["int4"].bits) == (8, 4)
    assert QUANTIZATIONS["int4"].group_size == 32


@pytest.fixture(autouse=True)
def pytorch_int4(monkeypatch: pytest.MonkeyPatch) -> None:
    """int4 through PyTorch's kernel (quant.Int4Linear), as on a machine where kvadmit's does not run."""
    from kvadmit.model import int4_native

    monkeypatch.setattr(int4_native, "kernel", lambda: None)


def _linear(n_out: int, n_in: int, bias: bool) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(n_in, n_out, bias=bias).requires_grad_(False)


@pytest.mark.parametrize("name", list(QUANTIZATIONS))
@pytest.mark.parametrize("bias", [False, True])
def test_the_kernel_multiplies_by_the_hand_dequantized_weight(name: str, bias: bool) -> None:
    """In float32 activations, the identity matrix times the layer gives back its weight: each output is one
    product, so the kernel's weight equals the hand-dequantized one up to float32 rounding (a few ulp)."""
    lin = _linear(64, 128, bias)
    twin = quantized_twin(lin, QUANTIZATIONS[name], torch.float32)
    got = twin(torch.eye(128)) - (twin.bias if bias else 0)
    want = twin.dequantized().T
    torch.testing.assert_close(
        got, want, rtol=0, atol=4 * torch.finfo(torch.float32).eps * float(want.abs().max())
    )
    # and a random batch of activations through it
    x = torch.randn(5, 128)
    torch.testing.assert_close(twin(x), x @ want + (twin.bias if bias else 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(QUANTIZATIONS))
def test_bf16_activations_and_float32_callers(name: str) -> None:
    """Kernels in bf16; a float32 input comes back float32, close to the dequantized product."""
    lin = _linear(64, 128, False)
    twin = try_quantize(lin, QUANTIZATIONS[name], torch.bfloat16)
    assert twin is not None
    x = torch.randn(3, 128)
    out = twin(x)
    assert out.dtype == torch.float32
    want = x.bfloat16().float() @ quantized_twin(lin, QUANTIZATIONS[name], torch.bfloat16).dequantized().T
    torch.testing.assert_close(out, want, rtol=2e-2, atol=2e-2)


def test_int4_recovers_a_q4_1_grid_exactly() -> None:
    """Weights already on a grid of 32-weight blocks (m + d·q, as a GGUF Q4_1 file stores them, each block
    using its lowest and highest level) come back unchanged from int4 with groups of 32."""
    torch.manual_seed(1)
    q = torch.randint(0, 16, (16, 64))  # the kernel takes N a multiple of 16
    q[:, ::32], q[:, 1::32] = 0, 15
    d = torch.tensor([0.25, 0.5]).repeat(16, 1).repeat_interleave(32, dim=1)
    m = torch.tensor([-1.0, -4.0]).repeat(16, 1).repeat_interleave(32, dim=1)
    w = m + d * q
    lin = nn.Linear(64, 16, bias=False).requires_grad_(False)
    lin.weight.copy_(w)
    assert torch.equal(quantized_twin(lin, QUANTIZATIONS["int4"], torch.float32).dequantized(), w)


def test_a_shape_the_groups_do_not_divide_stays_as_it_was() -> None:
    assert try_quantize(_linear(64, 48, False), QUANTIZATIONS["int4"], torch.bfloat16) is None  # 48 % 32
    assert isinstance(
        quantized_twin(_linear(64, 64, False), QUANTIZATIONS["int4"], torch.bfloat16), Int4Linear
    )


def test_the_refined_head_returns_float32_logits_for_its_top_tokens() -> None:
    from kvadmit.model.cpu_pack import try_pack

    lin = _linear(256, 64, False)
    bf16 = nn.Linear(64, 256, bias=False, dtype=torch.bfloat16).requires_grad_(False)
    bf16.weight.copy_(lin.weight)
    packed = try_pack(bf16)
    if packed is None:
        pytest.skip("this torch cannot pack bf16 linear layers")
    head = RefinedHead(packed, lin.weight, refine=4, fast_input=torch.bfloat16)
    x = torch.randn(3, 64)
    got, exact = head(x), x @ lin.weight.T
    top = got.topk(4, dim=-1).indices
    torch.testing.assert_close(got.gather(-1, top), exact.gather(-1, top), rtol=1e-6, atol=1e-6)  # float32
    assert torch.equal(got.argmax(-1), exact.argmax(-1))


def test_a_tiny_model_loads_quantized_and_stays_close(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from kvadmit.model.loading import ModelLoadError, load_hf_folder
    from kvadmit.model.quant import Int8Linear

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path, safe_serialization=True)
    model = load_hf_folder(tmp_path, torch.float32, quantization="int8")
    down = model.model.layers[0].mlp.down_proj
    assert isinstance(down, Int8Linear)
    assert down.scales.dtype == torch.bfloat16  # the kernels' fast input dtype, though the model is float32
    assert down(torch.randn(2, 128)).dtype == torch.float32
    assert model.new_kv_pool(8)[0].dtype == torch.bfloat16
    with pytest.raises(
        ModelLoadError, match="--quantization fp8 is not supported by kvadmit; choose int8, int4"
    ):
        load_hf_folder(tmp_path, torch.float32, quantization="fp8")


def test_the_flag_takes_sglangs_names_and_refuses_others() -> None:
    from kvadmit.cli.flags import quantization_name

    assert [quantization_name(v) for v in ("int4", "unquant", "awq")] == ["int4", "unquant", "awq"]
    with pytest.raises(
        argparse.ArgumentTypeError, match="'int3' is not a quantization; kvadmit implements int8"
    ):
        quantization_name("int3")


@pytest.mark.parametrize("name", list(QUANTIZATIONS))
def test_many_rows_dequantize_and_agree_with_the_kernel(name: str) -> None:
    """Above KERNEL_MAX_ROWS rows the weight is dequantized and multiplied by oneDNN: the same product."""
    from kvadmit.model.quant import KERNEL_MAX_ROWS

    lin = _linear(64, 128, True)
    spec = QUANTIZATIONS[name]
    twin = quantized_twin(lin, spec, torch.float32)
    rows = KERNEL_MAX_ROWS[spec.bits]
    x = torch.randn(rows + 1, 128)
    by_kernel = torch.cat([twin(x[:rows]), twin(x[rows:])])
    torch.testing.assert_close(twin(x), by_kernel, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(twin(x), x @ twin.dequantized().T + twin.bias, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(QUANTIZATIONS))
def test_a_held_dense_weight_gives_the_product_of_one_dequantized_per_call(name: str) -> None:
    """dense_weights_held: long inputs multiplied by the weight dequantized once on entry, bit for bit
    what dequantizing at each call gives; released on exit."""
    from kvadmit.model.quant import KERNEL_MAX_ROWS, dense_weights_held

    spec = QUANTIZATIONS[name]
    twin = quantized_twin(_linear(64, 128, True), spec, torch.bfloat16)
    x = torch.randn(KERNEL_MAX_ROWS[spec.bits] + 1, 128)
    per_call = twin(x)
    with dense_weights_held((twin,)):
        assert twin.held is not None
        assert torch.equal(twin(x), per_call)
    assert twin.held is None


def test_a_large_int4_matrix_quantized_in_blocks_equals_the_whole() -> None:
    """Above QUANTIZE_ROWS rows the twin is built a block at a time: the same packed weights, scales and
    product as quantizing the whole matrix at once (here 4096 + 128 rows: two blocks)."""
    from kvadmit.model.quant import QUANTIZE_ROWS, unpack_cpu_int4

    torch.manual_seed(3)
    lin = _linear(QUANTIZE_ROWS + 128, 64, False)
    blocks = quantized_twin(lin, QUANTIZATIONS["int4"], torch.bfloat16)
    q, scales, low = int4_quantize(lin.weight, 32)
    whole = Int4Linear(q, scales, low, 32, None, torch.bfloat16)
    assert blocks.nibbles is None and blocks.out_features == QUANTIZE_ROWS + 128
    assert torch.equal(unpack_cpu_int4(blocks.packed, QUANTIZE_ROWS + 128, 64), q.to(torch.uint8))
    assert torch.equal(blocks.scales_zeros, whole.scales_zeros)
    x = torch.randn(2, 64)
    assert torch.equal(blocks(x), whole(x))


def test_the_refined_head_over_an_int4_twin_returns_float32_logits_for_its_top_tokens() -> None:
    lin = _linear(256, 64, False)
    head = RefinedHead(quantized_twin(lin, QUANTIZATIONS["int4"], torch.bfloat16), lin.weight, refine=16)
    x = torch.randn(3, 64)
    got, exact = head(x), x @ lin.weight.T
    fast_top = head.fast(x).float().topk(16, dim=-1).indices  # the rows recomputed in float32
    torch.testing.assert_close(got.gather(-1, fast_top), exact.gather(-1, fast_top), rtol=1e-6, atol=1e-6)
    assert torch.equal(got.argmax(-1), exact.argmax(-1))
