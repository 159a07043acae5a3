"""`kvadmit serve` on a tiny real model, driven by real clients: the official openai package (chat and
completions, streaming and not), raw httpx SSE on /generate, and /metrics read with prometheus_client's
parser. The numbers must agree with what the requests did."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from server_helpers import RunningServer, pool_is_whole, running_server, wait_idle, write_tiny_model

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-serve"))


@pytest.fixture(scope="module")
def srv(tiny_model: Path) -> Iterator[RunningServer]:
    argv = ["--model-path", str(tiny_model), "--max-total-tokens", "2048", "--enable-metrics",
            "--dtype", "float32", "--served-model-name", "tiny"]  # fmt: skip
    with running_server(argv) as s:
        yield s


def metrics(srv: RunningServer) -> dict[str, float]:
    """Each sample as 'name{label=value,...}' → value (labels sorted, model/engine labels dropped)."""
    text = httpx.get(f"{srv.url}/metrics").text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k not in ("model_name", "engine_type", "tp_rank",
                                                                      "pp_rank", "moe_ep_rank")}  # fmt: skip
            inner = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
            key = s.name + ("{" + inner + "}" if labels else "")
            out[key] = s.value
    return out


def client(srv: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0)


def test_openai_client_chat_and_completions_agree_with_metrics(srv: RunningServer) -> None:
    before = metrics(srv)
    c = client(srv)
    usages = []
    chat = c.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "the quick brown fox"}], max_tokens=7,
        temperature=0, extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert chat.object == "chat.completion"
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage.completion_tokens == 7
    usages.append(chat.usage)
    comp = c.completions.create(model="tiny", prompt="over the lazy dog", max_tokens=5, temperature=0,
                                extra_body={"ignore_eos": True})  # fmt: skip
    assert comp.object == "text_completion"
    assert comp.usage.completion_tokens == 5 and comp.choices[0].finish_reason == "length"
    usages.append(comp.usage)
    # The same prompt, streamed: the same greedy text, chunk by chunk; usage in the last chunk.
    chunks = list(c.completions.create(model="tiny", prompt="over the lazy dog", max_tokens=5, temperature=0,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True}))  # fmt: skip
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == comp.choices[0].text
    assert chunks[-1].usage.completion_tokens == 5
    usages.append(chunks[-1].usage)
    chat_chunks = list(c.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "the quick brown fox"}], max_tokens=7,
        temperature=0, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    ))  # fmt: skip
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chat_chunks if ch.choices)
    assert streamed == chat.choices[0].message.content
    assert chat_chunks[0].choices[0].delta.role == "assistant"
    usages.append(chat_chunks[-1].usage)
    wait_idle(srv)
    after = metrics(srv)
    # Token counters equal the usage fields summed (streaming and not).
    gen = sum(after[f"sglang:generation_tokens_total{{is_streaming={s}}}"] for s in ("true", "false"))
    gen0 = sum(before[f"sglang:generation_tokens_total{{is_streaming={s}}}"] for s in ("true", "false"))
    assert gen - gen0 == sum(u.completion_tokens for u in usages) == 24
    prompt = sum(after[f"sglang:prompt_tokens_total{{is_streaming={s}}}"] for s in ("true", "false"))
    prompt0 = sum(before[f"sglang:prompt_tokens_total{{is_streaming={s}}}"] for s in ("true", "false"))
    assert prompt - prompt0 == sum(u.prompt_tokens for u in usages)
    assert after["sglang:num_requests_total{is_streaming=true}"] - before[
        "sglang:num_requests_total{is_streaming=true}"] == 2  # fmt: skip
    assert after["sglang:time_to_first_token_seconds_count{is_streaming=false}"] >= 2
    # Cached tokens: the repeated prompts hit the radix cache.
    assert comp.usage.prompt_tokens_details.cached_tokens == 0
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0
    assert after["sglang:max_total_num_tokens"] == 2048
    free, size = pool_is_whole(srv)
    assert free == size


def test_native_generate_streams_sse_and_answers_meta_info(srv: RunningServer) -> None:
    sp = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    body = {"text": "the quick", "sampling_params": sp}
    plain = httpx.post(f"{srv.url}/generate", json=body, timeout=30).json()
    meta = plain["meta_info"]
    assert meta["completion_tokens"] == 6 and len(plain["output_ids"]) == 6
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["prompt_tokens"] == len(srv.state.tokenizer.encode("the quick"))
    assert meta["e2e_latency"] > 0
    events = []
    with httpx.stream("POST", f"{srv.url}/generate", json={**body, "stream": True}, timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line:
                assert line.startswith("data: ")
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["text"] == plain["text"]  # cumulative text, as SGLang streams it
    assert chunks[-1]["meta_info"]["completion_tokens"] == 6
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[0] >= 1


def test_stop_string_cuts_text_in_stream_and_not(srv: RunningServer) -> None:
    c = client(srv)
    full = c.completions.create(model="tiny", prompt="the", max_tokens=20, temperature=0,
                                extra_body={"ignore_eos": True}).choices[0].text  # fmt: skip
    stop = full[5:8]
    assert stop and stop in full
    cut = c.completions.create(model="tiny", prompt="the", max_tokens=20, temperature=0, stop=[stop],
                               extra_body={"ignore_eos": True})  # fmt: skip
    assert cut.choices[0].text == full[: full.find(stop)]
    assert cut.choices[0].finish_reason == "stop"
    stream = c.completions.create(
        model="tiny", prompt="the", max_tokens=20, temperature=0, stop=[stop], stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    streamed = "".join(ch.choices[0].text for ch in stream)
    assert streamed == cut.choices[0].text  # no piece of the stop string leaked into the stream


def test_models_model_info_server_info(srv: RunningServer) -> None:
    models = client(srv).models.list()
    assert [m.id for m in models.data] == ["tiny"]
    info = httpx.get(f"{srv.url}/model_info").json()
    assert info == httpx.get(f"{srv.url}/get_model_info").json()
    assert Path(info["tokenizer_path"]).is_dir()
    server_info = httpx.get(f"{srv.url}/server_info").json()
    state = server_info["internal_states"][0]
    assert server_info["max_total_tokens"] == 2048 and server_info["schedule_conservativeness"] == 1.0
    assert state["max_total_num_tokens"] == 2048
    assert state["available_tokens"] + state["evictable_tokens"] + state["used_tokens"] == 2048
    assert state["new_token_ratio"] == pytest.approx(0.7)  # idle: the ratio is back at its start
    assert httpx.get(f"{srv.url}/get_server_info").status_code == 200
    assert httpx.get(f"{srv.url}/health").status_code == 200
    assert httpx.get(f"{srv.url}/health_generate").status_code == 200
    assert httpx.post(f"{srv.url}/flush_cache").status_code == 200


def test_seed_makes_sampling_reproducible(srv: RunningServer) -> None:
    c = client(srv)

    def once(seed: int) -> str:
        return c.completions.create(model="tiny", prompt="the quick", max_tokens=10, temperature=1.0,
                                    seed=seed, extra_body={"ignore_eos": True}).choices[0].text  # fmt: skip

    assert once(7) == once(7)
