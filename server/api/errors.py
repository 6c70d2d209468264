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
    """Turn pydantic's error list into one readable sentence and the first bad field.

    A field typed as a union (a prompt is a string or a list of ...) fails once per branch;
    the branches of the wrong type ("Input should be a valid list") only hide the one that
    says what is wrong with the value sent, so they are dropped when another remains.
    """
    errors = _without_wrong_type_branches(errors)
    parts = []
    param = None
    for err in errors[:5]:
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        where = ".".join(loc) or "body"
        param = param or (loc[0] if loc else None)
        parts.append(f"{where}: {_message(err)}")
    return "; ".join(parts) or "invalid request", param


def _message(err: dict) -> str:
    if err.get("type") in ("string_too_short", "too_short") and (err.get("ctx") or {}).get("min_length") == 1:
        return "must not be empty"
    return err.get("msg", "invalid")


def _without_wrong_type_branches(errors: list[dict]) -> list[dict]:
    def field(err: dict) -> tuple:
        return tuple(p for p in err.get("loc", ()) if p != "body")[:1]

    def wrong_type(err: dict) -> bool:
        return str(err.get("type", "")).endswith("_type")

    kept = []
    for err in errors:
        siblings = [e for e in errors if field(e) == field(err) and e is not err]
        if wrong_type(err) and any(not wrong_type(e) for e in siblings):
            continue
        kept.append(err)
    return kept
