"""model/heap.py: after a large block freed in the middle of glibc's heap (the dynamic mmap threshold raised
by an earlier, larger one), return_freed_memory gives its pages back."""

from __future__ import annotations

import os
import platform

import pytest
import torch

from kvadmit.model.heap import return_freed_memory


def rss_mb() -> float:
    with open("/proc/self/status", encoding="utf-8") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc")
def test_freed_heap_pages_go_back() -> None:
    big = torch.ones(30 * 2**20, dtype=torch.uint8)  # mapped; freed, it raises the threshold to 30 MiB
    del big
    block = torch.ones(16 * 2**20, dtype=torch.uint8)  # 16 MiB from the heap now, touched
    keep = torch.ones(1000)  # something live above it
    before_free = rss_mb()
    del block
    assert return_freed_memory()
    assert rss_mb() <= before_free - 14
    assert keep.sum() == 1000


def test_kernel_caches_are_bounded_unless_the_environment_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kvadmit.model.heap import bound_kernel_caches

    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "1024")  # a user's own setting stays
    bound_kernel_caches()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "16"
    assert os.environ["LRU_CACHE_CAPACITY"] == "1024"
