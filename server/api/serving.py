"""What every generation endpoint does before and around the engine: model check,
admission (draining, queue bound), submission of n engine requests, disconnect watch.

Handlers (completions.py, chat.py) only turn deltas into their response shape.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from fastapi.responses import JSONResponse, StreamingResponse
from llmservice.server.api.backpressure import admission_decision
from llmservice.server.api.engine_client import EngineClient, EngineDeadError
from llmservice.server.api.errors import APIError, error_body
from llmservice.server.api.params import child_params, default_max_tokens
from llmservice.server.api.tokenizer_service import TokenizerService
from llmservice.server.engine.outputs import Delta
from llmservice.server.engine.sampling_params import SamplingParams
from starlette.requests import Request as HTTPRequest


class ClientDisconnected(Exception):
    pass


TRUNCATED_HEADER = "llmservice-truncated"  # why a response ended early (finish_reason length)
TIMEOUT_HEADER = "llmservice-request-timeout-s"  # on streams, sent before any token

@dataclass
class ServerState:
    engine: EngineClient
    tokenizer: TokenizerService
    served_model_names: list[str]
    model_root: str
    max_model_len: int
    scheduling_policy: str
    max_waiting_requests: int | None
    max_tokens_default: int | None = None  # --max-tokens-default
    sampling_defaults: dict[str, float] = field(default_factory=dict)  # generation_config.json
    request_timeout_s: float | None = None  # --request-timeout-s
    tool_call_parser: str | None = None  # --tool-call-parser (None: JSON or Hermes, by the answer's start)
    api_key: str | None = None  # --api-key (checked by guards.APIKeyMiddleware)
    max_request_body_bytes: int = 16 * 1024 * 1024
    download_dir: str | None = None  # --download-dir: where hf:// adapters are downloaded too
    lora_sources: dict[str, str] = field(default_factory=dict)  # an hf:// adapter's folder -> its reference
    draining: bool = False
    reserved: int = 0  # engine requests admitted but not yet registered with the engine client (tokenizing)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.served_model_names and model not in self.engine.lora_adapters:
            served = self.served_model_names + sorted(self.engine.lora_adapters)
            raise APIError(404, f"The model `{model}` does not exist; this server serves {served}", "model")

    def lora_of(self, model: str | None) -> str | None:
        """The LoRA adapter a request's `model` names (None: the base model)."""
        return model if model is not None and model in self.engine.lora_adapters else None

    def admit(self, num_requests: int) -> None:
        """Raise 503 (+Retry-After) when draining or when the queue bound is hit."""
        if self.draining:
            raise APIError(503, "the server is shutting down; retry on another replica", headers={"Retry-After": "1"})
        if self.engine.dead is not None:
            raise APIError(503, f"the engine is not running: {self.engine.dead}")
        decision = admission_decision(
            waiting=self.engine.num_waiting_estimate + self.reserved,
            new=num_requests,
            limit=self.max_waiting_requests,
            running=self.engine.stats.num_running,
        )
        if decision.status == 400:
            raise APIError(400, decision.message, "n")
        if decision.status == 503:
            raise APIError(503, decision.message, headers={"Retry-After": str(decision.retry_after_s)})

    @contextmanager
    def admitted(self, num_requests: int) -> Iterator[Reservation]:
        """Admit, and count the requests as waiting while they are tokenized: without
        this, a burst would pass admission before any of it reached the engine."""
        self.admit(num_requests)
        reservation = Reservation(self, num_requests)
        self.reserved += num_requests
        try:
            yield reservation
        finally:
            reservation.release()

    @property
    def idle(self) -> bool:
        return self.reserved == 0 and self.engine.num_in_flight == 0


@dataclass
class Reservation:
    """Admitted engine requests not yet registered with the engine client. Released
    once they are (from then on the client counts them), so none is counted twice."""

    state: ServerState
    num_requests: int
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.state.reserved -= self.num_requests


