"""--kv-cache-dtype int8: the row format's rule (model/kv_quant.py) with hand-computed rows, the decode
attention kernel over int8 rows against the definition over the values they hold, the forward pass on an
int8 pool, the pool's size, and the flag's errors."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from kvadmit.model import attention_native, decode_ops, kv_quant
from kvadmit.model.forward_batch import ForwardBatch, Sequence, _decode_attention
from kvadmit.model.llama import CausalLM, ModelConfig
from kvadmit.model.sizing import pool_bytes_per_token, pool_tokens

needs_kernel = pytest.mark.skipif(not attention_native.available(), reason="the kernel does not run here")


def _scale_of(row: torch.Tensor) -> float:
    return struct.unpack("<f", bytes(row[-4:].view(torch.uint8).tolist()))[0]


def test_a_row_is_its_values_over_max_by_127_rounded_half_to_even_then_the_scale() -> None:
    # max |x| = 127, so s = 1.0 exactly and q = x rounded: 0.5 → 0, 1.5 → 2, −2.5 → −2 (ties to even)
    x = torch.tensor([127.0, 0.5, 1.5, -2.5, 3.49, -127.0, 0.0, 64.5])
    row = kv_quant.quantize_rows(x)
    assert row.dtype == torch.int8 and row.shape == (12,)
    assert row[:8].tolist() == [127, 0, 2, -2, 3, -127, 0, 64]
    assert _scale_of(row) == 1.0


def test_the_scale_is_the_float32_max_over_127_and_values_come_back_within_half_a_step() -> None:
    x = torch.tensor([[0.3, -1.7, 0.05, 1.0], [2.0, 2.0, -2.0, 0.001]])
    rows = kv_quant.quantize_rows(x)
    for i in range(2):
        s = _scale_of(rows[i])
        assert s == torch.tensor(x[i].abs().max().item() / 127, dtype=torch.float32).item()
        back = kv_quant.dequantize_rows(rows[i])
        assert back.tolist() == (rows[i, :4].float() * s).tolist()  # q·s in float32
        assert bool(((back - x[i]).abs() <= s / 2 + 1e-7).all())
    # the largest magnitude is stored exactly as ±127 steps
    assert rows[0, 1].item() == -127 and rows[1, :3].tolist() == [127, 127, -127]


def test_a_row_of_zeros_has_scale_zero_and_reads_back_zeros() -> None:
    row = kv_quant.quantize_rows(torch.zeros(2, 8))
    assert row.abs().sum().item() == 0
    assert kv_quant.dequantize_rows(row).tolist() == [[0.0] * 8] * 2


def test_choices_map_to_pool_dtypes_and_fp8_is_refused() -> None:
    assert kv_quant.pool_dtype("auto") is None
    assert kv_quant.pool_dtype("bf16") == kv_quant.pool_dtype("bfloat16") == torch.bfloat16
    assert kv_quant.pool_dtype("int8") == torch.int8
    with pytest.raises(ValueError, match="choose auto, bf16, bfloat16, int8"):
        kv_quant.pool_dtype("fp8_e4m3")


def test_an_int8_pool_takes_68_bytes_a_row_at_head_size_64_and_holds_more_tokens() -> None:
    assert kv_quant.bytes_per_row(64, torch.int8) == 68
    assert kv_quant.bytes_per_row(64, torch.bfloat16) == 128
    # the default model: 30 layers × 3 KV heads × (K, V)
    assert pool_bytes_per_token(30, 3, 68) == 12_240
    assert pool_bytes_per_token(30, 3, 128) == 23_040
    # 1 GB × 0.2 − 100 MB of weights = 100 MB: 8,169 int8 tokens against 4,340 bf16 ones
    assert pool_tokens(10**9, 0.2, 10**8, 12_240) == 8_169
    assert pool_tokens(10**9, 0.2, 10**8, 23_040) == 4_340
    cfg = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2,
                      num_kv_heads=1, head_dim=8)  # fmt: skip
    pools = CausalLM(cfg).new_kv_pool(10, torch.int8)
    assert [tuple(p.shape) for p in pools] == [(2, 10, 12)] * 2 and pools[0].dtype == torch.int8


def _int8_case(lengths: list[int], kv_heads: int, groups: int, dim: int, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths) + 5
    pool = kv_quant.quantize_rows(torch.randn(2 * kv_heads, total, dim, generator=g) * 3)
    perm = torch.randperm(total, generator=g)
    slots, at = [], 0
    for n in lengths:
        slots.append(perm[at : at + n])
        at += n
    return torch.randn(len(lengths), kv_heads * groups, dim, generator=g) * 2, pool, slots


def _definition(q: torch.Tensor, pool: torch.Tensor, slots: list[torch.Tensor]) -> torch.Tensor:
    """softmax(q·Kᵀ/√d)·V in float64 over the values the int8 rows hold (q·s in float32)."""
    b, heads, dim = q.shape
    kv_heads = pool.shape[0] // 2
    values = kv_quant.dequantize_rows(pool).double()
    out = torch.empty(b, heads, dim, dtype=torch.float64)
    for i in range(b):
        for g in range(heads):
            h = g // (heads // kv_heads)
            p = torch.softmax(values[h, slots[i]] @ q[i, g].double() / math.sqrt(dim), dim=0)
            out[i, g] = p @ values[kv_heads + h, slots[i]]
    return out.reshape(b, heads * dim)


@needs_kernel
@pytest.mark.parametrize("wide", [True, False])
@pytest.mark.parametrize(
    ("lengths", "kv_heads", "groups", "dim"),
    [([1], 1, 1, 8), ([7, 8, 9, 17], 3, 3, 64), ([300, 3], 3, 3, 64), ([33], 2, 4, 128)],
)
def test_the_kernel_reads_int8_rows_as_the_values_they_hold(
    lengths: list[int], kv_heads: int, groups: int, dim: int, wide: bool
) -> None:
    q, pool, slots = _int8_case(lengths, kv_heads, groups, dim, seed=dim + len(lengths))
    assert attention_native.applies(q, pool)
    gather = torch.nn.utils.rnn.pad_sequence(slots, batch_first=True)
    got = attention_native.decode_attention(q, pool, gather, torch.tensor(lengths, dtype=torch.int32), wide)
    torch.testing.assert_close(got.double(), _definition(q, pool, slots), rtol=1e-5, atol=1e-5)


def test_pytorchs_decode_path_reads_int8_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    q, pool, slots = _int8_case([5, 12, 9], 3, 3, 64, seed=4)
    fb = ForwardBatch.build(torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long),
                            [Sequence(s, 1) for s in slots])  # fmt: skip
    monkeypatch.setattr(attention_native, "applies", lambda q, pool: False)
    pytorch = _decode_attention(q, pool, fb.gather, fb.key_bias, fb.lengths)
    torch.testing.assert_close(pytorch.double(), _definition(q, pool, slots), rtol=1e-5, atol=1e-5)


def test_a_model_on_an_int8_pool_decodes_what_its_prefill_computes() -> None:
    """Teacher-forced: the logits of token t from one prefill of the whole text, and from decode steps
    after a prefill of the first half, agree: both attend to the same int8 rows (the prefill's own new K
    and V rounded as the pool stores them)."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8)  # fmt: skip
    model = CausalLM(cfg).eval()
    model.kv_dtype = torch.int8
    ids = torch.randint(0, 64, (12,))
    pool = model.new_kv_pool(40)
    whole = ForwardBatch.build(ids, torch.arange(12), [Sequence(torch.arange(1, 13), 12)])
    expected = model.forward_batch(whole, pool, all_positions=True)
    pool = model.new_kv_pool(40)
    first = ForwardBatch.build(ids[:6], torch.arange(6), [Sequence(torch.arange(1, 7), 6)])
    model.forward_batch(first, pool)
    for t in range(6, 12):
        step = ForwardBatch.build(ids[t : t + 1], torch.tensor([t]), [Sequence(torch.arange(1, t + 2), 1)])
        torch.testing.assert_close(model.forward_batch(step, pool)[0], expected[t], rtol=1e-4, atol=1e-4)


