"""Convert a Llama-architecture GGUF file (llama.cpp's format) into an HF folder this package loads:
config.json, model.safetensors (dequantized) and the tokenizer files.

llama.cpp stores the q and k projections with each head's rows interleaved for its rotary kernel (rows
ordered head, half, pair instead of head, pair, half); we undo that so the weights match the rotate-half
layout the model uses. Facts about the format come from its specification; the code is ours.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


class GGUFError(ValueError):
    """The GGUF file is not one we can convert; the message says why."""


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Rows (head, half, pair) → (head, pair, half)."""
    rows, cols = w.shape
    return w.reshape(heads, rows // heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, dtype: str = "bfloat16") -> Path:
    import gguf
    import torch
    from safetensors.torch import save_file

    path, out = Path(gguf_path), Path(out_dir)
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:
        raise GGUFError(f"{path}: not a readable GGUF file ({e})") from None
    meta = {}
    for key, f in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key not in (
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
        ):
            continue
        try:
            meta[key] = f.contents()
        except Exception:
            continue
    if meta.get("general.architecture") != "llama":
        raise GGUFError(
            f"{path.name}: architecture {meta.get('general.architecture')!r}; only llama is supported"
        )
    heads, kv_heads = int(meta["llama.attention.head_count"]), int(meta["llama.attention.head_count_kv"])
    names = {t.name for t in reader.tensors}
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(meta.get("llama.vocab_size") or 0),
        "hidden_size": int(meta["llama.embedding_length"]),
        "intermediate_size": int(meta["llama.feed_forward_length"]),
        "num_hidden_layers": int(meta["llama.block_count"]),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": float(meta["llama.attention.layer_norm_rms_epsilon"]),
        "rope_theta": float(meta.get("llama.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(meta.get("llama.context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": int(meta.get("tokenizer.ggml.bos_token_id", 1)),
        "eos_token_id": int(meta.get("tokenizer.ggml.eos_token_id", 2)),
        "torch_dtype": dtype,
    }
    torch_dtype = getattr(torch, dtype)
    state: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        except NotImplementedError:
            raise GGUFError(
                f"{path}: tensor {t.name} uses quantization {t.tensor_type.name}, which the gguf package "
                "cannot dequantize; use a file quantized as F16, BF16, Q8_0, Q4_K or similar, or an HF folder"
            ) from None
        parts = t.name.split(".")
        if parts[0] == "blk":
            i, kind = parts[1], parts[2]
            if kind == "attn_q":
                w = _unpermute(w, heads)
            elif kind == "attn_k":
                w = _unpermute(w, kv_heads)
            name = f"model.layers.{i}.{_LAYER_NAMES[kind]}.weight"
        elif t.name == "token_embd.weight":
            name = "model.embed_tokens.weight"
            config["vocab_size"] = config["vocab_size"] or int(w.shape[0])
        elif t.name == "output_norm.weight":
            name = "model.norm.weight"
        elif t.name == "output.weight":
            name = "lm_head.weight"
        else:
            continue
        state[name] = torch.from_numpy(np.ascontiguousarray(w)).to(torch_dtype)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    if "tokenizer.chat_template" in meta:
        (out / "chat_template.jinja").write_text(str(meta["tokenizer.chat_template"]))
    _save_tokenizer(path, out)
    return out


def _save_tokenizer(path: Path, out: Path) -> None:
    """transformers builds a tokenizer from the GGUF metadata; keep its files beside the weights."""
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(str(out))
