"""The FastAPI application: routes, OpenAI-shaped error handling, engine attachment.

Handlers only validate, await the tokenizer pool and the engine bridge, and format
bytes; nothing here computes on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from llmservice.server.api import lora_routes, sleep_routes
from llmservice.server.api.chat import create_chat_completion
from llmservice.server.api.completions import create_completion
from llmservice.server.api.errors import APIError, describe_validation_errors, error_response
from llmservice.server.api.guards import APIKeyMiddleware, BodyLimitMiddleware
from llmservice.server.api.loop_probe import probe_event_loop
from llmservice.server.api.openapi_limits import with_server_limits
from llmservice.server.api.protocol import (
    ERROR_RESPONSES,
    GENERATION_RESPONSES,
    HEALTH_RESPONSES,
    METRICS_RESPONSES,
    PROMETHEUS_TEXT,
    UNAVAILABLE_RESPONSES,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelList,
    TokenizeChatRequest,
    TokenizeRequest,
    TokenizeResponse,
)
from llmservice.server.api.responses import create_response
from llmservice.server.api.responses_protocol import (
    RESPONSES_RESPONSES,
    ResponseObject,
    ResponsesRequest,
)
from llmservice.server.api.serving import ClientDisconnected, ServerState
from llmservice.server.api.tokenizer_service import message_dicts
from llmservice.server.metrics import ServerMetrics
from starlette.exceptions import HTTPException as StarletteHTTPException

import llmservice

log = logging.getLogger("llmservice.api")


def create_app(state: ServerState, metrics: ServerMetrics) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.engine.attach(asyncio.get_running_loop(), metrics)
        probe = asyncio.create_task(probe_event_loop(
            metrics.advisor.loop_lag.observe, observe_busy=metrics.advisor.loop_busy_lag.observe
        ))
        yield
        probe.cancel()
        state.engine.abort(list(state.engine.streams))

    app = FastAPI(title="llmservice", version=llmservice.__version__, lifespan=lifespan)
    app.state.server = state
    app.state.metrics = metrics
    app.include_router(sleep_routes.router)
    app.include_router(sleep_routes.controls, include_in_schema=state.engine.config.enable_sleep_mode)
    app.state.allow_runtime_lora_updating = lora_routes.runtime_updates_allowed()
    app.include_router(lora_routes.controls, include_in_schema=bool(
        state.engine.config.enable_lora and app.state.allow_runtime_lora_updating))
    # Added last = runs first: the key is checked before the body is looked at.
    app.add_middleware(BodyLimitMiddleware, max_bytes=state.max_request_body_bytes)
    if state.api_key is not None:
        app.add_middleware(APIKeyMiddleware, api_key=state.api_key)

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError):
        return error_response(exc.status, exc.message, exc.param, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError):
        message, param = describe_validation_errors(exc.errors())
        return error_response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(ClientDisconnected)
    async def _client_gone(_: Request, exc: ClientDisconnected):
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception):
        log.exception("unhandled error")
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")

    # ---- generation -----------------------------------------------------------------------
    @app.post("/v1/completions", response_model=CompletionResponse, responses=GENERATION_RESPONSES)
    async def completions(body: CompletionRequest, raw: Request):
        return await create_completion(body, raw, state)

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=GENERATION_RESPONSES)
    async def chat_completions(body: ChatCompletionRequest, raw: Request):
        return await create_chat_completion(body, raw, state)

    @app.post("/v1/responses", response_model=ResponseObject, responses=RESPONSES_RESPONSES)
    async def responses(body: ResponsesRequest, raw: Request):
        return await create_response(body, raw, state)

    # ---- models and tokenizer ----------------------------------------------------------------
    @app.get("/v1/models", response_model=ModelList)
    async def models():
        base = [
            {"id": name, "object": "model", "created": state.created, "owned_by": "llmservice",
             "root": state.model_root, "parent": None, "max_model_len": state.max_model_len}
            for name in state.served_model_names
        ]
        adapters = [  # as vLLM lists them: root = the adapter's path (an hf:// one as given), parent = the base
            {"id": name, "object": "model", "created": state.created, "owned_by": "llmservice",
             "root": state.lora_sources.get(path, path), "parent": state.model_name,
             "max_model_len": state.max_model_len}
            for name, path in sorted(state.engine.lora_adapters.items())
        ]
        return {"object": "list", "data": base + adapters}

    @app.post("/tokenize", response_model=TokenizeResponse, responses=ERROR_RESPONSES)
    async def tokenize(body: TokenizeRequest):
        state.check_model(body.model)
        if isinstance(body, TokenizeChatRequest):
            tokens = await state.tokenizer.encode_chat(message_dicts(body.messages), body.add_generation_prompt)
        else:
            tokens = await state.tokenizer.encode(body.prompt, body.add_special_tokens)
        return {"count": len(tokens), "max_model_len": state.max_model_len, "tokens": tokens}

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=ERROR_RESPONSES)
    async def detokenize(body: DetokenizeRequest):
        state.check_model(body.model)
        return {"prompt": await state.tokenizer.decode(body.tokens)}

    # ---- operations ---------------------------------------------------------------------------
    @app.get("/health", response_class=Response, responses=HEALTH_RESPONSES)
    async def health():
        """Liveness: the process answers and its engine core is alive."""
        if state.engine.dead is not None:
            return error_response(503, f"the engine is not running: {state.engine.dead}")
        return Response(status_code=200)

    @app.get("/ready", responses=UNAVAILABLE_RESPONSES)
    async def ready():
        """Readiness: accepting new requests (turns 503 as soon as draining starts)."""
        if state.draining:
            return error_response(503, "draining for shutdown")
        if state.engine.dead is not None:
            return error_response(503, f"the engine is not running: {state.engine.dead}")
        return JSONResponse({"status": "ready"})

    @app.get("/version")
    async def version():
        return {"version": llmservice.__version__}

    @app.get("/metrics", response_class=PlainTextResponse, responses=METRICS_RESPONSES)
    async def prometheus_metrics():
        return Response(metrics.render(), media_type=PROMETHEUS_TEXT)

    with_server_limits(app, state)

    return app
