"""Read a .safetensors file tensor by tensor with plain file reads, each tensor straight into its own
memory, converted to the dtype it is loaded in (loading.py).

The format (safetensors' specification): an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range after the header, then the bytes. Reading instead of memory-mapping
keeps the file's pages out of the process's resident memory: with a mapping, every page read stays
resident until the last tensor is released, so loading held the file and its copy at once.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}  # fmt: skip


def read_header(path: str | Path) -> tuple[dict[str, dict], int]:
    """The file's tensors (name → dtype, shape, data_offsets) and where their bytes begin."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header, 8 + size


def read_safetensors(
    path: str | Path,
    convert: Callable[[str, torch.Tensor], torch.Tensor] = lambda _, t: t,
    names: Iterable[str] | None = None,
) -> dict[str, torch.Tensor]:
    """name → tensor (only `names`, if given); `convert(name, tensor)` is applied to each as it is read
    (the raw one is then dropped). A malformed file raises ValueError."""
    header, base = read_header(path)
    out: dict[str, torch.Tensor] = {}
    with open(path, "rb") as f:
        for name in header if names is None else names:
            info = header[name]
            begin, end = info["data_offsets"]
            dtype = DTYPES[info["dtype"]]
            raw = torch.empty(end - begin, dtype=torch.uint8)
            f.seek(base + begin)
            if f.readinto(memoryview(raw.numpy())) != end - begin:
                raise ValueError(f"tensor {name} is cut short")
            out[name] = convert(name, raw.view(dtype).reshape(info["shape"]))
    return out
