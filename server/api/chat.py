"""POST /v1/chat/completions: messages rendered with the model's own chat template (in
the tokenizer pool), then generated like a completion; SSE chunks carry `delta`s."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from llmservice.server.api.params import chat_params, with_model_defaults
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
        return {"token": s, "logprob": logprob, "bytes": list(s.encode("utf-8", "replace"))}

    return [
        {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
        for lp in delta.new_logprobs
    ]


async def create_chat_completion(req: ChatCompletionRequest, raw: HTTPRequest, state: ServerState):
    arrival = time.monotonic()
    state.check_model(req.model)
    params = chat_params(with_model_defaults(req, state.sampling_defaults), state.scheduling_policy, state.max_model_len)
    with state.admitted(req.n) as reservation:
        prompt = await state.tokenizer.encode_chat(message_dicts(req.messages), req.add_generation_prompt)
        request_id, gen = await start_generation(state, reservation, raw, [prompt], params, req.n, req.priority, arrival, "chatcmpl")
    return await respond(req, request_id, gen, state, params.logprobs is not None, _stream, _collect)


async def _collect(gen: Generation, request_id: str, model: str, tok: TokenizerService, logprobs: bool) -> dict:
    count = len(gen.request_ids)
    texts: list[list[str]] = [[] for _ in range(count)]
    tokens = [0] * count
    lps: list[list[dict]] = [[] for _ in range(count)]
    finish: list[tuple[str | None, int | str | None]] = [(None, None)] * count
    async for i, delta in gen.deltas():
        if logprobs and delta.new_logprobs:
            lps[i].extend(await chat_logprobs(tok, delta))
        texts[i].append(delta.new_text)
        tokens[i] += len(delta.new_token_ids)
        if delta.finished:
            finish[i] = (delta.finish_reason, delta.stop_reason)
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": "".join(texts[i])},
            "logprobs": {"content": lps[i]} if logprobs else None,
            "finish_reason": finish[i][0],
            "stop_reason": finish[i][1],
        }
        for i in range(count)
    ]
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(sum(gen.prompt_lengths), sum(tokens)),
    }


async def _stream(
    gen: Generation, request_id: str, model: str, tok: TokenizerService, logprobs: bool, include_usage: bool
) -> AsyncIterator[str]:
    created = int(time.time())
    head = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model}
    completion_tokens = 0
    try:
        for i in range(len(gen.request_ids)):
            role = {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            yield sse({**head, "choices": [role]})
        async for i, delta in gen.deltas():
            completion_tokens += len(delta.new_token_ids)
            choice = {
                "index": i,
                "delta": {"content": delta.new_text} if delta.new_text or not delta.finished else {},
                "logprobs": {"content": await chat_logprobs(tok, delta)} if logprobs and delta.new_logprobs else None,
                "finish_reason": delta.finish_reason if delta.finished else None,
                "stop_reason": delta.stop_reason if delta.finished else None,
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
