"""SGLang's HTTP series (sglang:http_requests_total, http_responses_total, http_requests_active): an ASGI
middleware counting every request by the route it reaches (its path template; the raw path when no route
matches in full, a wrong method included) and method, and every response by its status code."""

from __future__ import annotations

from typing import Any

from starlette.routing import Match

from kvadmit.server.metrics import ServerMetrics

_MAX_REMEMBERED = 1024


def route_path(scope: Any) -> str:
    """The path of the first route that matches the request in full, else the request's own path."""
    app = scope.get("app")
    for route in getattr(app, "routes", ()):
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return str(getattr(route, "path", scope["path"]))
    return str(scope["path"])


class CountHTTP:
    """Counts a request when it arrives, its response when the status line is sent, and the requests in
    flight until each answer is done (or the connection is gone)."""

    def __init__(self, app: Any, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics
        # (method, path) → endpoint: the routes are matched once per distinct request line, not per
        # request. Bounded, since unmatched paths are the client's to choose.
        self._endpoints: dict[tuple[str, str], str] = {}

    def _endpoint(self, scope: Any) -> str:
        key = (scope["method"], scope["path"])
        endpoint = self._endpoints.get(key)
        if endpoint is None:
            endpoint = route_path(scope)
            if len(self._endpoints) < _MAX_REMEMBERED:
                self._endpoints[key] = endpoint
        return endpoint

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint, method = self._endpoint(scope), scope["method"]
        self.metrics.http_request_started(endpoint, method)

        async def counting_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                self.metrics.http_response(endpoint, method, int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            self.metrics.http_request_ended(endpoint, method)
