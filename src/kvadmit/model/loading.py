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
    from safetensors.torch import load_file

    from kvadmit.model.cpu_pack import pack_linears, return_freed_memory
    from kvadmit.model.quant import NO_QUANTIZATION, quantize_linears

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
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except Exception as e:
            raise ModelLoadError(f"{f}: not a readable safetensors file ({e})") from None
    cfg = ModelConfig.from_hf(cfg_dict)
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    state = fuse_hf_state(state)
    with torch.device("meta"):  # no memory and no random init for weights about to be replaced
        model = CausalLM(cfg)
    expected = set(model.state_dict())
    if cfg.tie_word_embeddings:
        expected.discard("lm_head.weight")
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ModelLoadError(
            f"{folder}: weights do not match the architecture (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]})"
        )
    # One tensor at a time, so that at most one extra copy exists; always a copy, so that no weight stays
    # a view of the memory-mapped file (that would keep all of the file's pages mapped once touched).
    for name in list(state):
        state[name] = state[name].to(device=device, dtype=dtype, copy=True)
    model.load_state_dict(state, strict=False, assign=True)
    del state
    model.tie_and_init_buffers()
    model.eval()
    if quantization is not None:
        quantize_linears(model, quantization)  # its kernels take bf16 inputs, whatever the model computes in
        return_freed_memory()
    elif pack and model.device.type == "cpu":
        pack_linears(model)
    return model
