"""A real load generator (guidellm 0.8.1) against `kvadmit serve --simulate`: what it reports sending and
receiving equals what the server's Prometheus counters say it served."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fleet_helpers import counters, start_worker, wait_worker

from server_helpers import write_cost_model, write_tiny_tokenizer


def test_guidellm_totals_equal_the_server_counters(tmp_path: Path) -> None:
    n = 40
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    write_tiny_tokenizer(tokenizer, "the quick brown fox jumps over the lazy dog. stop here. ", None)
    cost = write_cost_model(tmp_path / "cost.json", decode_ms=2.0)
    worker = start_worker(cost, tmp_path, ["--tokenizer-path", str(tokenizer)])
    try:
        wait_worker(worker)
        report = tmp_path / "guidellm.json"
        # validate_backend=false: its probe request is not one of the n it reports
        argv = [str(Path(sys.executable).with_name("guidellm")), "run",
                "--backend", f"kind=openai_http,target={worker.url},model=simulated,"
                             "request_format=/v1/completions,validate_backend=false",
                "--profile", "kind=concurrent,streams=4",
                "--constraint", f"kind=max_requests,count={n}",
                "--data", "kind=synthetic_text,prompt_tokens=48,prompt_tokens_stdev=16,prompt_tokens_min=8,"
                          "prompt_tokens_max=96,output_tokens=12,output_tokens_stdev=6,output_tokens_min=1,"
                          "output_tokens_max=24",
                "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
                "--output", f"kind=json,path={report}", "--disable-console"]  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        run = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        served = counters(worker.url)
    finally:
        worker.stop()
    bench = json.loads(report.read_text())["benchmarks"][0]
    made = bench["scheduler_metrics"]["requests_made"]
    done = bench["requests"]["successful"]
    prompt = sum(r["prompt_tokens"] for r in done)
    output = sum(r["output_tokens"] for r in done)
    print(f"guidellm: {made}, prompt tokens {prompt}, output tokens {output}; server counters {served}")
    assert made == {"successful": n, "errored": 0, "incomplete": 0, "total": n}
    assert len(done) == n
    assert served["sglang:num_requests"] == n
    assert served["sglang:prompt_tokens"] == prompt
    assert served["sglang:generation_tokens"] == output
    assert len({r["prompt_tokens"] for r in done}) > 1  # the lengths vary, so the sums are not n x a mean
