"""POST /v1/chat/completions: messages rendered with the model's own chat template (in
the tokenizer pool, with the request's `tools`), then generated like a completion; SSE
chunks carry `delta`s. Each choice's text goes through a tool parser (tool_parsers.py),
which turns it into `content` and `tool_calls`; with tool_choice none it is all content.
Structured outputs (`response_format`, `structured_outputs`, tool_choice required or a
named function) reach the engine as a grammar on the sampling parameters."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from functools import partial

from llmservice.server.api.errors import APIError
from llmservice.server.api.logprob_values import json_logprob
from llmservice.server.api.params import (
    chat_params,
    check_structured,
    structured_spec,
    with_model_defaults,
    with_structured,
)
from llmservice.server.api.protocol import ChatCompletionRequest
from llmservice.server.api.serving import (
    ClientDisconnected,
    Generation,
    ServerState,
    respond,
    sse,
    sse_error,
    start_generation,
    usage,
)
from llmservice.server.api.tokenizer_service import TokenizerService, message_dicts
from llmservice.server.api.tool_parsers import ToolParser, make_parser, merge, num_calls
from llmservice.server.api.tools import ToolPlan, plan_tools
from llmservice.server.engine.outputs import Delta
from starlette.requests import Request as HTTPRequest


async def chat_logprobs(tok: TokenizerService, delta: Delta) -> list[dict]:
    """OpenAI chat logprobs entries for the delta's tokens."""
    ids = []
    for lp in delta.new_logprobs:
        ids.append(lp.token_id)
        ids.extend(t for t, _ in lp.top)
    strings = await tok.token_strings(ids)
    text_of = dict(zip(ids, strings, strict=True))

    def entry(token_id: int, logprob: float) -> dict:
        s = text_of[token_id]
        return {"token": s, "logprob": json_logprob(logprob), "bytes": list(s.encode("utf-8", "replace"))}

    return [
        {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
        for lp in delta.new_logprobs
    ]


async def create_chat_completion(req: ChatCompletionRequest, raw: HTTPRequest, state: ServerState):
    arrival = time.monotonic()
    state.check_model(req.model)
    params = chat_params(with_model_defaults(req, state.sampling_defaults), state.scheduling_policy, state.max_model_len)
    plan = plan_tools(req)
    spec, param = structured_spec(req), "structured_outputs" if req.structured_outputs else "response_format"
    if plan.spec is not None:
        if spec is not None:
            raise APIError(400, f"tool_choice {plan.mode} constrains the output; {param} cannot as well", param)
        spec, param = plan.spec, (f"tools[{plan.named}].function.parameters" if plan.named else "tools")
    params = with_structured(params, spec)
    parsers = partial(make_parser, plan.mode, plan.names, plan.named, state.tool_call_parser)
    with state.admitted(req.n) as reservation:
        if spec is not None:  # free requests make no extra trip to the pool
            await state.tokenizer.run(check_structured, spec, param)
        prompt = await state.tokenizer.encode_chat(message_dicts(req.messages), req.add_generation_prompt, plan.template_tools)
        request_id, gen = await start_generation(state, reservation, raw, [prompt], params, req.n, req.priority, arrival, "chatcmpl",
                                                   state.lora_of(req.model))
    tools = {"plan": plan, "make": parsers}
    logprobs = params.logprobs is not None
    return await respond(req, request_id, gen, state, logprobs, partial(_stream, **tools), partial(_collect, **tools))


def _finish_reason(reason: str | None, parser: ToolParser, plan: ToolPlan) -> str | None:
    """OpenAI: `tool_calls` when the model stopped to call tools (a named tool_choice stops)."""
    if reason == "stop" and plan.mode in ("auto", "required") and num_calls(parser):
        return "tool_calls"
    return reason


async def _collect(
    gen: Generation, request_id: str, model: str, tok: TokenizerService, logprobs: bool, *,
    plan: ToolPlan, make: Callable[[], ToolParser],
) -> dict:
    count = len(gen.request_ids)
    texts: list[list[str]] = [[] for _ in range(count)]
    tokens = [0] * count
    lps: list[list[dict]] = [[] for _ in range(count)]
    finish: list[tuple[str | None, int | str | None]] = [(None, None)] * count
    parsers = [make() for _ in range(count)]
    async for i, delta in gen.deltas():
        if logprobs and delta.new_logprobs:
            lps[i].extend(await chat_logprobs(tok, delta))
        texts[i].append(delta.new_text)
        tokens[i] += len(delta.new_token_ids)
        if delta.finished:
            finish[i] = (delta.finish_reason, delta.stop_reason)
    choices = []
    for i in range(count):
        parser = parsers[i]
        content, calls = merge(parser.feed("".join(texts[i])) + parser.finish())
        message: dict = {"role": "assistant", "content": content if content or not calls else None}
        if calls:
            message["tool_calls"] = calls
        choices.append({
            "index": i,
            "message": message,
            "logprobs": {"content": lps[i]} if logprobs else None,
            "finish_reason": _finish_reason(finish[i][0], parser, plan),
            "stop_reason": finish[i][1],
        })
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(sum(gen.prompt_lengths), sum(tokens)),
    }


async def _stream(
    gen: Generation, request_id: str, model: str, tok: TokenizerService, logprobs: bool, include_usage: bool,
    *, plan: ToolPlan, make: Callable[[], ToolParser],
) -> AsyncIterator[str]:
    created = int(time.time())
    head = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model}
    completion_tokens = 0
    parsers = [make() for _ in range(len(gen.request_ids))]
    try:
        for i in range(len(gen.request_ids)):
            role = {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            yield sse({**head, "choices": [role]})
        async for i, delta in gen.deltas():
            completion_tokens += len(delta.new_token_ids)
            parser = parsers[i]
            pieces = parser.feed(delta.new_text)
            if delta.finished:
                pieces += parser.finish()
            lp = {"content": await chat_logprobs(tok, delta)} if logprobs and delta.new_logprobs else None
            if plan.mode == "none" and not pieces and not delta.finished:
                pieces = [{"content": ""}]  # free text: one chunk per step, as before
            if lp is not None and not pieces:
                pieces = [{}]  # the parser holds the text back; its logprobs still go out
            for k, piece in enumerate(pieces):
                last = delta.finished and k == len(pieces) - 1
                choice = {
                    "index": i,
                    "delta": piece,
                    "logprobs": lp if k == 0 else None,
                    "finish_reason": _finish_reason(delta.finish_reason, parser, plan) if last else None,
                    "stop_reason": delta.stop_reason if last else None,
                }
                yield sse({**head, "choices": [choice]})
            if delta.finished and not pieces:
                choice = {
                    "index": i,
                    "delta": {},
                    "logprobs": None,
                    "finish_reason": _finish_reason(delta.finish_reason, parser, plan),
                    "stop_reason": delta.stop_reason,
                }
                yield sse({**head, "choices": [choice]})
        if include_usage:
            yield sse({**head, "choices": [], "usage": usage(sum(gen.prompt_lengths), completion_tokens)})
        yield sse("[DONE]")
    except ClientDisconnected:
        return
    except Exception as exc:
        yield sse_error(exc)
        yield sse("[DONE]")
    finally:
        gen.close()
