"""The C heap of a CPU server: large blocks straight from the system, so that a freed one goes back.

glibc's malloc serves a block of at least M_MMAP_THRESHOLD bytes (128 KiB to begin with) with its own
mapping, unmapped when freed; smaller ones come from the heap, which returns memory to the system only
from its top. But the threshold is dynamic: freeing a mapped block raises it to that block's size (up to
32 MiB), so after loading (whose temporaries are a layer's weights) the activations of a prefill and the
K and V gathered for a decode step land in the heap, between blocks that stay, and their pages stay
resident after they are freed. Setting the threshold fixes it (glibc then stops adjusting it): on the
default model with int4 weights, 16 concurrent requests of 512 + 128 tokens peaked 55-60 MB lower
(benchmarks/engine_speed.txt), at the cost of a mapping and fresh zeroed pages per large temporary.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's own starting value, kept


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def map_large_blocks(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at `threshold` bytes; False where there is no mallopt (musl, macOS)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, threshold))


def return_freed_memory() -> None:
    """Hand freed heap memory back to the system (glibc keeps it otherwise): malloc_trim, where it exists."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
