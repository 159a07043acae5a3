"""KV pool size from memory, as SGLang sizes it: a fraction of the memory (`--mem-fraction-static`) holds
the weights and the pool; the pool gets what the weights leave. On CPU the memory is the system's
available memory at start-up, on CUDA the device's free memory."""

from __future__ import annotations

import os

DEFAULT_CPU_MEM_FRACTION = 0.2  # of available system memory (weights + KV pool)
# SGLang derives its GPU default from the GPU's size and the parallelism; one fixed value here.
DEFAULT_CUDA_MEM_FRACTION = 0.85


def default_mem_fraction(device: str) -> float:
    return DEFAULT_CUDA_MEM_FRACTION if device.startswith("cuda") else DEFAULT_CPU_MEM_FRACTION


def available_bytes(device: str) -> int:
    """Free memory where the pool will live: the CUDA device's, or the system's."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    return available_memory_bytes()


def available_memory_bytes() -> int:
    """Available system memory (Linux: MemAvailable; elsewhere free pages)."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """K and V for every layer, `dtype_bytes` per value."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def pool_bytes_per_token(num_layers: int, num_kv_heads: int, row_bytes: int) -> int:
    """K and V for every layer, `row_bytes` per token and head (kv_quant.bytes_per_row: int8 rows carry
    a scale)."""
    return 2 * num_layers * num_kv_heads * row_bytes


def pool_tokens(available: int, fraction: float, weight_bytes: int, per_token: int) -> int:
    """floor((available × fraction − weights) / bytes per token); an error if nothing is left."""
    budget = int(available * fraction) - weight_bytes
    tokens = budget // per_token
    if tokens <= 0:
        raise ValueError(
            f"--mem-fraction-static {fraction} of {available / 2**30:.2f} GB leaves no room for the KV pool "
            f"after {weight_bytes / 2**30:.2f} GB of weights; raise it or give --max-total-tokens"
        )
    return tokens
