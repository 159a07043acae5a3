"""Load a model for serving, once, the same way for the offline Engine and `kvadmit serve`: the folder
(default model, GGUF or HF folder), its tokenizer, the device and dtype resolved, and the KV pool's size
(--max-total-tokens, or --mem-fraction-static of the memory available at start-up minus the weights) and
how it stores K and V (--kv-cache-dtype)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvadmit.model.llama import CausalLM


@dataclass
class LoadedModel:
    folder: Path
    tokenizer: Any
    tokenizer_path: str
    model: CausalLM
    device: str
    dtype: str  # "bfloat16", "float32", …
    quantization: str | None  # a name of quant.QUANTIZATIONS, or None for the weights as they are
    pool_size: int
    available_bytes: int  # at start-up, where the pool lives


def resolve_model_path(model_path: str | None) -> Path:
    """None: the default model. A .gguf file: converted once into the cache. Else an HF folder."""
    from kvadmit.model.default import cache_dir, ensure_default_model
    from kvadmit.model.gguf_convert import convert_gguf

    if model_path is None:
        return ensure_default_model()
    path = Path(model_path)
    if path.suffix == ".gguf" and path.is_file():
        target = cache_dir() / (path.stem + "-converted")
        if not (target / "model.safetensors").is_file():
            convert_gguf(path, target)
        return target
    if not path.exists() and _looks_like_hub_id(model_path):
        return _from_hub(model_path)
    return path


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~"))


def _from_hub(repo_id: str) -> Path:
    """A hub id: the local HF cache if it has it, else a download when the network allows."""
    from huggingface_hub import snapshot_download

    from kvadmit.model.loading import ModelLoadError

    patterns = ["*.json", "*.safetensors", "tokenizer*", "*.txt", "*.model", "*.jinja"]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as e:  # offline, unknown repo, gated, …: one clear line
        raise ModelLoadError(
            f"{repo_id} is not a local folder and could not be downloaded from the Hugging Face hub "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no network'}); give a local "
            "HF folder or .gguf file with --model-path, or omit it for the default model"
        ) from None


def load_model(
    model_path: str | None,
    *,
    tokenizer_path: str | None = None,
    dtype: str | None = "auto",
    device: str | None = None,
    max_total_tokens: int | None = None,
    mem_fraction_static: float | None = None,
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
) -> LoadedModel:
    from kvadmit.model.device import default_device, resolve_dtype
    from kvadmit.model.heap import bound_kernel_caches, return_freed_memory
    from kvadmit.model.kv_quant import bytes_per_row
    from kvadmit.model.loading import check_quantization, kv_pool_dtype, load_hf_folder
    from kvadmit.model.quant import NO_QUANTIZATION
    from kvadmit.model.sizing import available_bytes, default_mem_fraction, pool_bytes_per_token, pool_tokens
    from kvadmit.model.tokenizer import load_tokenizer

    bound_kernel_caches()  # before the first matmul (model/heap.py)
    device = device or default_device()
    check_quantization(quantization, device)
    kv_dtype = kv_pool_dtype(kv_cache_dtype)
    torch_dtype = resolve_dtype(dtype, device, quantized=quantization not in NO_QUANTIZATION)
    folder = resolve_model_path(model_path)
    tok_path = tokenizer_path or str(folder)
    tokenizer = load_tokenizer(tok_path)
    model = load_hf_folder(folder, torch_dtype, device, quantization=quantization)
    model.kv_dtype = kv_dtype or model.kv_dtype
    return_freed_memory()  # the tokenizer's and the loader's garbage
    available = available_bytes(device)
    if max_total_tokens is None:
        cfg = model.cfg
        row = bytes_per_row(cfg.head_dim, model.kv_dtype or model.dtype)
        per_token = pool_bytes_per_token(cfg.num_layers, cfg.num_kv_heads, row)
        fraction = default_mem_fraction(device) if mem_fraction_static is None else mem_fraction_static
        max_total_tokens = pool_tokens(available, fraction, model.weight_bytes(), per_token)
    return LoadedModel(
        folder=folder,
        tokenizer=tokenizer,
        tokenizer_path=tok_path,
        model=model,
        device=device,
        dtype=str(torch_dtype).removeprefix("torch."),
        quantization=None if quantization in NO_QUANTIZATION else quantization,
        pool_size=max_total_tokens,
        available_bytes=available,
    )
