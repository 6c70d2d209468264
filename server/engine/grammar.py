"""Constrained decoding in the engine process: grammars compiled off the step loop, and
one xgrammar matcher per constrained request that advances with each accepted token.

Why a worker thread: compiling a JSON schema against the vocabulary takes milliseconds
to seconds (xgrammar's C++ releases the GIL); doing it inside `step()` would stall every
stream in the batch. The scheduler asks `ready()` before admitting a constrained
request, so a request whose grammar is still compiling waits while the rest of the
batch runs. Compiled grammars are cached by `StructuredSpec.key` (schema text), so the
n choices of one request, and repeated schemas, compile once.

The matcher lives here, next to sampling (rank 0 / the single runner), not in the
plain-data step: the engine fills each constrained row's token bitmask before the
step and feeds the tokens the scheduler kept after it. A request preempted by
recompute keeps its matcher (its output tokens are kept too); one created late (or
after a restart of the state) replays the request's output tokens first.

xgrammar (and transformers, which it imports) load on the worker thread at the first
constrained request: servers that never constrain pay nothing.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import torch
from llmservice.server.engine.grammar_spec import StructuredSpec
from llmservice.server.tokenizer import TextTokenizer

log = logging.getLogger("llmservice.grammar")

# TEST ONLY: every grammar compile takes this many ms longer (the worker sleeps, as a
# C++ compile that releases the GIL would). Used to show that a slow compile does not
# stall other streams. Never set it in production.
TEST_ONLY_SLOW_COMPILE_ENV = "LLMSERVICE_TEST_ONLY_SLOW_GRAMMAR_COMPILE_MS"
JSON_OBJECT_SCHEMA = '{"type": "object"}'


def build_tokenizer_info(tokenizer: TextTokenizer, vocab_size: int) -> Any:
    """xgrammar's view of the vocabulary (token bytes, byte-level or sentencepiece
    encoding, stop tokens), detected by xgrammar from the HF tokenizer."""
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer.tokenizer)
    return xgr.TokenizerInfo.from_huggingface(
        hf, vocab_size=vocab_size, stop_token_ids=list(tokenizer.eos_token_ids)
    )


def compile_spec(compiler: Any, spec: StructuredSpec) -> Any:
    """One spec -> xgrammar CompiledGrammar. JSON without free whitespace: a model may
    otherwise emit newlines until max_tokens (small models often do)."""
    if spec.kind == "json_schema":
        return compiler.compile_json_schema(spec.source, any_whitespace=False)
    if spec.kind == "json_object":
        return compiler.compile_json_schema(JSON_OBJECT_SCHEMA, any_whitespace=False)
    if spec.kind == "regex":
        return compiler.compile_regex(spec.source)
    if spec.kind == "grammar":
        return compiler.compile_grammar(spec.source)
    raise ValueError(f"unknown structured output kind {spec.kind!r}")


class GrammarCompilerService:
    """Compiles on one worker thread; `submit` returns at once with a shared future."""

    def __init__(
        self, tokenizer: TextTokenizer, vocab_size: int, slow_compile_ms: float | None = None
    ):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")
        self._cache: dict[tuple[str, str], Future] = {}
        self._lock = threading.Lock()
        self._compiler: Any = None
        if slow_compile_ms is None:
            slow_compile_ms = float(os.environ.get(TEST_ONLY_SLOW_COMPILE_ENV) or 0)
        self._slow_s = slow_compile_ms / 1000
        self.compile_seconds = 0.0  # cumulative, on the worker

    def submit(self, spec: StructuredSpec) -> Future:
        with self._lock:
            fut = self._cache.get(spec.key)
            if fut is None or (fut.done() and fut.exception() is not None):
                fut = self._pool.submit(self._compile, spec)
                self._cache[spec.key] = fut
            return fut

    def _compile(self, spec: StructuredSpec) -> Any:
        t0 = time.perf_counter()
        if self._compiler is None:
            import xgrammar as xgr

            info = build_tokenizer_info(self.tokenizer, self.vocab_size)
            self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        if self._slow_s:
            time.sleep(self._slow_s)
        compiled = compile_spec(self._compiler, spec)
        self.compile_seconds += time.perf_counter() - t0
        return compiled

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


@dataclass
class _Constrained:
    future: Future
    matcher: Any = None
    error: str | None = None


class GrammarStates:
    """Per constrained request: its compile future, then its matcher."""

    def __init__(self, compiler: GrammarCompilerService):
        self.compiler = compiler
        self._states: dict[str, _Constrained] = {}
        self.mask_seconds = 0.0  # cumulative time filling bitmasks (the per-step overhead)

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._states

    def add(self, request_id: str, spec: StructuredSpec) -> None:
        self._states[request_id] = _Constrained(self.compiler.submit(spec))

    def ready(self, request_id: str) -> bool:
        """False while the request's grammar compiles (the scheduler skips it)."""
        state = self._states.get(request_id)
        return state is None or state.future.done()

    def wait_for_compiles(self, timeout_s: float) -> None:
        """Block up to timeout_s for any pending compile to finish (nothing pending: return).
        The engine calls it after an empty step, so its loop sleeps instead of spinning."""
        pending = [s.future for s in self._states.values() if not s.future.done()]
        if pending:
            wait(pending, timeout=timeout_s, return_when=FIRST_COMPLETED)

    def failed(self) -> list[tuple[str, str]]:
        """Requests whose grammar did not compile, with the reason (each reported once)."""
        out = []
        for rid, state in self._states.items():
            if state.error is None and state.future.done() and state.future.exception() is not None:
                state.error = (
                    f"{type(state.future.exception()).__name__}: {state.future.exception()}"
                )
                out.append((rid, state.error))
        return out

    def release(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    def _matcher(self, request_id: str, output_token_ids: Iterable[int]) -> Any:
        state = self._states[request_id]
        if state.matcher is None:
            import xgrammar as xgr

            state.matcher = xgr.GrammarMatcher(state.future.result())
            for token in output_token_ids:  # restore: tokens accepted before the matcher existed
                state.matcher.accept_token(token)
        return state.matcher

    def bitmask(self, request_id: str, output_token_ids: list[int]) -> torch.Tensor | None:
        """The allowed next tokens of a request, as xgrammar's packed int32 bitmask
        ([ceil(vocab / 32)], its own tensor so a step pickles only its rows)."""
        import xgrammar as xgr

        t0 = time.perf_counter()
        matcher = self._matcher(request_id, output_token_ids)
        if matcher.is_terminated():
            return None
        mask = xgr.allocate_token_bitmask(1, self.compiler.vocab_size)
        matcher.fill_next_token_bitmask(mask, 0)
        self.mask_seconds += time.perf_counter() - t0
        return mask[0]

    def accept(self, request_id: str, tokens: list[int]) -> bool:
        """Advance with the tokens the scheduler kept; True when the grammar is complete
        (terminated: only a stop token could follow, so the request is done)."""
        state = self._states.get(request_id)
        if state is None or state.matcher is None:
            return False
        for token in tokens:
            if not state.matcher.accept_token(token):
                log.warning("request %s: token %d is outside its grammar", request_id, token)
                return True
        return state.matcher.is_terminated()
