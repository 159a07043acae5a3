"""The FastAPI application: routes, the API key check, and error handlers that turn every client mistake
into a 4xx with OpenAI's error shape (never a 500, never a traceback)."""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from kvadmit.server import info_api, load_api, native_api, openai_api
from kvadmit.server.errors import APIError, error_body
from kvadmit.server.state import ServerState

log = logging.getLogger("kvadmit.server")
OPEN_PATHS = ("/health", "/health_generate", "/ready", "/metrics")


def _describe(errors: list[Any]) -> tuple[str, str | None]:
    """One message naming each bad field (pydantic's locations, without the leading 'body')."""
    parts = []
    param = None
    for err in errors[:5]:
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        where = ".".join(loc) or "body"
        param = param or where
        if err.get("type") == "json_invalid":
            ctx = err.get("ctx", {}).get("error", "")
            parts.append(f"the body is not valid JSON ({ctx})" if ctx else "the body is not valid JSON")
        elif err.get("type") == "missing":
            parts.append(f"{where}: field required")
        else:
            parts.append(f"{where}: {err.get('msg', 'invalid')} (got {err.get('input')!r:.60})")
    return "; ".join(parts), param


class JSONBodies:
    """Bodies are JSON whatever their Content-Type says (`curl -d '{…}'` sends a form type), as SGLang
    reads them: a POST or PUT without a JSON type is given one before routing."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] in ("POST", "PUT"):
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            ctype = dict(scope["headers"]).get(b"content-type", b"")
            if b"json" not in ctype:
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


class StampReceipt:
    """When the request reached the app (request.state.received, monotonic seconds), before body parsing
    and whatever else the event loop had to do first: --trace-requests' http_ms starts here."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})["received"] = time.monotonic()
        await self.app(scope, receive, send)


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="kvadmit", version="0.1.0")
    app.add_middleware(JSONBodies)
    app.state.kvadmit = state

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> Response:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> Response:
        message, param = _describe(list(exc.errors()))
        return JSONResponse(error_body(message, 400, param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> Response:
        return JSONResponse(error_body(str(exc.detail), exc.status_code), status_code=exc.status_code)

    @app.exception_handler(ConnectionAbortedError)
    async def client_gone(_: Request, exc: ConnectionAbortedError) -> Response:
        # the client disconnected before its answer; its request was aborted. Nobody reads this.
        return JSONResponse(
            error_body("The client disconnected; the request was aborted.", 499), status_code=499
        )

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> Response:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", 500), status_code=500)

    if state.api_key:

        @app.middleware("http")
        async def check_api_key(request: Request, call_next: Any) -> Response:
            if (
                request.method != "OPTIONS"
                and not request.url.path.startswith(OPEN_PATHS)
                and request.headers.get("authorization") != f"Bearer {state.api_key}"
            ):
                return JSONResponse(
                    error_body("Invalid or missing API key (send 'Authorization: Bearer <key>').", 401),
                    status_code=401,
                )
            return await call_next(request)

    if state.enable_metrics and state.runner.metrics is not None:
        from kvadmit.server.http_metrics import CountHTTP

        app.add_middleware(CountHTTP, metrics=state.runner.metrics)  # a 401 is counted too
    app.add_middleware(StampReceipt)  # added last: the outermost layer, the first to see a request
    app.include_router(native_api.router(state))
    app.include_router(openai_api.router(state))
    app.include_router(info_api.router(state))
    app.include_router(load_api.router(state))
    return app
