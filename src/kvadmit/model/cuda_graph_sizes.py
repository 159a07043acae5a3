"""Which decode batch sizes get a CUDA graph, as SGLang 0.5.22 chooses them (no torch here: the rules are
arithmetic, tested on their own).

* The largest captured batch (`--cuda-graph-max-bs-decode`, or `--cuda-graph-max-bs` as earlier SGLang
  versions named it): when not given, chosen by the GPU's memory with one tensor-parallel rank (SGLang's
  memory hook): under 20 GiB 8, under 35 GiB 48, under 60 GiB 32, under 160 GiB 256, above 512; 160 when
  the memory is unknown. A default larger than `--max-running-requests` (when given) is cut to it.
* The sizes captured up to it: 1, 2, 4, 8, 12, then every 8 to 256, every 16 from 272 to 496, every 32
  from 512; the largest is always added. With `--disable-cuda-graph-padding`, every size from 1. With
  `--cuda-graph-bs-decode`, the sizes given, the largest of them the max bs (whatever else says).

A batch runs through the smallest captured size that holds it, its extra rows padding; a batch larger than
the largest runs eagerly.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

GIB = 1024  # SGLang compares the device's memory in MiB


def default_max_bs(gpu_memory_mib: float | None, max_running_requests: int | None = None) -> int:
    """SGLang 0.5.22's decode max bs for one tensor-parallel rank when --cuda-graph-max-bs-decode is not
    given."""
    if gpu_memory_mib is None:
        bs = 160
    elif gpu_memory_mib < 20 * GIB:  # T4, RTX 4080
        bs = 8
    elif gpu_memory_mib < 35 * GIB:  # A10, RTX 4090, RTX 5090
        bs = 48
    elif gpu_memory_mib < 60 * GIB:  # A100 40 GB, L40
        bs = 32
    elif gpu_memory_mib < 160 * GIB:  # H100, A100 80 GB, H20, H200
        bs = 256
    else:  # B200, MI300
        bs = 512
    if max_running_requests is not None and bs > max_running_requests:
        bs = max_running_requests
    return bs


def capture_sizes(max_bs: int, *, no_padding: bool = False, given: list[int] | None = None) -> list[int]:
    """The decode batch sizes captured, ascending."""
    if given is not None:
        if not given or min(given) < 1:
            raise ValueError(f"--cuda-graph-bs-decode takes batch sizes of at least 1, not {given}")
        return sorted(set(given))
    if max_bs < 1:
        raise ValueError(f"--cuda-graph-max-bs-decode must be at least 1, not {max_bs}")
    if no_padding:
        return list(range(1, max_bs + 1))
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    sizes = [bs for bs in sizes if bs <= max_bs]
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


def padded_size(sizes: list[int], batch: int) -> int | None:
    """The captured size a batch of `batch` sequences runs at; None when it is larger than every one."""
    i = bisect.bisect_left(sizes, batch)
    return sizes[i] if i < len(sizes) else None


def context_buckets(context_len: int, smallest: int = 256) -> list[int]:
    """The key lengths graphs are captured for: powers of two from `smallest`, the last one the context
    length itself. A decode batch's keys are padded to the smallest that holds its longest sequence, so
    that a step reads about its own context, not the model's whole window, at most twice over."""
    if context_len < 1:
        raise ValueError(f"the context length must be at least 1, not {context_len}")
    buckets = []
    length = smallest
    while length < context_len:
        buckets.append(length)
        length *= 2
    buckets.append(context_len)
    return buckets


@dataclass(frozen=True, slots=True)
class GraphFlags:
    """serve's CUDA graph flags, as given."""

    disable: bool = False  # --disable-cuda-graph, or --disable-decode-cuda-graph (the same here)
    max_bs: int | None = None  # --cuda-graph-max-bs-decode / --cuda-graph-max-bs
    sizes: list[int] | None = None  # --cuda-graph-bs-decode
    no_padding: bool = False  # --disable-cuda-graph-padding
    max_running_requests: int | None = None  # --max-running-requests, as given (cuts the default max bs)

    def check(self) -> None:
        """ValueError (what was wrong, what is allowed) for values no device could take."""
        if self.max_bs is not None or self.sizes is not None:  # (a given list makes max_bs moot)
            capture_sizes(1 if self.max_bs is None else self.max_bs, given=self.sizes)

    def capture_sizes(self, device_type: str, gpu_memory_mib: float | None) -> list[int] | None:
        """The batch sizes to capture on this device; None: no graphs (off, or not a CUDA device)."""
        if self.disable or device_type != "cuda":
            return None
        max_bs = self.max_bs
        if max_bs is None:
            max_bs = default_max_bs(gpu_memory_mib, self.max_running_requests)
        return capture_sizes(max_bs, no_padding=self.no_padding, given=self.sizes)
