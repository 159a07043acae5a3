"""What machine a benchmark ran on, for the header of its committed output."""

from __future__ import annotations

import platform


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def publish(lines: list[str], output: str) -> None:
    """Print a benchmark's report and, unless output is "-", write it to that file too."""
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if output != "-":
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
