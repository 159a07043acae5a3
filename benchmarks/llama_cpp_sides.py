"""The two llama.cpp sides of benchmarks/engine_speed.py: how each server is started and asked.

* `llama.cpp`: llama-cpp-python's server (`python -m llama_cpp.server`), which serves one request at a time;
* `llama-server`: llama.cpp's own server binary (benchmarks/build_llama_server.sh builds it from the same
  llama.cpp source) with parallel slots: `-np 16`, a context of 16 × 640 tokens (each slot holds one
  512 + 128 request) and continuous batching.
Both load the same GGUF file with the same thread count as kvadmit's side.
"""

from __future__ import annotations

import argparse
from pathlib import Path

LLAMA_SIDES = ("llama.cpp", "llama-server")


def llama_command(side: str, ns: argparse.Namespace, gguf: Path, port: int, slots: int,
                  slot_tokens: int) -> tuple[list[str], str]:  # fmt: skip
    """The side's server command line and its health URL."""
    threads = str(ns.threads)
    if side == "llama-server":
        cmd = [ns.llama_server, "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
               "--parallel", str(slots), "--ctx-size", str(slots * slot_tokens), "--cont-batching",
               "--threads", threads, "--threads-batch", threads]  # fmt: skip
        return cmd, f"http://127.0.0.1:{port}/health"
    # one request at a time: its context holds one request, with the slack it was first measured with
    context = slots * (slot_tokens + 64)
    cmd = [ns.llama_python, "-m", "llama_cpp.server", "--model", str(gguf), "--port", str(port),
           "--n_ctx", str(context), "--n_threads", threads, "--n_threads_batch", threads,
           "--n_batch", "512"]  # fmt: skip
    return cmd, f"http://127.0.0.1:{port}/v1/models"


def llama_body(side: str, prompt: str, max_tokens: int, eos: int) -> dict:
    """A greedy /v1/completions request that makes exactly max_tokens tokens: llama-server takes SGLang's
    and kvadmit's ignore_eos; llama-cpp-python has none, so end of text is banned by a logit bias."""
    body: dict = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    if side == "llama-server":
        body["ignore_eos"] = True
    else:
        body["logit_bias"] = {str(eos): -100.0}
    return body


def llama_label(side: str, slots: int, slot_tokens: int) -> str:
    if side == "llama-server":
        return f"llama.cpp llama-server -np {slots} -c {slots * slot_tokens} --cont-batching (Q4_1 GGUF)"
    return "llama.cpp server (llama-cpp-python, one request at a time, Q4_1 GGUF)"


def llama_notes(sides: list[str]) -> list[str]:
    lines = []
    if "llama.cpp" in sides:
        lines.append(
            "llama-cpp-python's server (python -m llama_cpp.server) has no parallel slots: it serves one "
            "request at a time"
        )
    if "llama-server" in sides:
        lines.append(
            "llama-server: llama.cpp's own server binary, built by benchmarks/build_llama_server.sh from the "
            "llama.cpp source inside the llama-cpp-python sdist (same version, same CPU flags, AMX off); "
            "16 slots of 640 tokens each, continuous batching, requests with ignore_eos"
        )
    return lines
