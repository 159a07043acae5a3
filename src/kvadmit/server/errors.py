"""Errors the server answers with: OpenAI's error shape, a status code, and a message that names the
field and says what is allowed."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 499: "ClientClosed",
          503: "ServiceUnavailableError", 500: "InternalServerError"}  # fmt: skip


class APIError(Exception):
    def __init__(self, message: str, status_code: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.status_code, self.param)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code)


def error_body(message: str, status_code: int, param: str | None = None) -> dict[str, Any]:
    return {
        "object": "error",
        "message": message,
        "type": _TYPES.get(status_code, "Error"),
        "param": param,
        "code": status_code,
        "error": {
            "message": message,
            "type": "invalid_request_error" if status_code == 400 else _TYPES.get(status_code, "Error"),
            "param": param,
            "code": status_code,
        },
    }
