"""/generate's return_logprob on a tiny real model: each output token's log probability, checked against
the same model run by transformers on the prompt and the output (the logits scaled by the temperature, 1
for a greedy request), in SGLang's [logprob, token id, text or null] shape, streamed and not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import transformers

from server_helpers import RunningServer, running_server, write_tiny_model

PROMPT = [5, 17, 42, 8, 99]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-logprobs"))


@pytest.fixture(scope="module")
def srv(tiny_model: Path) -> Iterator[RunningServer]:
    argv = ["--model-path", str(tiny_model), "--max-total-tokens", "2048", "--dtype", "float32"]
    with running_server(argv) as s:
        yield s


def expected_logprobs(folder: Path, prompt: list[int], output: list[int], temperature: float) -> list[float]:
    model = transformers.LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0]
    out = []
    for k, token in enumerate(output):  # output token k is sampled from the logits at position P-1+k
        row = torch.log_softmax(logits[len(prompt) - 1 + k] / temperature, dim=-1)
        out.append(float(row[token]))
    return out


def test_greedy_logprobs_match_the_model_with_text(srv: RunningServer, tiny_model: Path) -> None:
    sp = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    body = {"input_ids": PROMPT, "sampling_params": sp, "return_logprob": True}
    body["return_text_in_logprobs"] = True
    r = httpx.post(f"{srv.url}/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    meta = out["meta_info"]
    rows = meta["output_token_logprobs"]
    assert meta["output_token_logprobs_length"] == 6 and len(rows) == 6
    assert meta["input_token_logprobs"] == []
    assert [row[1] for row in rows] == out["output_ids"]
    assert [row[2] for row in rows] == [srv.state.tokenizer.decode([t]) for t in out["output_ids"]]
    want = expected_logprobs(tiny_model, PROMPT, out["output_ids"], 1.0)
    assert [row[0] for row in rows] == pytest.approx(want, abs=1e-3)
    # the fields sit where SGLang puts them: after num_retractions, before reasoning_tokens
    keys = list(meta)
    assert keys[keys.index("num_retractions") + 1 : keys.index("reasoning_tokens")] == [
        "input_token_logprobs", "output_token_logprobs", "output_token_logprobs_length"]  # fmt: skip


def test_sampled_logprobs_use_the_temperature_and_stream(srv: RunningServer, tiny_model: Path) -> None:
    sp = {"max_new_tokens": 5, "temperature": 0.7, "sampling_seed": 3, "ignore_eos": True}
    body: dict[str, Any] = {"input_ids": PROMPT, "sampling_params": sp, "return_logprob": True}
    body["stream"] = True
    chunks = []
    with httpx.stream("POST", f"{srv.url}/generate", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    for c in chunks:  # each chunk: the logprobs so far, one per token so far, no text asked
        rows = c["meta_info"]["output_token_logprobs"]
        assert [row[1] for row in rows] == c["output_ids"] and all(row[2] is None for row in rows)
    final = chunks[-1]
    assert len(final["output_ids"]) == 5
    want = expected_logprobs(tiny_model, PROMPT, final["output_ids"], 0.7)
    assert [row[0] for row in final["meta_info"]["output_token_logprobs"]] == pytest.approx(want, abs=1e-3)


def test_batch_return_logprob_per_prompt_and_no_logprobs_unless_asked(srv: RunningServer) -> None:
    sp = {"max_new_tokens": 2, "temperature": 0, "ignore_eos": True}
    body = {"input_ids": [PROMPT, PROMPT[:3]], "sampling_params": sp, "return_logprob": [False, True]}
    out = httpx.post(f"{srv.url}/generate", json=body, timeout=60).json()
    assert "output_token_logprobs" not in out[0]["meta_info"]
    assert out[1]["meta_info"]["output_token_logprobs_length"] == 2
    assert "output_top_logprobs" not in out[1]["meta_info"]  # none asked
    r = httpx.post(f"{srv.url}/generate", json={**body, "top_logprobs_num": -1}, timeout=60)
    assert r.status_code == 400 and r.json()["param"] == "top_logprobs_num"


def test_top_logprobs_are_the_most_likely_tokens_of_the_model(srv: RunningServer, tiny_model: Path) -> None:
    sp = {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}
    body = {"input_ids": PROMPT, "sampling_params": sp, "return_logprob": True, "top_logprobs_num": 4}
    out = httpx.post(f"{srv.url}/generate", json=body, timeout=60).json()
    meta = out["meta_info"]
    keys = list(meta)
    assert keys[keys.index("output_token_logprobs_length") + 1 : keys.index("reasoning_tokens")] == [
        "input_top_logprobs", "output_top_logprobs"]  # fmt: skip
    assert meta["input_top_logprobs"] == [] and len(meta["output_top_logprobs"]) == 3
    model = transformers.LlamaForCausalLM.from_pretrained(tiny_model, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + out["output_ids"]])).logits[0]
    for k, (step, token) in enumerate(zip(meta["output_top_logprobs"], out["output_ids"], strict=True)):
        best = torch.log_softmax(logits[len(PROMPT) - 1 + k], dim=-1).topk(4)
        assert [row[1] for row in step] == best.indices.tolist()
        assert [row[0] for row in step] == pytest.approx(best.values.tolist(), abs=1e-3)
        assert step[0][1] == token  # greedy: the sampled token is the most likely
        assert step[0][0] == meta["output_token_logprobs"][k][0]
