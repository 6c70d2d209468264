"""POST /v1/responses: the Responses API as a view of chat completions.

The request becomes the chat completion it means (input items -> messages, flat
function tools -> chat tools, `text.format` -> `response_format`) and runs through
chat.py unchanged: the chat template, tool planning and parsing, grammars, admission
and the engine are the chat path's. Its stream (always streamed, with usage) is read
back chunk by chunk and turned into Responses events (responses_stream.py); the
non-streamed answer is the final event's response. The chat path's 400s name chat's
fields, so they are renamed to the ones this request sent.

Nothing is stored: `store` is accepted, `previous_response_id` is a 400.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator

from fastapi.responses import JSONResponse, StreamingResponse
from llmservice.server.api.chat import create_chat_completion
from llmservice.server.api.errors import APIError, describe_validation_errors
from llmservice.server.api.protocol import SSE, ChatCompletionRequest
from llmservice.server.api.responses_protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionToolChoice,
    InputItem,
    ResponsesRequest,
    TextConfig,
)
from llmservice.server.api.responses_stream import ChatStreamError, ResponseEvents, sse_event
from llmservice.server.api.serving import TIMEOUT_HEADER, ClientDisconnected, ServerState
from pydantic import ValidationError
from starlette.requests import Request as HTTPRequest


def _text(content: str | list) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


def input_messages(instructions: str | None, items: str | list[InputItem]) -> list[dict]:
    """Chat messages for the template, as vLLM builds them: `instructions` is a system
    message first; a function_call is an assistant tool call (consecutive calls, and a
    call right after an assistant message, join that message, as chat's parallel calls
    do); a function_call_output is a `tool` message."""
    messages: list[dict] = [{"role": "system", "content": instructions}] if instructions is not None else []
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    for item in items:
        if isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)})
        else:
            messages.append({"role": item.role, "content": _text(item.content)})
    return messages


def response_format(text: TextConfig | None) -> dict | None:
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": fmt.model_dump(by_alias=True, exclude={"type"}, exclude_none=True)}


def chat_request(req: ResponsesRequest) -> ChatCompletionRequest:
    """The chat completion `req` asks for, always streamed with usage (see the module doc)."""
    body: dict = {
        "model": req.model,
        "messages": input_messages(req.instructions, req.input),
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "user": req.user,
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": response_format(req.text),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if req.tools:
        body["tools"] = [
            {"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)} for tool in req.tools
        ]
    choice = req.tool_choice
    body["tool_choice"] = {"type": "function", "function": {"name": choice.name}} if isinstance(choice, FunctionToolChoice) else choice
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:  # the models agree, so this names a gap between them
        message, param = describe_validation_errors(exc.errors())
        raise APIError(400, f"the request has no chat equivalent: {message}", param) from exc


def check_supported(req: ResponsesRequest) -> None:
    """400s for what the schema states as unsupported (it allows only the no-op values)."""
    if req.previous_response_id is not None:
        raise APIError(
            400,
            "previous_response_id is not supported: this server stores no responses; "
            "send the earlier turns as input items (their output items, function_call_output for tool results)",
            "previous_response_id",
        )
    if req.conversation is not None:
        raise APIError(400, "conversation is not supported: this server stores no conversations", "conversation")
    if req.background:
        raise APIError(400, "background is not supported: this server stores no responses to poll", "background")
    if req.prompt is not None:
        raise APIError(400, "prompt (a stored prompt template) is not supported; send input", "prompt")
    if req.include:
        raise APIError(400, f"include is not supported by this server (got {req.include}); omit it", "include")
    if req.top_logprobs:
        raise APIError(400, "top_logprobs is not supported by this server; omit it or send 0", "top_logprobs")


# chat's field names in its 400s -> the ones of this request
_RENAMES = (
    (re.compile(r"\bresponse_format\b"), "text.format"),
    (re.compile(r"\bmessages\b"), "input"),
    (re.compile(r"\bmax_tokens\b"), "max_output_tokens"),
    (re.compile(r"(\btools\[[^\]]*\])\.function\.parameters\b"), r"\1.parameters"),
)


def _renamed(text: str | None) -> str | None:
    if text is None:
        return None
    for pattern, name in _RENAMES:
        text = pattern.sub(name, text)
    return text


def response_head(req: ResponsesRequest, state: ServerState) -> dict:
    """The response object's fields that echo the request (what was applied)."""
    defaults = state.sampling_defaults
    fmt = req.text.format if req.text is not None and req.text.format is not None else None
    choice = req.tool_choice
    return {
        "id": "resp_",  # ResponseEvents takes the rest from the chat request's id
        "object": "response",
        "created_at": int(time.time()),
        "model": req.model or state.model_name,
        "error": None,
        "incomplete_details": None,
        "usage": None,
        "instructions": req.instructions,
        "metadata": req.metadata or {},
        "max_output_tokens": req.max_output_tokens,
        "temperature": req.temperature if req.temperature is not None else defaults.get("temperature", 1.0),
        "top_p": req.top_p if req.top_p is not None else defaults.get("top_p", 1.0),
        "parallel_tool_calls": req.parallel_tool_calls,
        "tools": [tool.model_dump() for tool in req.tools or []],
        "tool_choice": choice.model_dump() if isinstance(choice, FunctionToolChoice) else choice or ("auto" if req.tools else "none"),
        "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
        "truncation": "disabled",
        "user": req.user,
        "store": req.store is not False,
        "background": False,
        "previous_response_id": None,
    }


async def chat_chunks(body: AsyncGenerator) -> AsyncGenerator[dict, None]:
    """The chat stream's chunks as dicts, until `[DONE]`; the chat stream is closed
    (its engine requests aborted if unfinished) however this ends."""
    try:
        async for event in body:
            data = (event.decode() if isinstance(event, bytes) else event).removeprefix("data: ").strip()
            if data == "[DONE]":
                return
            yield json.loads(data)
    finally:
        await body.aclose()


async def _stream(events: ResponseEvents, chunks: AsyncGenerator[dict, None]) -> AsyncIterator[str]:
    try:
        async for chunk in chunks:
            for event in events.chunk(chunk):
                yield sse_event(event)
    except ChatStreamError as exc:
        yield sse_event(events.error(exc.error))
    finally:
        await chunks.aclose()


async def _collect(events: ResponseEvents, chunks: AsyncGenerator[dict, None]) -> dict:
    try:
        async for chunk in chunks:
            events.chunk(chunk)
    except ChatStreamError as exc:
        error = exc.error
        raise APIError(int(error.get("code") or 500), _renamed(error.get("message")) or "error",
                       _renamed(error.get("param"))) from exc
    finally:
        await chunks.aclose()
    if events.final is None:  # the chat stream ends early only when the client has gone
        raise ClientDisconnected()
    return events.final


async def create_response(req: ResponsesRequest, raw: HTTPRequest, state: ServerState):
    check_supported(req)
    try:
        chat = await create_chat_completion(chat_request(req), raw, state)
    except APIError as exc:
        raise APIError(exc.status, _renamed(exc.message) or "", _renamed(exc.param), exc.headers) from exc
    events = ResponseEvents(response_head(req, state))
    chunks = chat_chunks(chat.body_iterator)
    if req.stream:
        headers = {k: v for k, v in chat.headers.items() if k == TIMEOUT_HEADER}
        return StreamingResponse(_stream(events, chunks), media_type=SSE, headers=headers)
    return JSONResponse(await _collect(events, chunks))
