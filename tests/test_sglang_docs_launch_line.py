"""A launch line of 30 flags from SGLang's own documentation, pasted into `python -m kvadmit.launch_server`.

The line: the prefill server of "DeepSeek R1 High Performance 50ms 1" in SGLang's Ascend best-practice page,
https://github.com/sgl-project/sglang/blob/main/docs/platforms/ascend_npu_best_practice.md
with its shell variables filled in (MODEL_PATH=xxx as the page sets it, host 127.0.0.1, bootstrap port
8998 for i = 0). As written it asks for what kvadmit refuses (a quantized checkpoint, 16-way tensor
parallelism, prefill disaggregation, speculative decoding, DP attention): kvadmit says so in one line and
exits 2. For one device — those five flags dropped, `--tp-size 1` — the other 25 flags start a server
(under --simulate) that answers requests, and the start-up log names the 14 flags that have no effect
here once.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

# The docs' command, its line breaks kept (MODEL_PATH=xxx; ${P_IP[$i]} → 127.0.0.1; $((8998+$i)) → 8998)
DOCS_COMMAND = r"""
python -m sglang.launch_server --model-path xxx  --disaggregation-mode prefill --host 127.0.0.1 \
--port 8000 --disaggregation-bootstrap-port 8998 --trust-remote-code --nnodes 1 --node-rank 0 \
--tp-size 16 --mem-fraction-static 0.81 --attention-backend ascend --device npu --quantization modelslim \
--disaggregation-transfer-backend ascend --max-running-requests 8 --context-length 8192  --disable-radix-cache \
--chunked-prefill-size -1 --max-prefill-tokens 28680 --moe-a2a-backend deepep --deepep-mode normal \
--speculative-algorithm NEXTN --speculative-num-steps 1 --speculative-eagle-topk 1 --speculative-num-draft-tokens 2 \
--dp-size 2 --enable-dp-attention --disable-shared-experts-fusion --dtype bfloat16 --enable-attn-tp-input-scattered
"""  # noqa: E501
DOCS_LINE = shlex.split(DOCS_COMMAND.replace("\\\n", " "))[3:]  # after `python -m sglang.launch_server`
# What one device cannot do, dropped: flag → its value (None: a switch)
MULTI_DEVICE = {
    "--disaggregation-mode": "prefill", "--quantization": "modelslim", "--speculative-algorithm": "NEXTN",
    "--dp-size": "2", "--enable-dp-attention": None,
}  # fmt: skip
NO_EFFECT = {
    "--trust-remote-code", "--nnodes", "--node-rank", "--tp-size", "--attention-backend",
    "--moe-a2a-backend", "--deepep-mode", "--speculative-num-steps", "--speculative-eagle-topk",
    "--speculative-num-draft-tokens", "--disable-shared-experts-fusion", "--enable-attn-tp-input-scattered",
    "--disaggregation-transfer-backend", "--disaggregation-bootstrap-port",
}  # fmt: skip
NO_EFFECT_PREFIX = "accepted, no effect here: "


def _flags(argv: list[str]) -> list[str]:
    return [a for a in argv if a.startswith("--")]


def _one_device(argv: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(argv):
        flag = argv[i]
        if flag in MULTI_DEVICE:
            i += 1 if MULTI_DEVICE[flag] is None else 2
            continue
        out.append("1" if out and out[-1] == "--tp-size" else flag)
        i += 1
    return out


def _env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _cost(tmp_path: Path) -> str:
    cost = tmp_path / "cost.json"
    cost.write_text('{"decode": {"base_ms": 2.0}, "prefill": {"tokens_per_s": 1000000}}')
    return str(cost)


def test_the_docs_line_as_written_is_refused_in_one_line(tmp_path: Path) -> None:
    assert len(_flags(DOCS_LINE)) == 30
    out = subprocess.run(
        [sys.executable, "-m", "kvadmit.launch_server", *DOCS_LINE, "--simulate", _cost(tmp_path)],
        capture_output=True, text=True, env=_env(), timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "kvadmit serve: error: --tp-size 16: kvadmit runs one scheduler on one device: no tensor, pipeline, "
        "data or context parallelism"
    ]


def test_the_docs_line_for_one_device_starts_and_serves(tmp_path: Path) -> None:
    line = _one_device(DOCS_LINE)
    assert len(_flags(line)) == 25 and line[line.index("--tp-size") + 1] == "1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "kvadmit.launch_server", *line, "--simulate", _cost(tmp_path),
            "--port", str(port), "--max-total-tokens", "4096"]  # fmt: skip
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=_env())
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line_read = proc.stderr.readline()
            if not line_read:
                break
            lines.append(line_read.rstrip("\n"))
            if "fired up" in line_read:
                break
        assert any("fired up" in ln for ln in lines), lines
        body = {"text": "Say hello", "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}
        r = httpx.post(f"http://127.0.0.1:{port}/generate", json=body, timeout=60)
        assert r.status_code == 200, r.text
        meta = r.json()["meta_info"]
        assert (meta["prompt_tokens"], meta["completion_tokens"]) == (9, 8)  # the byte tokenizer: 9 bytes
        info = httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=30).json()
        # the implemented flags took effect
        assert (info["max_running_requests"], info["context_length"], info["max_prefill_tokens"]) == (
            8, 8192, 28680
        )  # fmt: skip
        assert info["disable_radix_cache"] is True
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0
    # SGLang's start-up line, with -1: no chunked prefill
    assert any(
        ln.endswith(
            "] max_total_num_tokens=4096, chunked_prefill_size=-1, max_prefill_tokens=28680, "
            "max_running_requests=8, context_len=8192, available_gpu_mem=0.00 GB"
        )
        for ln in lines
    )
    named = [ln for ln in lines if ln.startswith(NO_EFFECT_PREFIX)]
    assert len(named) == 1, lines  # once
    listed = named[0].removeprefix(NO_EFFECT_PREFIX).split(", ")
    assert len(listed) == len(set(listed)) and set(listed) == NO_EFFECT
