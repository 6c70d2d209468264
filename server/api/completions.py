"""POST /v1/completions: plain prompts (text or token ids, single or batched), streamed
as SSE chunks or collected into one response."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from llmservice.server.api.errors import APIError
from llmservice.server.api.logprob_values import json_logprob
from llmservice.server.api.params import (
    check_structured,
    completion_params,
    structured_spec,
    with_model_defaults,
    with_structured,
)
from llmservice.server.api.protocol import CompletionRequest
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
from llmservice.server.api.tokenizer_service import TokenizerService
from llmservice.server.engine.outputs import Delta
from starlette.requests import Request as HTTPRequest


def prompt_batch(prompt) -> tuple[list[str | list[int]], bool]:
    """Normalize OpenAI's four prompt shapes to a list; True if they are token ids."""
    if isinstance(prompt, str):
        return [prompt], False
    if not prompt:
        raise APIError(400, "prompt must not be empty", "prompt")
    if isinstance(prompt[0], int):
        return [prompt], True
    return list(prompt), not isinstance(prompt[0], str)


class LogprobsBuilder:
    """OpenAI completions logprobs: parallel lists plus text offsets."""

    def __init__(self, tokenizer: TokenizerService):
        self.tokenizer = tokenizer
        self.offset = 0

    async def build(self, delta: Delta, text_before: int) -> dict:
        lps = delta.new_logprobs
        ids = [lp.token_id for lp in lps]
        for lp in lps:
            ids.extend(t for t, _ in lp.top)
        strings = await self.tokenizer.token_strings(ids)
        text_of = dict(zip(ids, strings, strict=True))
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        offset = text_before
        for lp in lps:
            token = text_of[lp.token_id]
            out["tokens"].append(token)
            out["token_logprobs"].append(json_logprob(lp.logprob))
            top = {text_of[t]: json_logprob(v) for t, v in lp.top}
            top.setdefault(token, json_logprob(lp.logprob))
            out["top_logprobs"].append(top)
            out["text_offset"].append(offset)
            offset += len(token)
        return out


def _merge_logprobs(acc: dict | None, new: dict) -> dict:
    if acc is None:
        return new
    for key in acc:
        acc[key].extend(new[key])
    return acc


async def create_completion(req: CompletionRequest, raw: HTTPRequest, state: ServerState):
    arrival = time.monotonic()
    state.check_model(req.model)
    params = completion_params(with_model_defaults(req, state.sampling_defaults), state.scheduling_policy,
                               state.max_model_len, state.max_tokens_default)
    spec = structured_spec(req)
    params = with_structured(params, spec)
    prompts, are_ids = prompt_batch(req.prompt)
    with state.admitted(len(prompts) * req.n) as reservation:
        if spec is not None:  # free requests make no extra trip to the pool
            param = "structured_outputs" if req.structured_outputs else "response_format"
            await state.tokenizer.run(check_structured, spec, param)
        if are_ids:
            token_lists = [list(p) for p in prompts]
        else:
            token_lists = [await state.tokenizer.encode(p) for p in prompts]
        request_id, gen = await start_generation(
            state, reservation, raw, token_lists, params, req.n, req.priority, arrival, "cmpl", state.lora_of(req.model)
        )
    return await respond(req, request_id, gen, state, params.logprobs is not None, _stream, _collect)


async def _collect(gen: Generation, request_id: str, model: str, tok: TokenizerService, logprobs: bool) -> dict:
    count = len(gen.request_ids)
    texts = [[] for _ in range(count)]
    tokens = [0] * count
    finish: list[tuple[str | None, int | str | None]] = [(None, None)] * count
    lps: list[dict | None] = [None] * count
    builders = [LogprobsBuilder(tok) for _ in range(count)]
    lengths = [0] * count
    async for i, delta in gen.deltas():
        if logprobs and delta.new_logprobs:
            lps[i] = _merge_logprobs(lps[i], await builders[i].build(delta, lengths[i]))
        texts[i].append(delta.new_text)
        lengths[i] += len(delta.new_text)
        tokens[i] += len(delta.new_token_ids)
        if delta.finished:
            finish[i] = (delta.finish_reason, delta.stop_reason)
    choices = [
        {
            "index": i,
            "text": "".join(texts[i]),
            "logprobs": lps[i] if logprobs else None,
            "finish_reason": finish[i][0],
            "stop_reason": finish[i][1],
        }
        for i in range(count)
    ]
    prompt_tokens = sum(gen.prompt_lengths)
    return {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(prompt_tokens, sum(tokens)),
    }


async def _stream(
    gen: Generation, request_id: str, model: str, tok: TokenizerService, logprobs: bool, include_usage: bool
) -> AsyncIterator[str]:
    created = int(time.time())
    count = len(gen.request_ids)
    builders = [LogprobsBuilder(tok) for _ in range(count)]
    lengths = [0] * count
    completion_tokens = 0
    try:
        async for i, delta in gen.deltas():
            completion_tokens += len(delta.new_token_ids)
            lp = await builders[i].build(delta, lengths[i]) if logprobs and delta.new_logprobs else None
            lengths[i] += len(delta.new_text)
            choice = {
                "index": i,
                "text": delta.new_text,
                "logprobs": lp,
                "finish_reason": delta.finish_reason if delta.finished else None,
                "stop_reason": delta.stop_reason if delta.finished else None,
            }
            yield sse({"id": request_id, "object": "text_completion", "created": created, "model": model, "choices": [choice]})
        if include_usage:
            yield sse({
                "id": request_id, "object": "text_completion", "created": created, "model": model,
                "choices": [], "usage": usage(sum(gen.prompt_lengths), completion_tokens),
            })
        yield sse("[DONE]")
    except ClientDisconnected:
        return
    except Exception as exc:
        yield sse_error(exc)
        yield sse("[DONE]")
    finally:
        gen.close()