@dataclass
class Generation:
    """The engine requests behind one HTTP request: choice index i <-> request_ids[i]."""

    request_ids: list[str]
    prompt_lengths: list[int]  # one per prompt (usage counts each prompt once)
    queue: asyncio.Queue
    watcher: asyncio.Task
    state: ServerState
    index: dict[str, int] = field(default_factory=dict)
    deadline: float | None = None  # time.monotonic() past which generation stops (--request-timeout-s)
    timed_out: bool = False

    def __post_init__(self) -> None:
        self.index = {rid: i for i, rid in enumerate(self.request_ids)}

    async def _next(self):
        if self.deadline is None:
            return await self.queue.get()
        left = self.deadline - time.monotonic()
        if left > 0:
            try:
                return await asyncio.wait_for(self.queue.get(), left)
            except TimeoutError:
                pass
        return None

    async def deltas(self) -> AsyncIterator[tuple[int, Delta]]:
        """(choice index, delta) until every choice finished; raises ClientDisconnected.
        Past the deadline the unfinished choices are aborted and end with finish_reason
        `length` (the request's time ran out as a token budget would)."""
        unfinished = set(self.request_ids)
        while unfinished:
            item = await self._next()
            if item is None:
                self.timed_out = True
                self.state.engine.abort(sorted(unfinished))
                for rid in sorted(unfinished, key=self.index.__getitem__):
                    yield self.index[rid], Delta(rid, [], "", finished=True, finish_reason="length")
                return
            if isinstance(item, BaseException):
                raise item
            if item.finished:
                unfinished.discard(item.request_id)
            yield self.index[item.request_id], item

    def truncation_headers(self) -> dict[str, str]:
        if not self.timed_out:
            return {}
        return {TRUNCATED_HEADER: f"request-timeout: stopped after --request-timeout-s {self.state.request_timeout_s:g}"}

    def close(self) -> None:
        """Abort whatever is unfinished (no-op for finished requests) and stop watching."""
        self.watcher.cancel()
        self.state.engine.abort(self.request_ids)


async def _watch_disconnect(raw: HTTPRequest, gen_ids: list[str], q: asyncio.Queue, engine: EngineClient) -> None:
    while True:
        message = await raw.receive()
        if message["type"] == "http.disconnect":
            engine.abort(gen_ids)  # frees KV blocks even if no handler code runs again
            q.put_nowait(ClientDisconnected())
            return


async def start_generation(
    state: ServerState,
    reservation: Reservation,
    raw: HTTPRequest,
    prompts: list[list[int]],
    params: SamplingParams,
    n: int,
    priority: int,
    arrival_time: float,
    prefix: str,
    lora_name: str | None = None,
) -> tuple[str, Generation]:
    """Submit len(prompts) * n engine requests and wait until the engine accepted all."""
    request_id = f"{prefix}-{uuid.uuid4().hex}"
    ids: list[str] = []
    plist: list[tuple[list[int], SamplingParams]] = []
    for p_idx, prompt in enumerate(prompts):
        prompt_params = default_max_tokens(params, len(prompt), state.max_model_len, state.max_tokens_default)
        for c_idx, sp in enumerate(child_params(prompt_params, n)):
            ids.append(f"{request_id}-{p_idx * n + c_idx}")
            plist.append((prompt, sp))
    q: asyncio.Queue = asyncio.Queue()
    engine = state.engine
    watcher = asyncio.create_task(_watch_disconnect(raw, ids, q, engine))
    deadline = None if state.request_timeout_s is None else arrival_time + state.request_timeout_s
    gen = Generation(ids, [len(p) for p in prompts], q, watcher, state, deadline=deadline)
    try:
        streams = [
            engine.submit(rid, prompt, sp, priority, arrival_time, q, lora_name) for rid, (prompt, sp) in zip(ids, plist, strict=True)
        ]
        reservation.release()  # the engine client counts them now
        await engine.wait_accepted(streams)
    except asyncio.CancelledError:
        gen.close()
        task = asyncio.current_task()
        if task is not None and task.cancelling() == 0:
            # not this handler cancelled: the disconnect watch aborted the admission
            raise ClientDisconnected() from None
        raise
    except BaseException:
        gen.close()
        raise
    return request_id, gen


async def respond(req, request_id: str, gen: Generation, state: ServerState, logprobs: bool, stream, collect):
    """The endpoint's answer: an SSE stream (`stream(...)` yields its events) or one JSON
    body (`await collect(...)`); either way the generation is closed when it ends."""
    model = req.model or state.model_name
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        # Headers go out before the first token: they can only announce the limit.
        headers = {} if state.request_timeout_s is None else {TIMEOUT_HEADER: f"{state.request_timeout_s:g}"}
        return StreamingResponse(
            stream(gen, request_id, model, state.tokenizer, logprobs, include_usage),
            media_type="text/event-stream", headers=headers,
        )
    try:
        body = await collect(gen, request_id, model, state.tokenizer, logprobs)
        return JSONResponse(body, headers=gen.truncation_headers())
    except ClientDisconnected:
        return JSONResponse({}, status_code=499)
    finally:
        gen.close()


def sse(data: dict | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n"


def sse_error(exc: BaseException) -> str:
    if isinstance(exc, APIError):
        return sse(error_body(exc.status, exc.message, exc.param))
    if isinstance(exc, EngineDeadError):
        return sse(error_body(500, f"the engine failed: {exc}"))
    return sse(error_body(500, f"{type(exc).__name__}: {exc}"))


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
