"""kvadmit's own CPU kernels, in C (int4_kernel.c, decode_attention.c, decode_ops.c): compiled with the
system's C compiler the first time they are needed, into one shared library in the kvadmit cache
(~/.cache/kvadmit/native, named by a hash of the sources), and loaded with ctypes, whose calls release the
GIL. Without a compiler `library()` is None (the reason is logged) and the layers that use the kernels keep
PyTorch's own paths. Each kernel checks the CPU's instruction sets at run time.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

SOURCES = tuple(
    Path(__file__).with_name(name) for name in ("int4_kernel.c", "decode_attention.c", "decode_ops.c")
)
log = logging.getLogger("kvadmit.executor")


def _build(target: Path) -> str | None:
    """Compile SOURCES into `target`; None, or why not."""
    compiler = os.environ.get("CC", "cc")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        # (no contraction of a·b + c into one rounding: the dequantized weight is computed as written)
        cmd = [compiler, "-O3", "-ffp-contract=off", "-shared", "-fPIC", "-o", str(built)]
        cmd += [str(s) for s in SOURCES]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{compiler}: {exc}"
        if done.returncode:
            return f"{' '.join(cmd)} failed: {done.stderr.strip()[:500]}"
        os.replace(built, target)  # atomic: a second process building at once sees one whole library
    return None


@cache
def library() -> ctypes.CDLL | None:
    """The compiled kernels, built on first use; None where they cannot be."""
    from kvadmit.model.default import cache_dir

    digest = hashlib.sha256(b"".join(s.read_bytes() for s in SOURCES)).hexdigest()[:16]
    target = cache_dir() / "native" / f"kernels-{digest}-{sys.platform}.so"
    if not target.exists():
        why = _build(target)
        if why is not None:
            log.warning("kvadmit's CPU kernels not built, PyTorch's are used instead: %s", why)
            return None
    return ctypes.CDLL(str(target))
