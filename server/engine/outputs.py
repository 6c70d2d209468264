"""What the engine hands back each step, and the incremental detokenizer that makes it.

Detokenization is O(new tokens) per step (tokenizers' DecodeStream); stop strings are
matched on the text tail only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmservice.server.engine.request import Request, TokenLogprob
from llmservice.server.tokenizer import TextTokenizer


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # all output tokens so far
    new_token_ids: list[int]
    text: str  # all output text so far (stop string excluded unless asked)
    new_text: str
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None
    new_logprobs: list[TokenLogprob] = field(default_factory=list)
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    arrival_time: float = 0.0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None


class Detokenizer:
    """Per-request incremental text with stop-string detection."""

    def __init__(self, tokenizer: TextTokenizer, request: Request):
        sp = request.sampling_params
        self.tokenizer = tokenizer
        self.stream = tokenizer.decode_stream(skip_special_tokens=sp.skip_special_tokens)
        self.stop = sp.stop
        self.include_stop = sp.include_stop_str_in_output
        self.max_stop_len = max((len(s) for s in self.stop), default=0)
        self.text = ""
        self.sent = 0  # characters already handed out
        self.num_tokens_seen = 0
        self.hit_stop: str | None = None

    def update(self, request: Request) -> None:
        for token in request.output_token_ids[self.num_tokens_seen :]:
            piece = self.stream.step(self.tokenizer.tokenizer, token)
            self.num_tokens_seen += 1
            if piece:
                self.text += piece
                if self.stop and self._check_stop(len(piece)):
                    return

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
