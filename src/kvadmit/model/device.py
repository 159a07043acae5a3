"""Where the model runs and in what precision: CUDA when present, else the CPU; bfloat16 by default where
the hardware computes it natively, else float16 on an older GPU and float32 on a CPU without bf16."""

from __future__ import annotations

import platform

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # x86 instruction sets with bf16 dot products


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo: x86 `flags`, Arm `Features`); empty elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        pass
    return set()


def cpu_has_bf16(flags: set[str] | None = None) -> bool:
    """Whether the CPU multiplies bf16 natively (AVX512-BF16 or AMX on x86, the BF16 extension on Arm)."""
    flags = cpu_flags() if flags is None else flags
    if any(f in flags for f in _CPU_BF16_FLAGS):
        return True
    return platform.machine() in ("aarch64", "arm64") and "bf16" in flags


def resolve_dtype(name: str | None, device: str, quantized: bool = False) -> torch.dtype:
    """ "auto" (or None): bfloat16 where native, else float16 on CUDA and float32 on the CPU; with quantized
    weights (quant.py) float32 on the CPU: the residual stream, norms and attention in float32, the
    quantized matmuls in bfloat16 (the activation dtype their kernels are fast with)."""
    if name is None or name == "auto":
        if quantized and device == "cpu":
            return torch.float32
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if cpu_has_bf16() else torch.float32
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r} is not supported; choose auto, {', '.join(DTYPES)}")
    return DTYPES[name]
