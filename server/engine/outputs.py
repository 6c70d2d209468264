"""What the engine hands back: a `Delta` per request per step (only what is new), and the
`RequestOutput` that offline `generate` assembles from them; plus the incremental
detokenizer that makes the text.

A step never copies a request's whole output: shipping the full token list every step
would make each step O(length) and a whole stream quadratic. Detokenization is O(new
tokens) per step (tokenizers' DecodeStream); stop strings are matched on the text tail.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmservice.server.engine.request import TokenLogprob
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.tokenizer import TextTokenizer


@dataclass
class Delta:
    """What one request gained in one step (plain data: it crosses process boundaries)."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    new_logprobs: list[TokenLogprob] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    first_scheduled_time: float | None = None


@dataclass
class RequestOutput:
    """A finished request, as offline `generate` returns it."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""  # stop string excluded unless asked
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    num_preemptions: int = 0

    def add(self, delta: Delta) -> None:
        self.token_ids.extend(delta.new_token_ids)
        self.text += delta.new_text
        self.logprobs.extend(delta.new_logprobs)
        self.finished = delta.finished
        self.finish_reason = delta.finish_reason
        self.stop_reason = delta.stop_reason
        self.num_cached_tokens = delta.num_cached_tokens
        self.num_preemptions = delta.num_preemptions


class Detokenizer:
    """Per-request incremental text with stop-string detection."""

    def __init__(self, tokenizer: TextTokenizer, params: SamplingParams):
        self.tokenizer = tokenizer
        self.stream = tokenizer.decode_stream(skip_special_tokens=params.skip_special_tokens)
        self.stop = params.stop
        self.include_stop = params.include_stop_str_in_output
        self.max_stop_len = max((len(s) for s in self.stop), default=0)
        self.text = ""
        self.sent = 0  # characters already handed out
        self.hit_stop: str | None = None

    def update(self, new_token_ids: list[int]) -> int:
        """Add the step's tokens; returns how many were used: all of them, or up to and
        including the one that completed a stop string (the rest are dropped)."""
        for used, token in enumerate(new_token_ids, start=1):
            piece = self.stream.step(self.tokenizer.tokenizer, token)
            if piece:
                self.text += piece
                if self.stop and self._check_stop(len(piece)):
                    return used
        return len(new_token_ids)

    def _check_stop(self, piece_len: int) -> bool:
        start = max(0, len(self.text) - piece_len - self.max_stop_len + 1)
        best = None
        for s in self.stop:
            idx = self.text.find(s, start)
            if idx != -1 and (best is None or idx < best[0]):
                best = (idx, s)
        if best is None:
            return False
        idx, s = best
        self.text = self.text[: idx + len(s)] if self.include_stop else self.text[:idx]
        self.hit_stop = s
        return True

    def take_new_text(self, finished: bool) -> str:
        # Hold back a tail that could still become a stop string, unless we are done.
        limit = len(self.text) if finished or not self.stop else max(self.sent, len(self.text) - self.max_stop_len + 1)
        new = self.text[self.sent : limit]
        self.sent = limit
        return new
