"""Issue 21's round trip through a server: `kvadmit bench` drives `kvadmit serve --simulate` from a known
workload (random-ids token prompts, Poisson arrivals, bench_serving's default ignore_eos); the doctor
reconstructs the server's own log: the pool exactly, the request rate and the prompt and output length
means within 10%."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from kvadmit.bench.workload import WorkloadSpec, build_workload
from kvadmit.doctor.diagnose import Inputs, diagnose
from kvadmit.doctor.prove import prove
from server_helpers import running_server, wait_idle, write_cost_model

POOL = 3000
SPEC = WorkloadSpec(num_prompts=50, input_len=200, output_len=60, range_ratio=0.5, seed=3)
RATE = 12.0


def test_a_served_log_gives_back_its_pool_rate_and_lengths(tmp_path: Path) -> None:
    cost = write_cost_model(tmp_path / "cost.json", decode_ms=2.0, tokens_per_s=200_000)
    argv = ["--simulate", cost, "--max-total-tokens", str(POOL)]
    with running_server(argv) as srv:
        bench = [
            "bench", "--base-url", srv.url, "--disable-tqdm", "--ready-check-timeout-sec", "5",
            "--dataset-name", "random-ids", "--tokenize-prompt", "--num-prompts", str(SPEC.num_prompts),
            "--random-input-len", str(SPEC.input_len), "--random-output-len", str(SPEC.output_len),
            "--random-range-ratio", str(SPEC.range_ratio), "--seed", str(SPEC.seed),
            "--request-rate", str(RATE), "--warmup-requests", "0",
            "--output-file", str(tmp_path / "bench.jsonl"), "--output-details",
        ]  # fmt: skip
        # In its own process: the client's sleeps then keep the Poisson times (in this one it would share
        # the interpreter with the server's threads and fall behind).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        subprocess.run(
            [sys.executable, "-m", "kvadmit", *bench], check=True, capture_output=True, env=env, timeout=120
        )
        wait_idle(srv)
        lines = list(srv.log_lines)
    log = tmp_path / "served.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    verdict = diagnose(Inputs(log=str(log))).verdict
    rec = prove(str(log), verdict, []).reconstruction
    assert rec is not None
    assert rec.pool.value == POOL and rec.pool.confidence == "exact"
    reqs, _ = build_workload(SPEC)
    # The rate the client kept: when it made each request (bench's --output-details).
    made = sorted(json.loads((tmp_path / "bench.jsonl").read_text(encoding="utf-8"))["arrival_times"])
    true_rate = (len(made) - 1) / (made[-1] - made[0])
    assert rec.arrivals.rate.value == pytest.approx(true_rate, rel=0.10)
    assert rec.prompt_len.value == pytest.approx(statistics.fmean(r.prompt_len for r in reqs), rel=0.10)
    assert rec.output_len.value == pytest.approx(statistics.fmean(r.max_new_tokens for r in reqs), rel=0.10)
