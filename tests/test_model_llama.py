"""The pool-indexed transformer against transformers' own implementation, on tiny random models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvadmit.model.llama import CausalLM, Sequence
from kvadmit.model.loading import load_hf_folder

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip


def save_tiny(tmp_path: Path, kind: str, **extra: object) -> tuple[object, Path]:
    torch.manual_seed(0)
    if kind == "llama":
        cfg = transformers.LlamaConfig(**TINY, rope_theta=10000.0, **extra)
        model = transformers.LlamaForCausalLM(cfg)
    elif kind == "qwen2":
        cfg = transformers.Qwen2Config(**TINY, **extra)
        model = transformers.Qwen2ForCausalLM(cfg)
    else:
        cfg = transformers.Qwen3Config(**TINY, head_dim=16, **extra)
        model = transformers.Qwen3ForCausalLM(cfg)
    model = model.float().eval()
    folder = tmp_path / kind
    model.save_pretrained(folder, safe_serialization=True)
    return model, folder


def reference_logits(model: object, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]  # type: ignore[operator]


def prefill(
    ours: CausalLM, pool: list, prompts: list[list[int]], first_slot: int = 0
) -> tuple[torch.Tensor, list]:
    """One ragged prefill of several prompts into consecutive slots; returns last-token logits, slots."""
    ids, pos, seqs, slot = [], [], [], first_slot
    for p in prompts:
        slots = torch.arange(slot, slot + len(p))
        slot += len(p)
        ids += p
        pos += range(len(p))
        seqs.append(Sequence(slots, len(p)))
    return ours(torch.tensor(ids), torch.tensor(pos), seqs, pool), [s.slots for s in seqs]


@pytest.mark.parametrize(("kind", "extra"), [("llama", {}), ("llama", {"tie_word_embeddings": True}),
                                             ("qwen2", {}), ("qwen3", {})])  # fmt: skip
def test_prefill_and_decode_match_transformers(tmp_path: Path, kind: str, extra: dict[str, object]) -> None:
    ref, folder = save_tiny(tmp_path, kind, **extra)
    ours = load_hf_folder(folder)
    pool = ours.new_kv_pool(256)
    prompt = [5, 17, 3, 88, 41, 9, 60, 2, 33, 71]
    logits, (slots,) = prefill(ours, pool, [prompt])
    torch.testing.assert_close(logits[0], reference_logits(ref, prompt)[-1], atol=1e-4, rtol=1e-4)
    # Decode five more tokens, one step at a time, each into the next free slot (scattered on purpose).
    seq_ids, seq_slots = list(prompt), slots
    for step, token in enumerate([12, 44, 7, 90, 1]):
        new_slot = torch.tensor([200 - step])
        seq_slots = torch.cat([seq_slots, new_slot])
        seq_ids.append(token)
        out = ours(torch.tensor([token]), torch.tensor([len(seq_ids) - 1]), [Sequence(seq_slots, 1)], pool)
        torch.testing.assert_close(out[0], reference_logits(ref, seq_ids)[-1], atol=1e-4, rtol=1e-4)


def test_a_ragged_batch_and_a_cached_prefix_give_each_sequence_its_own_logits(tmp_path: Path) -> None:
    ref, folder = save_tiny(tmp_path, "llama")
    ours = load_hf_folder(folder)
    pool = ours.new_kv_pool(256)
    a, b = [1, 2, 3, 4, 5, 6, 7], [9, 8, 7]
    logits, (slots_a, _) = prefill(ours, pool, [a, b])
    torch.testing.assert_close(logits[0], reference_logits(ref, a)[-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[1], reference_logits(ref, b)[-1], atol=1e-4, rtol=1e-4)
    # A third sequence reuses a's first five slots as its cached prefix and computes two new tokens.
    c = [*a[:5], 50, 51]
    slots_c = torch.cat([slots_a[:5], torch.tensor([100, 101])])
    out = ours(torch.tensor([50, 51]), torch.tensor([5, 6]), [Sequence(slots_c, 2)], pool)
    torch.testing.assert_close(out[0], reference_logits(ref, c)[-1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_a_ragged_decode_batch_on_scattered_slots_matches_transformers(tmp_path: Path, kind: str) -> None:
    ref, folder = save_tiny(tmp_path, kind)
    ours = load_hf_folder(folder)
    pool = ours.new_kv_pool(256)
    prompts = [[5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 12], [44, 7], [90, 1, 8, 19, 23]]
    free = torch.randperm(256, generator=torch.Generator().manual_seed(3)).tolist()  # scattered slots
    slots = [torch.tensor([free.pop() for _ in p]) for p in prompts]
    ids = [t for p in prompts for t in p]
    positions = [i for p in prompts for i in range(len(p))]
    ours(torch.tensor(ids), torch.tensor(positions), [Sequence(s, len(s)) for s in slots], pool)
    texts = [list(p) for p in prompts]
    for step in range(4):  # one token each, all three in one batch; contexts stay ragged
        new = [(7 * step + 3 * i) % 97 for i in range(3)]
        for i, token in enumerate(new):
            texts[i].append(token)
            slots[i] = torch.cat([slots[i], torch.tensor([free.pop()])])
        positions = [len(t) - 1 for t in texts]
        seqs = [Sequence(s, 1) for s in slots]
        out = ours(torch.tensor(new), torch.tensor(positions), seqs, pool)
        for i, text in enumerate(texts):
            torch.testing.assert_close(out[i], reference_logits(ref, text)[-1], atol=1e-4, rtol=1e-4)


def test_llama3_rope_scaling_matches_transformers(tmp_path: Path) -> None:
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}  # fmt: skip
    ref, folder = save_tiny(tmp_path, "llama", rope_scaling=scaling)
    ours = load_hf_folder(folder)
    prompt = list(range(1, 90))
    logits, _ = prefill(ours, ours.new_kv_pool(128), [prompt])
    torch.testing.assert_close(logits[0], reference_logits(ref, prompt)[-1], atol=1e-4, rtol=1e-4)


def test_bad_model_folders_get_one_clear_error_naming_the_file(tmp_path: Path) -> None:
    import json

    from kvadmit.model.loading import ModelLoadError

    _, folder = save_tiny(tmp_path, "llama")
    cfg = json.loads((folder / "config.json").read_text())
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "config.json").write_text(json.dumps({**cfg, "architectures": ["MambaForCausalLM"]}))
    with pytest.raises(ModelLoadError, match="architecture MambaForCausalLM is not supported"):
        load_hf_folder(odd)
    (odd / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=r"has no \*\.safetensors weights"):
        load_hf_folder(odd)
    (odd / "model.safetensors").write_bytes(b"not really weights")
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: not a readable safetensors file"):
        load_hf_folder(odd)
    with pytest.raises(ModelLoadError, match=r"has no config\.json"):
        load_hf_folder(tmp_path / "nowhere")
    from safetensors.torch import load_file, save_file

    weights = load_file(str(folder / "model.safetensors"))
    del weights["model.layers.1.mlp.down_proj.weight"]
    save_file(weights, str(odd / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"odd: weights do not match the architecture \(missing "
                       r"\['model\.layers\.1\.mlp\.down_proj\.weight'\], unexpected \[\]\)"):  # fmt: skip
        load_hf_folder(odd)


def test_a_bad_gguf_file_gets_one_clear_error(tmp_path: Path) -> None:
    from kvadmit.model.gguf_convert import GGUFError, convert_gguf

    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF but not really")
    with pytest.raises(GGUFError, match=r"broken\.gguf: not a readable GGUF file"):
        convert_gguf(bad, tmp_path / "out")


def test_a_gguf_with_an_unsupported_quantization_gets_one_clear_error(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    import numpy as np

    from kvadmit.model.gguf_convert import GGUFError, convert_gguf

    # A tiny llama GGUF whose embedding is Q8_K, a type the gguf package has no dequantizer for.
    path = tmp_path / "tiny-q8k.gguf"
    writer = gguf.GGUFWriter(str(path), arch="llama")
    for key, value in [("head_count", 2), ("head_count_kv", 1)]:
        writer.add_uint32(f"llama.attention.{key}", value)
    for key, value in [("embedding_length", 256), ("feed_forward_length", 512), ("block_count", 1)]:
        writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_tensor("output_norm.weight", np.ones(256, dtype=np.float32))
    q8k = gguf.GGMLQuantizationType.Q8_K
    row_bytes = gguf.GGML_QUANT_SIZES[q8k][1]  # one block of 256 values a row
    writer.add_tensor("token_embd.weight", np.zeros((4, row_bytes), dtype=np.uint8), raw_dtype=q8k)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFError) as err:
        convert_gguf(path, tmp_path / "out")
    message = str(err.value)
    assert str(path) in message
    assert "tensor token_embd.weight uses quantization Q8_K" in message
    assert "cannot dequantize" in message
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_a_hub_id_that_cannot_be_fetched_is_one_clear_error(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """No network (HF_HUB_OFFLINE) and not in the cache: the error names the id and says what to do."""
    from kvadmit.model.loading import ModelLoadError
    from kvadmit.model.runtime import resolve_model_path

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as err:
        resolve_model_path("kvadmit-tests/no-such-model")
    message = str(err.value)
    assert "kvadmit-tests/no-such-model is not a local folder and could not be downloaded" in message
    assert "--model-path" in message


def test_safetensors_read_tensor_by_tensor_equals_the_library(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from kvadmit.model.safetensors_read import read_safetensors

    state = {"a": torch.randn(3, 5).bfloat16(), "b": torch.arange(7, dtype=torch.int64), "c": torch.ones(2)}
    save_file(state, str(tmp_path / "m.safetensors"), metadata={"format": "pt"})
    got = read_safetensors(tmp_path / "m.safetensors", lambda name, t: t.float() if name == "a" else t)
    want = load_file(str(tmp_path / "m.safetensors"))
    assert set(got) == {"a", "b", "c"} and got["a"].dtype == torch.float32
    assert torch.equal(got["a"], want["a"].float()) and torch.equal(got["b"], want["b"])
    assert torch.equal(got["c"], want["c"])