def test_the_loader_refuses_sglangs_fp8_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    from kvadmit.cli import main

    # (it parses, as every SGLang choice does, and is refused before any model is loaded)
    assert main(["generate", "hello", "--kv-cache-dtype", "fp8_e4m3"]) == 2
    err = capsys.readouterr().err
    assert "--kv-cache-dtype fp8_e4m3 is not supported by kvadmit; choose auto" in err and "95.4%" in err
    assert "Traceback" not in err
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--kv-cache-dtype", "fp9"])
    assert exit_.value.code == 2
    assert (
        "'fp9' is not a KV cache dtype; kvadmit stores auto, bf16, bfloat16, int8" in capsys.readouterr().err
    )


@pytest.mark.usefixtures("kvadmit_logging_restored")
def test_the_simulated_server_refuses_a_kv_dtype(capsys: pytest.CaptureFixture[str]) -> None:
    from kvadmit.cli import main

    code = main(["serve", "--simulate", "a100:llama-3-8b", "--kv-cache-dtype", "int8", "--port", "1"])
    assert code == 2
    assert (
        "--kv-cache-dtype int8 stores a real model's KV pool; --simulate has none" in capsys.readouterr().err
    )


needs_ops = pytest.mark.skipif(decode_ops.functions() is None, reason="kvadmit's C code does not build here")


@needs_ops
def test_the_c_write_gives_quantize_rows_bytes_at_the_slots() -> None:
    g = torch.Generator().manual_seed(5)
    new = torch.randn(3, 4, 16, generator=g) * torch.tensor([0.01, 1.0, 30.0, 0.0])[None, :, None]
    pool = torch.zeros(4, 10, 20, dtype=torch.int8)
    slots = torch.tensor([7, 2, 9])
    assert decode_ops.kv_store_int8(new, pool, slots)
    expected = kv_quant.quantize_rows(new.transpose(0, 1))  # [4, 3, 20]
    assert torch.equal(pool[:, slots], expected)
    untouched = [s for s in range(10) if s not in (7, 2, 9)]
    assert pool[:, untouched].abs().sum().item() == 0


@needs_ops
def test_the_c_rms_norm_is_the_definition() -> None:
    g = torch.Generator().manual_seed(6)
    x, w = torch.randn(5, 72, generator=g) * 3, torch.randn(72, generator=g)
    got = decode_ops.rms_norm(x, w, 1e-5)
    assert got is not None
    x64 = x.double()
    expected = w.double() * x64 / torch.sqrt(x64.square().mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-6)
    # a prefill's rows, or another dtype, are left to PyTorch
    assert decode_ops.rms_norm(torch.randn(decode_ops.NORM_ROWS + 1, 8), torch.ones(8), 1e-5) is None
    assert decode_ops.rms_norm(x.bfloat16(), w, 1e-5) is None
