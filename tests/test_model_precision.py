"""Precision and layout choices made at load time: bf16 by default where the CPU computes it natively,
q/k/v and gate/up fused into one matmul each, bf16 linears packed for oneDNN without changing a result,
and the weight sizes the pool sizing and the benchmark's bandwidth bound use."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvadmit.model.cpu_pack import PackedLinear, pack_linears, try_pack
from kvadmit.model.device import cpu_has_bf16, resolve_dtype
from kvadmit.model.llama import Sequence, fuse_hf_state
from kvadmit.model.loading import load_hf_folder

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("tiny-precision")
    transformers.LlamaForCausalLM(cfg).float().eval().save_pretrained(folder, safe_serialization=True)
    return folder


def test_bf16_is_native_only_with_the_instructions_for_it() -> None:
    assert cpu_has_bf16({"avx512f", "avx512_bf16"})  # AMD Zen 4, Intel Cooper Lake
    assert cpu_has_bf16({"amx_bf16", "amx_tile"})  # Intel Sapphire Rapids
    assert not cpu_has_bf16({"avx2", "avx512f", "avx512bw"})  # AVX-512 alone only emulates bf16
    assert not cpu_has_bf16(set())
    expected = torch.bfloat16 if cpu_has_bf16() else torch.float32
    assert resolve_dtype("auto", "cpu") == resolve_dtype(None, "cpu") == expected
    assert resolve_dtype("float32", "cpu") == torch.float32
    with pytest.raises(ValueError, match="dtype 'float64' is not supported; choose auto, float32"):
        resolve_dtype("float64", "cpu")


def test_fusing_concatenates_rows_in_order_and_leaves_incomplete_layers_alone() -> None:
    p = "model.layers.0."
    state = {f"{p}self_attn.{n}_proj.weight": torch.full((r, 3), float(i)) for i, (n, r) in
             enumerate([("q", 4), ("k", 2), ("v", 2)])}  # fmt: skip
    state |= {f"{p}mlp.gate_proj.weight": torch.zeros(5, 3), f"{p}mlp.up_proj.weight": torch.ones(5, 3)}
    state["model.layers.1.self_attn.q_proj.weight"] = torch.zeros(4, 3)  # k and v missing
    fused = fuse_hf_state(state)
    qkv = fused[f"{p}self_attn.qkv_proj.weight"]
    assert qkv.shape == (8, 3) and qkv[:, 0].tolist() == [0, 0, 0, 0, 1, 1, 2, 2]
    assert fused[f"{p}mlp.gate_up_proj.weight"][:, 0].tolist() == [0] * 5 + [1] * 5
    assert sorted(fused) == sorted([f"{p}self_attn.qkv_proj.weight", f"{p}mlp.gate_up_proj.weight",
                                    "model.layers.1.self_attn.q_proj.weight"])  # fmt: skip


def test_weight_sizes(tiny_folder: Path) -> None:
    model = load_hf_folder(tiny_folder)  # float32: 4 bytes a weight
    # A layer: qkv (4 + 2 + 2 heads × 16) × 64 = 8,192; o 64 × 64 = 4,096; gate/up 2 × 96 × 64 = 12,288;
    # down 96 × 64 = 6,144; two norms 128 → 30,848. Two layers, the final norm (64) and lm_head (97 × 64).
    read = 2 * 30_848 + 64 + 97 * 64
    assert model.step_read_bytes() == 4 * read
    assert model.weight_bytes() == 4 * (read + 97 * 64)  # plus the (untied) embedding table


@pytest.mark.skipif(try_pack(torch.nn.Linear(8, 8).bfloat16()) is None, reason="no oneDNN bf16 packing here")
def test_packed_bf16_linears_change_no_logit(tiny_folder: Path) -> None:
    plain = load_hf_folder(tiny_folder, torch.bfloat16, pack=False)
    packed = load_hf_folder(tiny_folder, torch.bfloat16)
    linears = [m for m in packed.modules() if isinstance(m, PackedLinear)]
    assert len(linears) == 2 * 4 + 1  # qkv, o, gate/up, down in each layer, and lm_head
    assert packed.step_read_bytes() == plain.step_read_bytes()
    ids, positions = torch.tensor([5, 17, 3, 88, 41]), torch.arange(5)
    seqs = [Sequence(torch.arange(5), 5)]
    a = plain(ids, positions, seqs, plain.new_kv_pool(16))
    b = packed(ids, positions, seqs, packed.new_kv_pool(16))
    assert torch.equal(a, b)
    assert pack_linears(load_hf_folder(tiny_folder)) == 0  # float32 stays as it is


def test_the_engine_picks_bf16_where_native(tiny_folder: Path) -> None:
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models

    import kvadmit

    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
    )
    tok.save_pretrained(tiny_folder)
    engine = kvadmit.Engine(str(tiny_folder), max_total_tokens=64)
    assert engine.model.dtype == (torch.bfloat16 if cpu_has_bf16() else torch.float32)
    assert engine.executor.kv_pool[0].dtype == engine.model.dtype
    assert kvadmit.Engine(str(tiny_folder), dtype="float32", max_total_tokens=64).model.dtype == torch.float32


def test_the_kv_pool_is_head_major_and_its_padding_slot_is_zero(tiny_folder: Path) -> None:
    model = load_hf_folder(tiny_folder)
    pool = model.new_kv_pool(32)
    assert len(pool) == 2 and pool[0].shape == (2 * 2, 32, 16)  # [K heads + V heads, slots, head_dim]
    assert all(torch.equal(layer[:, 0], torch.zeros(4, 16)) for layer in pool)  # slot 0 pads decode batches
