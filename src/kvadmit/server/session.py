"""One request from the HTTP side: submit a Job, turn token ids into text as they arrive, hold back what
might still become a stop string, and make sure the request ends exactly once (aborted if the client
goes away), recording the request-side metrics at its end."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from kvadmit.model.detokenize import IncrementalDetokenizer
from kvadmit.request import SamplingLimits
from kvadmit.sampling_params import SamplingParams
from kvadmit.server.channels import Finished, Job, Stream, Tokens
from kvadmit.server.runner import EngineRunner
from kvadmit.stop_strings import cut_at_stop, shown_length

POLL_S = 0.05  # how often a waiting handler checks whether its client is still there


@dataclass(slots=True)
class Delta:
    text: str  # new text safe to show
    token_ids: list[int]  # the new tokens


@dataclass(slots=True)
class Outcome:
    finished: Finished
    text: str  # the whole output text (stop string cut)
    output_ids: list[int]
    e2e_latency: float
    ttft: float | None
    final_delta: str  # text not yet emitted as a Delta
    logprobs: list[float] | None = None  # with return_logprob: one per output token
    top_logprobs: list[list[tuple[float, int]]] | None = None  # with top_logprobs_num: one per output token
    extra: dict[str, Any] = field(default_factory=dict)
    times: dict[str, Any] | None = None  # --enable-metrics: the scheduler's time stats at the end
    # --enable-metrics: wall clock when it was received, handed to the scheduler, first produced output,
    # and ended (what request_times.api_side turns into SGLang's fields)
    wall: tuple[float, float, float | None, float] | None = None


class TextAssembler:
    """Output text as tokens arrive. While a stop string could still be forming at the end, its first
    characters are held back, so a streamed text never shows part of a stop string it later cuts."""

    def __init__(self, tokenizer: Any, stops: list[str], skip_special_tokens: bool) -> None:
        self.detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
        self.stops = stops
        self.emitted = 0

    def add(self, ids: list[int]) -> str:
        self.detok.add(ids)
        text = self.detok.text
        safe = shown_length(text, self.stops)
        if safe <= self.emitted:
            return ""
        delta = text[self.emitted : safe]
        self.emitted = safe
        return delta

    def finish(self, matched: int | str | None) -> tuple[str, str]:
        """(the whole text, what is left to emit)."""
        self.detok.flush()
        text = cut_at_stop(self.detok.text, matched)
        rest = text[self.emitted :] if len(text) > self.emitted else ""
        self.emitted = max(self.emitted, len(text))
        return text, rest


class Session:
    def __init__(
        self,
        runner: EngineRunner,
        input_ids: list[int],
        limits: SamplingLimits,
        params: SamplingParams,
        *,
        stops: list[str],
        skip_special_tokens: bool,
        streaming: bool,
        is_disconnected: Callable[[], Awaitable[bool]],
        rid: str | None = None,
        received: float | None = None,  # monotonic time the HTTP request reached the app
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        stream_interval: int | None = None,
    ) -> None:
        import asyncio

        self.runner = runner
        self.rid = rid or uuid.uuid4().hex
        self.index = 0  # its prompt's place in a batch
        self.input_ids = input_ids
        self.streaming = streaming
        self.is_disconnected = is_disconnected
        self.stream = Stream(asyncio.get_running_loop())
        self.job = Job(self.rid, input_ids, limits, params, self.stream, stops, stream_tokens=streaming,
                       received=received if received is not None else time.monotonic(),
                       return_logprob=return_logprob, top_logprobs_num=top_logprobs_num,
                       stream_interval=stream_interval)  # fmt: skip
        self.text = TextAssembler(runner.backend.tokenizer, stops, skip_special_tokens)
        self.output_ids: list[int] = []
        self.cached_tokens = 0  # as the engine last reported them (known once the prompt was prefilled)
        self.retractions = 0
        self.logprobs: list[float] | None = [] if return_logprob else None  # one per output token
        self.top_logprobs: list[list[tuple[float, int]]] | None = [] if top_logprobs_num else None
        self.start = time.perf_counter()
        self.start_wall = time.time()
        self.dispatched_wall = self.start_wall  # when the job was handed to the engine thread
        self.first_output_wall: float | None = None  # when its first tokens reached this handler
        self.times: dict[str, Any] | None = None  # --enable-metrics: the scheduler's time stats so far
        self.ttft: float | None = None
        self._last_token_at: float | None = None
        self._itls: list[float] = []
        self.outcome: Outcome | None = None
        self._closed = False
        self._recorded = False  # request-side metrics are taken once, at the first end seen

    async def events(self) -> AsyncIterator[Delta | Outcome]:
        """A Delta for each step's tokens, then the Outcome; the last step's tokens, which arrive with the
        end, come in the Outcome (SGLang sends them in its last chunk). If the consumer stops early (the
        client went away) or the client disconnects while waiting, the request is aborted in the engine."""
        self.runner.submit(self.job)
        self.dispatched_wall = time.time()
        try:
            while True:
                items = await self.stream.take(POLL_S)
                if not items and await self.is_disconnected():
                    return
                for i, item in enumerate(items):
                    if isinstance(item, Finished):
                        self.outcome = self._finish(item)
                        yield self.outcome
                        return
                    self._arrived(item)
                    if i + 1 < len(items) and isinstance(items[i + 1], Finished):
                        self.text.detok.add(item.ids)  # their text: in the Outcome's final_delta
                        continue
                    yield Delta(self.text.add(item.ids), item.ids)
        finally:
            self.close()

    def _arrived(self, tokens: Tokens) -> None:
        if self.streaming:  # (a non-streaming request's tokens all come with its end)
            now = time.perf_counter()
            if self.ttft is None:
                self.ttft = now - self.start
            elif self._last_token_at is not None:
                self._itls.append(now - self._last_token_at)
            self._last_token_at = now
        self._progress(tokens)

    def _progress(self, tokens: Tokens) -> None:
        if self.first_output_wall is None:
            self.first_output_wall = time.time()
        self.times = tokens.times
        self.output_ids.extend(tokens.ids)
        self.cached_tokens = tokens.cached_tokens
        self.retractions = tokens.retractions
        if self.logprobs is not None and tokens.logprobs is not None:
            self.logprobs.extend(tokens.logprobs)
        if self.top_logprobs is not None and tokens.top_logprobs is not None:
            self.top_logprobs.extend(tokens.top_logprobs)

    def close(self) -> None:
        """If the request has not ended, abort it (the client is gone). Safe to call more than once."""
        if self.outcome is None and not self._closed:
            self._closed = True
            self.runner.abort(self.rid)
            self._record(aborted=True, completion_tokens=len(self.output_ids), cached=0)

    async def result(self) -> Outcome:
        async for event in self.events():
            if isinstance(event, Outcome):
                return event
        raise ConnectionAbortedError("the client disconnected")

    def _finish(self, finished: Finished) -> Outcome:
        if self.ttft is None and finished.first_token_time is not None:
            # a non-streaming request: its tokens came with the end; the first one's time did not
            self.ttft = max(0.0, finished.first_token_time - self.start_wall)
        text, rest = self.text.finish(finished.matched)
        e2e = time.perf_counter() - self.start
        self._record(
            aborted=finished.kind == "abort",
            completion_tokens=finished.completion_tokens,
            cached=finished.cached_tokens,
        )
        logprobs = None if self.logprobs is None else list(self.logprobs)
        tops = None if self.top_logprobs is None else list(self.top_logprobs)
        # SGLang takes the scheduler's first-token time when it has one (a non-streaming request's tokens
        # reach the handler only with its end), else when the first output arrived
        first = finished.first_token_time if finished.first_token_time is not None else self.first_output_wall
        wall = (self.start_wall, self.dispatched_wall, first, time.time())
        return Outcome(finished, text, list(self.output_ids), e2e, self.ttft, rest, logprobs, tops,
                       times=finished.times, wall=wall)  # fmt: skip

    def _record(self, *, aborted: bool, completion_tokens: int, cached: int) -> None:
        metrics = self.runner.metrics
        if metrics is None or self._recorded:
            return
        self._recorded = True
        metrics.request_done(
            streaming=self.streaming,
            prompt_tokens=len(self.input_ids),
            completion_tokens=completion_tokens,
            cached_tokens=cached,
            aborted=aborted,
            ttft=self.ttft,
            e2e=time.perf_counter() - self.start,
            itls=self._itls,
            priority=self.job.limits.priority,
        )
