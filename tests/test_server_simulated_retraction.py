"""`serve --simulate` retracts like a GPU server: requests that ask for far more tokens than they use make
the ratio decay and admission bold, the pool fills during decode, and the server prints SGLang's
retraction lines and counts them in /metrics. Every request still ends exactly once with its tokens."""

from __future__ import annotations

import asyncio
import random
import re
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from server_helpers import pool_is_whole, running_server, wait_idle, write_cost_model

RETRACT = re.compile(
    r"KV cache pool is full\. Retract requests\. #retracted_reqs: (\d+), #new_tokens_gained: (\d+), "
    r"#new_token_ratio: (\d\.\d{4}) -> (\d\.\d{4})"
)


def sample(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                return s.value
    raise KeyError(name)


def test_retractions_are_logged_and_counted(tmp_path: Path) -> None:
    cost = write_cost_model(tmp_path / "cost.json", decode_ms=0.2)
    argv = ["--simulate", cost, "--max-total-tokens", "600", "--enable-metrics"]
    with running_server(argv) as srv:

        async def one(i: int, client: httpx.AsyncClient) -> dict:
            # prompt of 40 bytes; asks for 400 tokens, stops where the simulator's draw says
            body = {"prompt": f"{i:04d}" * 10, "max_tokens": 400, "seed": i}
            r = await client.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            return r.json()

        async def run() -> list[dict]:
            async with httpx.AsyncClient(base_url=srv.url, timeout=300) as client:
                return await asyncio.gather(*(one(i, client) for i in range(60)))

        answers = asyncio.run(run())
        wait_idle(srv)
        lines = [m for ln in srv.log_lines if (m := RETRACT.search(ln))]
        assert lines, "no retraction happened"
        for m in lines:
            old, new = float(m.group(3)), float(m.group(4))
            assert new > old  # a retraction makes admission more careful
        text = httpx.get(f"{srv.url}/metrics").text
        assert sample(text, "sglang:num_retracted_requests_total") == sum(int(m.group(1)) for m in lines)
        # Each request got the length the simulator drew for it: its own, not cut, not doubled.
        for i, a in enumerate(answers):
            drawn = random.Random(i).randint(2, 400)  # serve --simulate-output-len uniform: [2, max_tokens]
            assert a["usage"]["completion_tokens"] == drawn
            # SGLang 0.5.22 checks stop tokens before the length limit: an EOS drawn as the 400th (last
            # allowed) token ends the request as "stop" too
            assert a["choices"][0]["finish_reason"] == "stop"
        free, size = pool_is_whole(srv)
        assert free == size
