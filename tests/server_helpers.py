"""Test helpers for `kvadmit serve`: a tiny model written as a real HF folder, and a real uvicorn server
on a free port in a background thread (the same app, state and engine thread as `kvadmit serve`)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def write_tiny_tokenizer(folder: Path, text: str, chat_template: str | None) -> Any:
    """A byte-level BPE tokenizer of 300 tokens trained on `text`, <eos> its one special token (id 0), with
    `chat_template` when given; saved to `folder` and returned."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([text * 4] * 10, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(folder)
    return fast


def write_tiny_model(folder: Path, max_position_embeddings: int = 2048) -> Path:
    """A 2-layer random Llama with a trained byte-level BPE tokenizer and a chat template."""
    import torch
    import transformers

    fast = write_tiny_tokenizer(
        folder, "the quick brown fox jumps over the lazy dog. stop here. ", CHAT_TEMPLATE
    )
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=fast.vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_position_embeddings,
        eos_token_id=fast.eos_token_id,
    )  # fmt: skip
    transformers.LlamaForCausalLM(cfg).float().eval().save_pretrained(folder, safe_serialization=True)
    return folder


def write_cost_model(path: Path, decode_ms: float = 2.0, tokens_per_s: float = 1e6) -> str:
    path.write_text(json.dumps({"decode": {"base_ms": decode_ms}, "prefill": {"tokens_per_s": tokens_per_s}}))
    return str(path)


@dataclass
class RunningServer:
    url: str
    state: Any
    log_lines: list[str] = field(default_factory=list)

    @property
    def runner(self) -> Any:
        return self.state.runner


class _ListHandler(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class RecordBodies:
    """ASGI middleware that appends (path, JSON body) for every POST the server receives."""

    def __init__(self, app: Any, seen: list[tuple[str, Any]]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        parts: list[bytes] = []

        async def recording_receive() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                parts.append(message.get("body", b""))
                if not message.get("more_body"):
                    raw = b"".join(parts)
                    self.seen.append((scope["path"], json.loads(raw) if raw else None))
            return message

        await self.app(scope, recording_receive, send)


@contextmanager
def running_server(argv: list[str], seen: list[tuple[str, Any]] | None = None) -> Iterator[RunningServer]:
    """`kvadmit serve ARGV` on 127.0.0.1:<free port>; stops it (and checks the engine thread ended).
    With `seen`, every POST body the server receives is appended to it as (path, JSON)."""
    import uvicorn

    from kvadmit.cli import build_parser, server_args_from
    from kvadmit.server.app import create_app
    from kvadmit.server.main import build_state

    ns = build_parser().parse_args(["serve", *argv])
    lines: list[str] = []
    handler = _ListHandler(lines)
    logger = logging.getLogger("kvadmit.server")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        state = build_state(ns, server_args_from(ns))
        state.runner.start()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        app: Any = create_app(state)
        if seen is not None:
            app = RecordBodies(app, seen)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        try:
            yield RunningServer(f"http://127.0.0.1:{port}", state, lines)
        finally:
            server.should_exit = True
            thread.join(30)
            state.runner.stop()
            assert not state.runner.thread.is_alive(), "the engine thread did not stop"
    finally:
        logger.removeHandler(handler)


def pool_is_whole(srv: RunningServer) -> tuple[int, int]:
    """(free slots after flushing the cache, pool size), read on the engine thread."""

    def read() -> tuple[int, int]:
        s = srv.runner.scheduler
        if s.is_fully_idle():
            s.cache.reset()
        s.check_invariants()
        return s.pool.available_size(), s.max_total_num_tokens

    return srv.runner.call(read).result(10)


def wait_idle(srv: RunningServer, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while srv.runner.call(srv.runner.live_rids).result(10):
        if time.monotonic() > deadline:
            raise AssertionError("requests still in flight")
        time.sleep(0.02)


async def until_load(client: httpx.AsyncClient, running: int, waiting: int) -> None:
    """Poll /get_load until the server runs `running` requests with `waiting` in its queue (a fixed sleep
    is too short on a loaded machine)."""
    deadline = time.monotonic() + 30
    while True:
        row = (await client.get("/get_load")).json()[0]
        if (row["num_reqs"] - row["num_waiting_reqs"], row["num_waiting_reqs"]) == (running, waiting):
            return
        assert time.monotonic() < deadline, f"never {running} running and {waiting} waiting: {row}"
        await asyncio.sleep(0.02)
