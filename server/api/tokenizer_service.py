"""Tokenizer work for the API process, run in a thread pool so the event loop never
encodes, renders a chat template or decodes (the fifth batching mistake of docs/troubleshooting.md).

The API process builds its own TextTokenizer from the model's metadata only (GGUF
header or tokenizer files): it never loads weights, which stay in the engine process.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import jinja2
from llmservice.server.api.errors import APIError
from llmservice.server.tokenizer import TextTokenizer


def load_text_tokenizer(model: str) -> TextTokenizer:
    """Tokenizer and EOS ids of a model reference, read the same way the loader does."""
    from llmservice.server.model.model_info import read_model_info

    _, config, source = read_model_info(model)
    return TextTokenizer(source, config.eos_token_ids)


def message_dicts(messages) -> list[dict]:
    """Chat messages as the template expects them: content parts joined into text."""
    out = []
    for m in messages:
        content = m.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        d = {"role": m.role, "content": content or ""}
        name = getattr(m, "name", None)  # a tool message has none
        if name is not None:
            d["name"] = name
        if getattr(m, "tool_call_id", None) is not None:
            d["tool_call_id"] = m.tool_call_id
        if getattr(m, "tool_calls", None):
            from llmservice.server.api.tools import template_message_calls

            d["tool_calls"] = template_message_calls([c.model_dump() for c in m.tool_calls])
        out.append(d)
    return out


# TEST ONLY: tokenize on the event loop, each call made this many ms slower (CPU spin),
# to reproduce seed 000's fifth mistake in end-to-end tests of the advisor. Never set it
# in production: it blocks every stream of the server for that long per request.
TEST_ONLY_SLOW_TOKENIZER_ENV = "LLMSERVICE_TEST_ONLY_SLOW_TOKENIZER_ON_EVENT_LOOP_MS"


class TokenizerService:
    def __init__(self, tokenizer: TextTokenizer, workers: int = 2):
        self.tokenizer = tokenizer
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tokenizer")
        self.on_tokenize_seconds: Callable[[float], None] | None = None  # llmservice:tokenize_seconds_total
        self._test_only_loop_delay_s = float(os.environ.get(TEST_ONLY_SLOW_TOKENIZER_ENV) or 0) / 1000

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, partial(fn, *args))

    async def _run_timed(self, fn, *args):
        """Tokenizer work, timed; on the loop itself only under the test-only hook."""
        if self._test_only_loop_delay_s > 0:
            return self._timed(self._test_only_slow, fn, *args)  # on the loop: blocks it
        return await self._run(self._timed, fn, *args)

    def _test_only_slow(self, fn, *args):
        """A slow tokenizer (test only): burns the CPU, and holds the GIL, as a slow one would."""
        end = time.perf_counter() + self._test_only_loop_delay_s
        while time.perf_counter() < end:
            pass
        return fn(*args)

    def _timed(self, fn, *args):
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            if self.on_tokenize_seconds is not None:
                self.on_tokenize_seconds(time.perf_counter() - t0)

    # ---- blocking bodies (run in the pool) ---------------------------------------------------
    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        try:
            return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        except (ValueError, TypeError) as exc:  # e.g. lone surrogates cannot be encoded as UTF-8
            raise APIError(400, f"the prompt cannot be tokenized: {exc}", "prompt") from exc

    def _chat(self, messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None = None) -> list[int]:
        try:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tools=tools)
        except (ValueError, TypeError, jinja2.TemplateError) as exc:
            raise APIError(400, f"the messages cannot be rendered with the model's chat template: {exc}", "messages") from exc
        # The template already wrote the special tokens it wants (vLLM's default for chat).
        return self._encode(text, False)

    def _decode(self, ids: list[int]) -> str:
        vocab = self.tokenizer.vocab_size
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise APIError(400, f"token ids must be in [0, {vocab}); got {bad[:5]}", "tokens")
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _token_strings(self, ids: list[int]) -> list[str]:
        return [self.tokenizer.decode([i], skip_special_tokens=False) for i in ids]

    # ---- async API ----------------------------------------------------------------------------
    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return await self._run_timed(self._encode, text, add_special_tokens)

    async def encode_chat(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> list[int]:
        return await self._run_timed(self._chat, messages, add_generation_prompt, tools)

    async def run(self, fn, *args):
        """Other blocking work of a request (checking a grammar) in the same pool."""
        return await self._run(fn, *args)

    async def decode(self, ids: list[int]) -> str:
        return await self._run(self._decode, ids)

    async def token_strings(self, ids: list[int]) -> list[str]:
        """Text of single tokens (for logprobs)."""
        return await self._run(self._token_strings, ids)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
