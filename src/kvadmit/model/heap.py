"""Freed C heap memory handed back to the system (glibc's malloc_trim), at the points where much was freed.

glibc's malloc serves a block of at least M_MMAP_THRESHOLD bytes with its own mapping, unmapped when freed,
and smaller ones from the heap, which returns memory only from its top. The threshold is dynamic: freeing
a mapped block raises it to that block's size (up to 32 MiB), so after loading, a prefill's activations
(megabytes each) land in the heap between blocks that stay, and their pages stay resident once freed.
malloc_trim(0) releases every free page of the heap, wherever it lies. The executor calls it after each
prefill batch on the CPU (16 concurrent requests of 512 + 128 tokens on the default model with int4
weights: ~25 MB less resident at the end, no more CPU). Fixing the threshold at 128 KiB instead (mallopt)
held ~60 MB less but mapped and zeroed every large temporary of every decode step afresh: 6× the system
CPU time (benchmarks/engine_speed.txt's notes).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# Entries kept by oneDNN's primitive cache and by PyTorch's own cache of oneDNN objects (ideep's), which
# torch reads from the environment when it first creates one. Both cache a primitive per distinct shape, 2-4
# MB each for the bf16 matmuls of a decode batch's attention (forward_batch.py), and a decode batch has a new
# shape at almost every step (its context grows by one): at their default of 1,024 entries a server's
# resident memory grew ~1.4 MB a step, 130 MB over the 128 steps of 16 concurrent requests. The 30 layers of
# one step share their shapes, so a few entries keep every reuse there is.
KERNEL_CACHE_ENTRIES = "16"


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


LIBC = _libc()


def bound_kernel_caches() -> None:
    """Cap oneDNN's and PyTorch's caches of per-shape primitives (KERNEL_CACHE_ENTRIES), unless the
    environment sets them; effective only before the process's first oneDNN operation."""
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        os.environ.setdefault(name, KERNEL_CACHE_ENTRIES)


def return_freed_memory() -> bool:
    """Hand freed heap memory back to the system (malloc_trim, where it exists); whether it could."""
    if LIBC is None or not hasattr(LIBC, "malloc_trim"):
        return False
    LIBC.malloc_trim(0)
    return True
