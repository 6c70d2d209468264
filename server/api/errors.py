"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}`.

Clients written for the OpenAI API (the `openai` package raises typed exceptions from
these fields) get the same shape whatever went wrong, including FastAPI's own
validation failures, so no bad input ever surfaces as a bare 500.
"""

from __future__ import annotations

from http import HTTPStatus

from fastapi.responses import JSONResponse

_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestTooLargeError",
    422: "BadRequestError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class APIError(Exception):
    """Raised anywhere in a handler; rendered by the app's exception handler."""

    def __init__(self, status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers or {}


def error_body(status: int, message: str, param: str | None = None) -> dict:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, HTTPStatus(status).phrase.replace(" ", "") + "Error"),
            "param": param,
            "code": status,
        }
    }


def error_response(status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


def describe_validation_errors(errors: list[dict]) -> tuple[str, str | None]:
    """Turn pydantic's error list into one readable sentence and the first bad field."""
    parts = []
    param = None
    for err in errors[:5]:
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        where = ".".join(loc) or "body"
        param = param or (loc[0] if loc else None)
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request", param
