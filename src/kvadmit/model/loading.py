"""Load a model from a Hugging Face folder: config.json and *.safetensors (one file or shards)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from kvadmit.model.llama import CausalLM, ModelConfig, fuse_hf_state

SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


class ModelLoadError(ValueError):
    """The folder is not a model we can load; the message says what is missing or unsupported."""


def check_quantization(quantization: str | None, device: str) -> None:
    """One line for a --quantization kvadmit does not implement, or one it cannot run on `device`."""
    from kvadmit.model.quant import NO_QUANTIZATION, QUANTIZATIONS

    if quantization in NO_QUANTIZATION:
        return
    if quantization not in QUANTIZATIONS:
        raise ModelLoadError(
            f"--quantization {quantization} is not supported by kvadmit; choose {', '.join(QUANTIZATIONS)} "
            "(weight-only, on the CPU) or unquant"
        )
    if device != "cpu":
        raise ModelLoadError(f"--quantization {quantization} runs on the CPU only (its kernels are CPU ones)")


def kv_pool_dtype(kv_cache_dtype: str) -> torch.dtype | None:
    """--kv-cache-dtype's pool dtype (kv_quant.pool_dtype), or one line for a choice of SGLang's that
    kvadmit does not store, with the reason."""
    from kvadmit.model.kv_cache_dtypes import KV_CACHE_DTYPES
    from kvadmit.model.kv_quant import pool_dtype

    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ModelLoadError(
            f"--kv-cache-dtype {kv_cache_dtype} is not supported by kvadmit; choose auto (the model's dtype; "
            "bf16 under --quantization), bf16, or int8 (kvadmit's own: 8 bits and a scale per token and "
            "head). SGLang's fp8 choices are not offered: on the default model they keep 95.4% "
            "(fp8_e4m3) and 91.7% (fp8_e5m2) of float32's greedy tokens, against int8's 98.8%"
        )
    return pool_dtype(kv_cache_dtype)


def load_hf_folder(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    pack: bool = True,
    quantization: str | None = None,
) -> CausalLM:
    """The model in `folder`, in `dtype` on `device`. With `quantization` (a name of quant.QUANTIZATIONS)
    its linear layers get quantized weights (quant.py); else on CPU in bf16 they are packed for oneDNN
    (cpu_pack.py) unless `pack` is False."""
    from kvadmit.model.cpu_pack import pack_linears
    from kvadmit.model.heap import return_freed_memory
    from kvadmit.model.quant import NO_QUANTIZATION, quantize_linears
    from kvadmit.model.safetensors_read import read_safetensors

    folder = Path(path)
    check_quantization(quantization, device)
    if quantization in NO_QUANTIZATION:
        quantization = None
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"{folder} has no config.json")
    try:
        cfg_dict = json.loads(config_path.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{config_path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    arch = (cfg_dict.get("architectures") or ["?"])[0]
    if arch not in SUPPORTED:
        raise ModelLoadError(
            f"{folder}: architecture {arch} is not supported; supported: {', '.join(SUPPORTED)}"
        )
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder} has no *.safetensors weights")

    def convert(name: str, t: torch.Tensor) -> torch.Tensor:
        load_dtype = _load_dtype(name, t, dtype, quantization)
        return t if load_dtype == t.dtype and device == "cpu" else t.to(device=device, dtype=load_dtype)

    cfg = ModelConfig.from_hf(cfg_dict)
    where = _tensor_files(folder, files, cfg)
    with torch.device("meta"):  # no memory and no random init for weights about to be replaced
        model = CausalLM(cfg)
    # A decoder layer at a time: read, fused and quantized before the next is read, so that loading holds
    # the checkpoint's copy of one layer, not of the whole model, beside the weights loaded so far.
    for group in _groups(where, cfg.num_layers):
        state: dict[str, torch.Tensor] = {}
        for f in sorted({where[n] for n in group}):
            try:
                state.update(read_safetensors(f, convert, [n for n in group if where[n] == f]))
            except Exception as e:
                raise ModelLoadError(f"{f}: not a readable safetensors file ({e})") from None
        model.load_state_dict(fuse_hf_state(state, consume=True), strict=False, assign=True)
        del state
        layer = _layer_of(group, model)
        if quantization is not None and layer is not None:
            quantize_linears(layer, quantization)
    model.tie_and_init_buffers()
    model.eval()
    if quantization is not None:
        quantize_linears(model, quantization)  # its kernels take bf16 inputs, whatever the model computes in
        for m in model.modules():  # a layer the kernels could not take computes in the model's dtype
            if isinstance(m, torch.nn.Linear) and m.weight.dtype != dtype:
                m.weight = torch.nn.Parameter(m.weight.detach().to(dtype), requires_grad=False)
        return_freed_memory()
    elif pack and model.device.type == "cpu":
        pack_linears(model)
    return model


def _tensor_files(folder: Path, files: list[Path], cfg: ModelConfig) -> dict[str, Path]:
    """The checkpoint's tensor names → their file, checked (names only, before any data is read) against
    the architecture's parameters once fused."""
    from kvadmit.model.safetensors_read import read_header

    where: dict[str, Path] = {}
    shapes: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            header = read_header(f)[0]
            # (empty stand-ins: fusing names only; meta tensors would import torch._dynamo to concatenate)
            shapes.update(dict.fromkeys(header, torch.empty(0)))
        except Exception as e:
            raise ModelLoadError(f"{f}: not a readable safetensors file ({e})") from None
        where.update(dict.fromkeys(header, f))
    if cfg.tie_word_embeddings:
        where.pop("lm_head.weight", None)
        shapes.pop("lm_head.weight", None)
    with torch.device("meta"):
        expected = set(CausalLM(cfg).state_dict())
    if cfg.tie_word_embeddings:
        expected.discard("lm_head.weight")
    names = set(fuse_hf_state(shapes, consume=True))
    missing, unexpected = sorted(expected - names), sorted(names - expected)
    if missing or unexpected:
        raise ModelLoadError(
            f"{folder}: weights do not match the architecture (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]})"
        )
    return where


def _layer_index(name: str, num_layers: int) -> int | None:
    parts = name.split(".")
    if name.startswith("model.layers.") and parts[2].isdigit() and int(parts[2]) < num_layers:
        return int(parts[2])
    return None


def _groups(names: dict[str, Path], num_layers: int) -> list[list[str]]:
    """The tensor names layer by layer (model.layers.i.), then the others (embedding, norm, output)."""
    layers: list[list[str]] = [[] for _ in range(num_layers)]
    rest: list[str] = []
    for name in names:
        i = _layer_index(name, num_layers)
        (rest if i is None else layers[i]).append(name)
    return [g for g in (*layers, rest) if g]


def _layer_of(group: list[str], model: CausalLM) -> torch.nn.Module | None:
    """The decoder layer a group of names belongs to (None for the rest)."""
    i = _layer_index(group[0], model.cfg.num_layers)
    return None if i is None else model.model.layers[i]


def _load_dtype(name: str, t: torch.Tensor, dtype: torch.dtype, quantization: str | None) -> torch.dtype:
    """The dtype a checkpoint tensor is loaded in: the model's, except under quantization, where the linear
    layers' weights (about to be quantized) and the embedding (rows looked up, then widened: exact) stay
    in the checkpoint's 16-bit dtype, instead of a float32 copy of the whole model at load time."""
    narrow = t.dtype in (torch.bfloat16, torch.float16) and t.element_size() < dtype.itemsize
    weight = name.endswith("_proj.weight") or name in ("lm_head.weight", "model.embed_tokens.weight")
    return t.dtype if quantization is not None and narrow and weight else dtype
