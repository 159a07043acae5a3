"""The channels between the HTTP handlers and the engine thread.

In: a Job is what a handler hands over; commands (submit, abort, a read of scheduler state) wait in the
Mailbox until the engine thread runs them between steps. Out: each request's Stream carries its new token
ids (Tokens), then one Finished; the Outbox gathers what one step has for the handlers and delivers it with
one wake-up per event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvadmit.request import SamplingLimits
from kvadmit.sampling_params import SamplingParams

log = logging.getLogger("kvadmit.server")


@dataclass(frozen=True, slots=True)
class Finished:
    """How a request ended, as its handler needs it."""

    kind: str  # "stop" | "length" | "abort"
    matched: int | str | None
    message: str
    status_code: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    first_token_time: float | None = None  # wall clock, taken on the engine thread
    retractions: int = 0  # times the scheduler retracted it
    times: dict[str, Any] | None = None  # --enable-metrics: SGLang's scheduler time stats (request_times.py)


@dataclass(frozen=True, slots=True)
class Tokens:
    """New token ids of a running request, with what the engine knows of it so far."""

    ids: list[int]
    cached_tokens: int  # prompt tokens served from the prefix cache (known once it was first prefilled)
    retractions: int
    logprobs: list[float] | None = None  # with return_logprob: the new tokens' log probabilities
    top_logprobs: list[list[tuple[float, int]]] | None = None  # with top_logprobs_num: (logprob, id)s
    times: dict[str, Any] | None = None  # --enable-metrics: SGLang's scheduler time stats so far


class Stream:
    """One request's channel from the engine thread to its handler: Tokens, then one Finished. The handler
    takes everything that arrived since it last looked in one go (one wait, however many steps)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: list[Tokens | Finished] = []
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: Tokens | Finished) -> None:  # any thread
        self._loop.call_soon_threadsafe(self._push, item)

    def _push(self, item: Tokens | Finished) -> None:  # the event loop's thread
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def take(self, timeout: float) -> list[Tokens | Finished]:
        """What arrived since the last take, in order, waiting up to timeout seconds for something ([] if
        nothing came). One future and one timer per wait: no task per token, as asyncio.wait_for makes."""
        if not self._items:
            waiter = self._waiter = self._loop.create_future()
            timer = self._loop.call_later(timeout, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        items, self._items = self._items, []
        return items


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Outbox:
    """What one engine step has for the handlers, delivered with one wake-up per event loop (not one
    per token per request: with a hundred streams that is most of a step's cost)."""

    def __init__(self) -> None:
        self._items: list[tuple[Stream, Tokens | Finished]] = []

    def put(self, stream: Stream, item: Tokens | Finished) -> None:
        self._items.append((stream, item))

    def flush(self) -> None:
        if not self._items:
            return
        items, self._items = self._items, []
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Stream, Tokens | Finished]]] = {}
        for stream, item in items:
            by_loop.setdefault(stream._loop, []).append((stream, item))
        for loop, batch in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a closed event loop: nobody is left to read these
                loop.call_soon_threadsafe(_deliver, batch)


def _deliver(batch: list[tuple[Stream, Tokens | Finished]]) -> None:
    for stream, item in batch:
        stream._push(item)


@dataclass(slots=True)
class Job:
    """One request as a handler hands it to the engine thread."""

    rid: str
    input_ids: list[int]
    limits: SamplingLimits
    params: SamplingParams
    stream: Stream
    stop: list[str] = field(default_factory=list)
    stream_tokens: bool = True  # False: all tokens come with the end (a non-streaming request)
    return_logprob: bool = False  # the tokens come with their log probabilities
    top_logprobs_num: int = 0  # and those of the most likely tokens at each step
    stream_interval: int | None = None  # sampling_params.stream_interval (None: the server's)
    received: float = field(default_factory=time.monotonic)  # when its HTTP request reached the app
    handed: float = 0.0  # when the HTTP side handed it to the engine thread (submit)


class Mailbox:
    """Commands for the engine thread, sent from any thread and run between steps. Once closed (the loop
    has ended), a command runs at once on the sender's thread, so none is ever left unanswered."""

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._closing = threading.Lock()
        self._closed = False

    def send(self, command: Callable[[], None]) -> None:  # any thread
        with self._closing:
            if not self._closed:
                self._commands.put(command)
                self._wake.set()
                return
        command()  # the loop has ended: nothing else touches the engine now, answer here
        self._outbox.flush()

    def clear_wake(self) -> None:
        self._wake.clear()

    def wait(self, timeout: float) -> None:
        """Until a command arrives or timeout seconds pass."""
        self._wake.wait(timeout)

    def run_pending(self) -> None:  # engine thread
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                command()
            except Exception:  # one bad command must not take the loop down
                log.error("An engine command failed:\n%s", traceback.format_exc())

    def close(self) -> None:
        """The loop has ended: run what is left, and from now on run commands on the sender's thread."""
        with self._closing:
            self._closed = True
            self.run_pending()
            self._outbox.flush()
