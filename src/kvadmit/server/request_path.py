"""The one path every generating request takes, whichever API it came through (/generate,
/v1/completions, /v1/chat/completions).

Each API parses and checks its own body into a Submission, and says how its answers look through an
AnswerForm; from there the path is shared: one Session per prompt submits a Job, a non-streaming request
collects every Outcome (an abort the API refuses becomes its error response), a streaming one sends
server-sent events (on the OpenAI routes a rejection before the first event still gets its status code,
where /generate, as SGLang's, answers it in the stream; a client that goes away aborts its request), and
token counts come from the ends the engine reported.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from kvadmit.request import SamplingLimits
from kvadmit.sampling_params import SamplingParams
from kvadmit.server.errors import APIError
from kvadmit.server.session import Delta, Outcome, Session
from kvadmit.server.sse import DONE, first_event, stream_response
from kvadmit.server.state import ServerState


@dataclass(frozen=True, slots=True)
class Sampling:
    """How to sample one prompt."""

    limits: SamplingLimits  # frozen: prompts of one request may share it
    params: SamplingParams
    stops: list[str]
    skip_special_tokens: bool
    return_logprob: bool = False  # each output token's log probability (a real model only)
    text_in_logprobs: bool = False  # each with its text
    top_logprobs_num: int = 0  # with return_logprob: also the most likely tokens' at each step
    stream_interval: int | None = None  # a stream's tokens go out every this many (None: the server's)


@dataclass(slots=True)
class Submission:
    """A parsed and checked request: its prompts and how to sample each."""

    prompts: list[list[int]]
    samplings: list[Sampling]  # one per prompt
    stream: bool  # a streaming batch (/generate only) interleaves its prompts' events
    rids: list[str | None]  # one per prompt; None: a fresh id


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts as the engine reported them at the requests' ends, summed over the outcomes."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    @classmethod
    def of(cls, outcomes: Iterable[Outcome]) -> Usage:
        ends = [o.finished for o in outcomes]
        return cls(
            sum(f.prompt_tokens for f in ends),
            sum(f.completion_tokens for f in ends),
            sum(f.cached_tokens for f in ends),
        )


class AnswerForm(Protocol):
    """How one API words its answers (one instance per request)."""

    def refuses(self, outcome: Outcome) -> bool:
        """Whether this end of a non-streaming request makes the whole request an error response."""
        ...

    def body(self, sessions: list[Session], outcomes: list[Outcome]) -> Any:
        """A non-streaming request's JSON body."""
        ...

    def opening(self) -> list[bytes]:
        """Events sent before the first token."""
        ...

    def delta(self, session: Session, delta: Delta) -> bytes | None:
        """The event for new text, if any."""
        ...

    def closing(self, session: Session, outcome: Outcome) -> list[bytes]:
        """The events for a request that ended normally (not aborted), before [DONE]."""
        ...

    def aborted(self, session: Session, outcome: Outcome) -> list[bytes]:
        """The events for a stream the engine aborted, before [DONE]."""
        ...

    streams_rejections: bool
    """Whether a stream rejected before its first token is still a stream (else its error response)."""


async def answer(state: ServerState, request: Request, sub: Submission, form: AnswerForm) -> Response:
    triples = zip(sub.prompts, sub.samplings, sub.rids, strict=True)
    sessions = [_session(state, request, sub.stream, ids, sampling, rid) for ids, sampling, rid in triples]
    for i, s in enumerate(sessions):
        s.index = i
    if sub.stream and len(sessions) > 1:
        return stream_response(_interleaved(form, sessions), sessions)
    if not sub.stream:
        outcomes = await asyncio.gather(*(s.result() for s in sessions))
        for o in outcomes:
            if form.refuses(o):
                raise APIError(o.finished.message, o.finished.status_code)
        return JSONResponse(form.body(sessions, list(outcomes)))
    session = sessions[0]
    events, first = await first_event(session, reject=not form.streams_rejections)
    return stream_response(_events(form, session, events, first), session)


def _session(
    state: ServerState, request: Request, stream: bool, ids: list[int], sampling: Sampling, rid: str | None
) -> Session:
    return Session(
        state.runner, ids, sampling.limits, sampling.params, stops=sampling.stops,
        skip_special_tokens=sampling.skip_special_tokens, streaming=stream,
        is_disconnected=request.is_disconnected, rid=rid, received=getattr(request.state, "received", None),
        return_logprob=sampling.return_logprob, top_logprobs_num=sampling.top_logprobs_num,
        stream_interval=sampling.stream_interval,
    )  # fmt: skip


async def _events(
    form: AnswerForm,
    session: Session,
    events: AsyncIterator[Delta | Outcome],
    first: Delta | Outcome | None,
) -> AsyncIterator[bytes]:
    for chunk in form.opening():
        yield chunk
    async for chunk in _session_events(form, session, events, first):
        yield chunk
    yield DONE


async def _interleaved(form: AnswerForm, sessions: list[Session]) -> AsyncIterator[bytes]:
    """A streamed batch, as SGLang streams one: each prompt's events as they come, whichever prompt they
    belong to (the form marks each with its prompt's index), then one [DONE]."""

    async def one(session: Session) -> AsyncIterator[bytes]:
        events = session.events()
        async for chunk in _session_events(form, session, events, await anext(events, None)):
            yield chunk

    async def following(gen: AsyncIterator[bytes]) -> bytes | None:
        return await anext(gen, None)

    for chunk in form.opening():
        yield chunk
    gens = [one(s) for s in sessions]
    pending = {asyncio.ensure_future(following(g)): g for g in gens}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                gen = pending.pop(task)
                chunk = task.result()
                if chunk is not None:
                    yield chunk
                    pending[asyncio.ensure_future(following(gen))] = gen
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for gen in gens:
            await gen.aclose()  # type: ignore[attr-defined]
    yield DONE


async def _session_events(
    form: AnswerForm,
    session: Session,
    events: AsyncIterator[Delta | Outcome],
    first: Delta | Outcome | None,
) -> AsyncIterator[bytes]:
    """One request's events until its end (no opening, no [DONE])."""
    item = first
    while item is not None:
        if isinstance(item, Delta):
            chunk = form.delta(session, item)
            if chunk is not None:
                yield chunk
        else:
            if item.finished.kind == "abort":
                for chunk in form.aborted(session, item):
                    yield chunk
            else:
                for chunk in form.closing(session, item):
                    yield chunk
            break
        item = await anext(events, None)
