"""A request's stream from the engine thread to its handler (channels.Stream, session.Session): a Delta
per step; the tokens that come with the end are in the end's answer (SGLang's last chunk carries the last
token); an idle wait gives up after its timeout;
--stream-interval and sampling_params.stream_interval as SGLang sends by them."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx

from kvadmit.model.byte_tokenizer import ByteTokenizer
from kvadmit.request import SamplingLimits
from kvadmit.sampling_params import SamplingParams
from kvadmit.server.channels import Finished, Stream, Tokens
from kvadmit.server.session import Delta, Outcome, Session
from server_helpers import running_server, write_cost_model


class _Runner:
    """Stands in for the engine runner: records the job, never runs it."""

    def __init__(self) -> None:
        self.backend = SimpleNamespace(tokenizer=ByteTokenizer())
        self.metrics = None
        self.jobs: list[Any] = []
        self.aborted: list[str] = []

    def submit(self, job: Any) -> None:
        self.jobs.append(job)

    def abort(self, rid: str) -> None:
        self.aborted.append(rid)


def _session(runner: _Runner, stops: list[str] | None = None) -> Session:
    async def connected() -> bool:
        return False

    return Session(runner, [104, 105], SamplingLimits(requested_max_new_tokens=10), SamplingParams(),  # type: ignore[arg-type]
                   stops=stops or [], skip_special_tokens=True, streaming=True,
                   is_disconnected=connected, rid="r")  # fmt: skip


def _tokens(text: str) -> Tokens:
    return Tokens(list(text.encode()), cached_tokens=0, retractions=0)


def _end(n: int) -> Finished:
    return Finished("length", None, "", 200, prompt_tokens=2, completion_tokens=n, cached_tokens=0)


def test_each_step_is_one_delta_and_the_tokens_with_the_end_are_in_the_outcome() -> None:
    async def run() -> list[Delta | Outcome]:
        runner = _Runner()
        session = _session(runner)
        events = session.events()
        stream = session.stream
        first = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0)  # the handler waits for its first output
        stream._push(_tokens("a"))
        got: list[Delta | Outcome] = [await first]
        for item in (_tokens("b"), _tokens("cd")):  # two steps' tokens, taken in one go
            stream._push(item)
        got += [await anext(events), await anext(events)]
        stream._push(_tokens("e"))  # the last step's token and the end, delivered together
        stream._push(_end(5))
        got.append(await anext(events))
        assert await anext(events, None) is None
        assert runner.aborted == []  # ended normally: nothing to abort
        return got

    a, b, cd, last = asyncio.run(run())
    assert isinstance(a, Delta) and (a.text, a.token_ids) == ("a", [97])
    assert isinstance(b, Delta) and (b.text, b.token_ids) == ("b", [98])
    assert isinstance(cd, Delta) and (cd.text, cd.token_ids) == ("cd", [99, 100])
    assert isinstance(last, Outcome)
    assert (last.text, last.final_delta, last.output_ids) == ("abcde", "e", [97, 98, 99, 100, 101])


def test_held_back_text_is_released_in_the_end_that_comes_with_the_last_tokens() -> None:
    async def run() -> list[Delta | Outcome]:
        session = _session(_Runner(), stops=["xyz"])
        events = session.events()
        first = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0)
        session.stream._push(_tokens("abx"))  # the last len("xyz") - 1 characters are held back
        got: list[Delta | Outcome] = [await first]
        session.stream._push(_tokens("q"))
        session.stream._push(_end(4))
        got.append(await anext(events))
        return got

    delta, end = asyncio.run(run())
    assert isinstance(delta, Delta) and delta.text == "a"
    assert isinstance(end, Outcome) and (end.text, end.final_delta) == ("abxq", "bxq")


def test_take_returns_everything_queued_at_once_and_nothing_after_its_timeout() -> None:
    async def run() -> tuple[list[Any], list[Any], float]:
        stream = Stream(asyncio.get_running_loop())
        stream.put(_tokens("a"))  # from another thread's point of view: delivered through the loop
        stream.put(_end(1))
        await asyncio.sleep(0)
        both = await stream.take(1.0)
        began = time.perf_counter()
        none = await stream.take(0.05)
        return both, none, time.perf_counter() - began

    both, none, waited = asyncio.run(run())
    assert [type(x) for x in both] == [Tokens, Finished]
    assert none == [] and 0.04 <= waited < 1.0


def _streamed_lengths(url: str, sp: dict[str, Any]) -> list[int]:
    """The output_ids length of each chunk of a streamed /generate (the last one carries the end)."""
    body = {"text": "go", "sampling_params": {**sp, "ignore_eos": True}, "stream": True}
    lengths = []
    with httpx.stream("POST", f"{url}/generate", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                lengths.append(len(json.loads(line[6:])["output_ids"]))
    return lengths


def test_stream_interval_sends_the_first_token_then_every_nth_and_the_end(tmp_path: Path) -> None:
    # SGLang's --stream-interval 3: token 1 at once, then when 3 are unsent (4, 7), and the end (8);
    # sampling_params.stream_interval overrides it per request (2: 1, 3, 5). A 30 ms step: the handler
    # takes each output before the next.
    cost = write_cost_model(tmp_path / "cost.json", decode_ms=30.0)
    with running_server(["--simulate", cost, "--stream-interval", "3"]) as srv:
        assert _streamed_lengths(srv.url, {"max_new_tokens": 8}) == [1, 4, 7, 8]
        assert _streamed_lengths(srv.url, {"max_new_tokens": 5, "stream_interval": 2}) == [1, 3, 5]
        bad = {"text": "go", "sampling_params": {"stream_interval": -1}}
        r = httpx.post(f"{srv.url}/generate", json=bad, timeout=10)
        assert r.status_code == 400 and "stream_interval" in r.json()["error"]["message"]
