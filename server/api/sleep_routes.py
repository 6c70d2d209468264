"""Sleep mode's endpoints, with vLLM's names: POST /sleep?level=1|2, POST /wake_up,
GET /is_sleeping. While asleep (and from the moment /sleep is called), generation
requests are answered 503 with Retry-After rather than held: a router or autoscaler that
sees it calls /wake_up (docs/cold-start.md).

/sleep and /wake_up are in `controls`, which the app leaves out of /openapi.json unless
--enable-sleep-mode is on: without it they only answer 400 (naming the flag), and the
document lists what the server can do. /is_sleeping works either way."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from llmservice.server.api.errors import APIError
from llmservice.server.api.protocol import APIModel, ErrorResponse

router = APIRouter(tags=["sleep mode"])
controls = APIRouter(tags=["sleep mode"])


class SleepStatus(APIModel):
    is_sleeping: bool
    level: int  # 0: awake; 1: KV freed, weights on the host; 2: weights discarded
    seconds: float | None = None  # how long the sleep or wake-up took in the engine


_JSON = "application/json"
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "a bad level (or sleep mode is off: --enable-sleep-mode)",
          "content": {_JSON: {}}},
    401: {"model": ErrorResponse, "description": "missing or wrong API key (--api-key)", "content": {_JSON: {}}},
    503: {"model": ErrorResponse, "description": "the engine is not running, or a wake-up failed",
          "content": {_JSON: {}}},
}
_OK = {200: {"content": {_JSON: {}}}}


def _engine(raw: Request) -> Any:
    engine = raw.app.state.server.engine
    if not engine.config.enable_sleep_mode:
        raise APIError(400, "sleep mode is off: start the server with --enable-sleep-mode")
    return engine


@controls.post("/sleep", response_model=SleepStatus, responses={**_OK, **_ERRORS})
async def sleep(raw: Request, level: int = Query(1, ge=1, le=2, description="1: KV freed, weights to host memory; "
                                                                            "2: weights discarded too")):
    """Free the device's memory once the running requests finish; answers when asleep."""
    answer = await _engine(raw).sleep(level)
    if answer.error is not None:
        raise APIError(400, answer.error, "level")
    return SleepStatus(is_sleeping=answer.level > 0, level=answer.level, seconds=answer.seconds)


@controls.post("/wake_up", response_model=SleepStatus, responses={**_OK, **_ERRORS})
async def wake_up(raw: Request):
    """Restore the weights and the KV pool; answers when the engine can serve again."""
    answer = await _engine(raw).wake_up()
    if answer.error is not None:
        raise APIError(503, answer.error)
    return SleepStatus(is_sleeping=False, level=0, seconds=answer.seconds)


@router.get("/is_sleeping", response_model=SleepStatus, responses={**_OK, 401: _ERRORS[401]})
async def is_sleeping(raw: Request):
    engine = raw.app.state.server.engine
    return SleepStatus(is_sleeping=engine.sleep_level > 0, level=engine.sleep_level)
