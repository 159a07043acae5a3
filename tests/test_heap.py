"""model/heap.py: with glibc's mmap threshold fixed, a large block freed after a larger one goes back to the
system (with the dynamic threshold it stays in the heap, resident)."""

from __future__ import annotations

import platform

import pytest
import torch

from kvadmit.model.heap import map_large_blocks


def rss_mb() -> float:
    with open("/proc/self/status", encoding="utf-8") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc")
def test_a_freed_large_block_leaves_resident_memory() -> None:
    assert map_large_blocks()
    big = torch.ones(24 * 2**20, dtype=torch.uint8)  # freed: the dynamic threshold would rise to 24 MiB
    del big
    keep = torch.ones(1000)  # (something live above a heap block)
    before = rss_mb()
    block = torch.ones(16 * 2**20, dtype=torch.uint8)  # 16 MiB, touched
    assert rss_mb() >= before + 15
    del block
    assert rss_mb() <= before + 2
    assert keep.sum() == 1000
