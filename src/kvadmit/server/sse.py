"""Server-sent events as SGLang sends them: `data: {json}` lines, a blank line after each, and
`data: [DONE]` at the end. A stream can start only once its request is known to be accepted, so a rejected
request still gets its proper status code (the OpenAI routes; /generate's stream has begun before)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi.responses import StreamingResponse

from kvadmit.server.errors import APIError, error_body
from kvadmit.server.session import Delta, Outcome, Session


def sse(obj: Any) -> bytes:
    """One event, its JSON as SGLang writes it (orjson: compact, UTF-8, non-string keys allowed; a
    non-finite float is null)."""
    return b"data: " + orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS) + b"\n\n"


DONE = b"data: [DONE]\n\n"


async def first_event(
    session: Session, reject: bool = True
) -> tuple[AsyncIterator[Delta | Outcome], Delta | Outcome | None]:
    """Start the request and wait for its first event; with `reject`, an immediate rejection raises its
    APIError."""
    events = session.events()
    first = await anext(events, None)
    if reject and isinstance(first, Outcome) and first.finished.kind == "abort" and not first.output_ids:
        raise APIError(first.finished.message, first.finished.status_code)
    return events, first


class SessionStream(StreamingResponse):
    """An SSE response that aborts its request the moment its client goes away (a watcher reads the
    connection's disconnect while tokens stream; a stream that never waits would otherwise only
    notice at its end), and however else the response ends."""

    def __init__(self, body: AsyncIterator[bytes], sessions: list[Session]) -> None:
        super().__init__(body, media_type="text/event-stream")
        self.sessions = sessions  # one per prompt of the request

    def close(self) -> None:
        for session in self.sessions:
            session.close()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            self.close()

        watcher = asyncio.create_task(watch())
        try:
            await super().__call__(scope, receive, send)
        finally:
            watcher.cancel()
            self.close()


def stream_response(body: AsyncIterator[bytes], session: Session | list[Session]) -> StreamingResponse:
    return SessionStream(body, session if isinstance(session, list) else [session])


def abort_event(outcome: Outcome) -> bytes:
    f = outcome.finished
    return sse(error_body(f.message, f.status_code))
