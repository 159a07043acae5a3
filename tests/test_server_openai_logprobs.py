"""OpenAI logprobs from the real model: `logprobs`/`top_logprobs` on chat, `logprobs: N` on completions,
in SGLang's shapes, streamed and not; the numbers are /generate's return_logprob ones (which
test_server_logprobs.py checks against transformers); a simulated server refuses them with a 400."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from server_helpers import RunningServer, running_server, write_cost_model, write_tiny_model

PROMPT = [5, 17, 42, 8, 99]
GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    folder = write_tiny_model(tmp_path_factory.mktemp("tiny-openai-logprobs"))
    argv = ["--model-path", str(folder), "--max-total-tokens", "2048", "--dtype", "float32"]
    with running_server(argv) as s:
        yield s


def _native(srv: RunningServer, ids: list[int], n: int, top: int) -> dict[str, Any]:
    """/generate's answer for the same greedy request, with its logprobs."""
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, **GREEDY}, "return_logprob": True,
            "top_logprobs_num": top, "return_text_in_logprobs": True}  # fmt: skip
    return httpx.post(f"{srv.url}/generate", json=body, timeout=60).json()


def _stream(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
    return out


def _bytes(tok: Any, t: int) -> list[int]:
    """A token's raw bytes read with transformers' own GPT-2 table (the tiny model's BPE is byte-level)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    return [byte_of[c] for c in tok.convert_ids_to_tokens(t)]


def _lossless(tok: Any, t: int) -> str:
    """SGLang's completions text: a token that is part of a character, one Latin-1 character a byte."""
    text = tok.decode([t])
    if "\ufffd" not in text:
        return text
    raw = bytes(_bytes(tok, t))
    try:
        raw.decode("utf-8")
        return text
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _close(got: list[float], want: list[float]) -> bool:
    """The same numbers up to float noise (a cached prefix is computed in another batch shape)."""
    return got == pytest.approx(want, abs=1e-4)


def test_completions_logprobs_are_the_models(srv: RunningServer) -> None:
    body = {"prompt": PROMPT, "max_tokens": 4, "logprobs": 3, **GREEDY}
    r = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    meta = _native(srv, PROMPT, 4, 3)["meta_info"]
    tok = srv.state.tokenizer
    assert list(lp) == ["text_offset", "token_logprobs", "tokens", "top_logprobs"]
    assert lp["text_offset"] == [-1, -1, -1, -1]  # SGLang: "not supported yet"
    assert _close(lp["token_logprobs"], [row[0] for row in meta["output_token_logprobs"]])
    assert lp["tokens"] == [_lossless(tok, row[1]) for row in meta["output_token_logprobs"]]
    for got, step in zip(lp["top_logprobs"], meta["output_top_logprobs"], strict=True):
        assert list(got) == [_lossless(tok, t) for _, t, _ in step]  # three, most likely first
        assert _close(list(got.values()), [v for v, _, _ in step])
    # logprobs 0: each token's own log probability, no alternatives
    lp0 = httpx.post(f"{srv.url}/v1/completions", json={**body, "logprobs": 0}, timeout=60).json()
    assert _close(lp0["choices"][0]["logprobs"]["token_logprobs"], lp["token_logprobs"])
    assert lp0["choices"][0]["logprobs"]["top_logprobs"] == []
    # not asked: null, as before
    plain = httpx.post(f"{srv.url}/v1/completions", json={**body, "logprobs": None}, timeout=60).json()
    assert plain["choices"][0]["logprobs"] is None


def test_a_streamed_completion_carries_each_chunks_logprobs(srv: RunningServer) -> None:
    body = {"prompt": PROMPT, "max_tokens": 4, "logprobs": 2, **GREEDY}
    whole = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60).json()["choices"][0]["logprobs"]
    chunks = _stream(f"{srv.url}/v1/completions", body)
    parts = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]]
    for key in ("tokens", "text_offset"):
        assert [x for p in parts for x in p[key]] == whole[key], key
    assert _close([x for p in parts for x in p["token_logprobs"]], whole["token_logprobs"])
    assert [list(d) for p in parts for d in p["top_logprobs"]] == [list(d) for d in whole["top_logprobs"]]


def test_chat_logprobs_and_top_logprobs(srv: RunningServer) -> None:
    messages = [{"role": "user", "content": "the quick"}]
    body = {"messages": messages, "max_tokens": 5, "logprobs": True, "top_logprobs": 2, **GREEDY}
    r = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == out["usage"]["completion_tokens"] == 5
    tok = srv.state.tokenizer
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok.encode(text, add_special_tokens=False)  # the prompt the server builds
    meta = _native(srv, ids, 5, 2)["meta_info"]
    rows = zip(content, meta["output_token_logprobs"], meta["output_top_logprobs"], strict=True)
    for entry, row, tops in rows:
        assert list(entry) == ["token", "bytes", "logprob", "top_logprobs"]
        assert entry["token"] == tok.decode([row[1]]) and _close([entry["logprob"]], [row[0]])
        assert entry["bytes"] == _bytes(tok, row[1])
        assert [t["token"] for t in entry["top_logprobs"]] == [tok.decode([i]) for _, i, _ in tops]
        assert _close([t["logprob"] for t in entry["top_logprobs"]], [v for v, _, _ in tops])
        assert entry["top_logprobs"][0]["logprob"] == entry["logprob"]  # greedy: the most likely one
    streamed = _stream(f"{srv.url}/v1/chat/completions", body)
    got = [e for c in streamed if c["choices"] and c["choices"][0].get("logprobs")
           for e in c["choices"][0]["logprobs"]["content"]]  # fmt: skip
    assert [e["token"] for e in got] == [e["token"] for e in content]
    assert _close([e["logprob"] for e in got], [e["logprob"] for e in content])
    # top_logprobs without logprobs asks for nothing, as in SGLang; no logprobs: no field
    plain = httpx.post(f"{srv.url}/v1/chat/completions", json={**body, "logprobs": False}, timeout=60).json()
    assert "logprobs" not in plain["choices"][0]


def test_bad_counts_are_400s(srv: RunningServer) -> None:
    chat = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "logprobs": True,
        "top_logprobs": -1,
    }
    r = httpx.post(f"{srv.url}/v1/chat/completions", json=chat, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["message"] == "top_logprobs must be ≥ 0, got -1"
    r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "hi", "logprobs": -2}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["message"] == "logprobs must be ≥ 0, got -2"


def test_a_simulated_server_has_no_logprobs(tmp_path: Path) -> None:
    message = ("logprobs: this server simulates its model (serve --simulate) and has no model to compute log "
               "probabilities from")  # fmt: skip
    with running_server(["--simulate", write_cost_model(tmp_path / "cost.json")]) as s:
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "logprobs": True}
        cases = [("/v1/chat/completions", chat), ("/v1/completions", {"prompt": "hi", "logprobs": 0}),
                 ("/v1/completions", {"prompt": "hi", "logprobs": 1, "stream": True})]  # fmt: skip
        for path, body in cases:
            r = httpx.post(f"{s.url}{path}", json=body, timeout=60)
            assert r.status_code == 400, (path, r.text)
            assert r.json()["error"]["message"] == message and r.json()["error"]["param"] == "logprobs"
        # without logprobs it answers
        r = httpx.post(f"{s.url}/v1/chat/completions", json={**chat, "logprobs": False}, timeout=60)
        assert r.status_code == 200


def test_the_byte_table_is_gpt2s() -> None:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from kvadmit.server.token_bytes import _byte_of_char

    assert _byte_of_char() == {c: b for b, c in bytes_to_unicode().items()}
