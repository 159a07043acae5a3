"""The mission document's small-pool run against the real server (tiny model): a pool of 4,096 tokens,
16 clients each sending 256 prompt + 512 output tokens with ignore_eos. Each admitted request reserves
256 + 512 = 768 tokens, so 4096 // 768 = 5 run and the other 11 wait: the server log shows five running
and eleven queued, and /metrics shows sglang:num_queue_reqs 11."""

from __future__ import annotations

import random
import re
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from server_helpers import pool_is_whole, running_server, wait_idle, write_tiny_model

DECODE = re.compile(r"Decode batch, #running-req: (\d+), .* #queue-req: (\d+)")


def gauge(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                return s.value
    raise KeyError(name)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-mission"))


def test_small_pool_five_run_eleven_wait(tiny_model: Path) -> None:
    argv = ["--model-path", str(tiny_model), "--max-total-tokens", "4096", "--enable-metrics",
            "--dtype", "float32", "--decode-log-interval", "10"]  # fmt: skip
    rng = random.Random(0)
    with running_server(argv) as srv:
        statuses: list[int] = []

        def client(i: int) -> None:
            # A distinct first token per prompt: no shared prefix, so every request reserves 768.
            ids = [i + 1] + [rng.randrange(20, 290) for _ in range(255)]
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 512, "ignore_eos": True}}
            statuses.append(httpx.post(f"{srv.url}/generate", json=body, timeout=300).status_code)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        seen = None
        while seen is None:
            assert time.monotonic() < deadline, "no decode line with all 16 requests in"
            for line in list(srv.log_lines):
                m = DECODE.search(line)
                if m and int(m.group(1)) + int(m.group(2)) == 16:
                    seen = (int(m.group(1)), int(m.group(2)))
            time.sleep(0.05)
        assert seen == (5, 11)
        text = httpx.get(f"{srv.url}/metrics").text
        assert gauge(text, "sglang:num_queue_reqs") == 11
        assert gauge(text, "sglang:num_running_reqs") == 5
        # 5 × 768 = 3,840 of 4,096 reserved; the pool is used up to what the forecast allows.
        assert 0.3 < gauge(text, "sglang:token_usage") <= 0.94
        prefill = [ln for ln in srv.log_lines if "Prefill batch" in ln]
        assert prefill and all("#running-req: " in ln for ln in prefill)
        assert not any("Retract" in ln for ln in srv.log_lines)
        assert httpx.post(f"{srv.url}/abort_request", json={"abort_all": True}).status_code == 200
        for t in threads:
            t.join(60)
        assert len(statuses) == 16 and all(s in (200, 499) for s in statuses)
        wait_idle(srv)
        free, size = pool_is_whole(srv)
        assert free == size == 4096
