"""What machine a benchmark ran on, for the header of its committed output."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpu_features() -> str:
    """The instruction sets a CPU-side figure depends on, read from the CPU's own flags (not assumed):
    e.g. "AVX-512 with BF16, no AMX" or "AVX2, no native bfloat16"."""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        return "instruction sets unknown"
    if "avx512f" in flags:
        vector = "AVX-512 with BF16" if "avx512_bf16" in flags else "AVX-512, no native bfloat16"
    else:
        vector = "AVX2" if "avx2" in flags else "no AVX2"
        vector += ", no native bfloat16"
    return vector + (", AMX" if "amx_tile" in flags else ", no AMX")


def publish(lines: list[str], output: str, keep_earlier: bool = False) -> None:
    """Print a benchmark's report and, unless output is "-", write it to that file too; `keep_earlier`:
    above what the file held (the earlier runs stay below the new one), rather than in its place."""
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if output != "-":
        earlier = Path(output).read_text(encoding="utf-8") if keep_earlier and Path(output).exists() else ""
        with open(output, "w", encoding="utf-8") as f:
            f.write(text + ("\n" + earlier if earlier else ""))


def source_commit(under: str | None = None) -> str:
    """The checkout's commit (short hash), marked "with uncommitted changes" when its tracked files differ
    from it, or, given `under` (a folder of the checkout), when anything there does (untracked files too)."""

    def git(*args: str) -> str:
        where = Path(__file__).resolve().parent
        return subprocess.run(["git", *args], cwd=where, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    scope = ("--", under) if under else ("--untracked-files=no",)
    changed = git("status", "--porcelain", *scope)
    return head + (" with uncommitted changes" if changed else "")
