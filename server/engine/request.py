"""A request's tokens and state. The engine's one rule (vLLM V1): each step brings
num_computed_tokens closer to num_tokens (prompt + output). Prefill, chunked prefill,
decode, prefix-cache hits and recompute after preemption are all that same rule.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from llmservice.server.engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in (self.FINISHED_STOPPED, self.FINISHED_LENGTH, self.FINISHED_ABORTED)


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token_id, logprob), best first


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    max_tokens: int  # resolved: never past max_model_len
    eos_token_ids: frozenset[int] = frozenset()
    priority: int = 0
    arrival_time: float = field(default_factory=time.monotonic)
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    num_cached_tokens: int = -1  # prefix-cache hit tokens at first scheduling
    num_preemptions: int = 0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    block_hashes: list[int] = field(default_factory=list)
    swap_blocks: list[int] = field(default_factory=list)  # CPU swap-pool blocks while SWAPPED
    spec_token_ids: list[int] = field(default_factory=list)  # draft tokens the next step verifies
    stop_reason: int | str | None = None
    lora_name: str | None = None  # the LoRA adapter it runs with; None: the base model

    def __post_init__(self) -> None:
        if not self.all_token_ids:
            self.all_token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    def append_output(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def truncate_output(self, num_output_tokens: int) -> None:
        """Drop output tokens past the first num_output_tokens (a stop string ended there)."""
        drop = self.num_output_tokens - num_output_tokens
        if drop > 0:
            del self.output_token_ids[num_output_tokens:]
            del self.all_token_ids[len(self.all_token_ids) - drop :]

    def check_stop(self, max_model_len: int) -> RequestStatus | None:
        """Token-level stop rules for the last output token; called once per appended token,
        however many a step brings (stop strings are text-level: the detokenizer's)."""
        last = self.output_token_ids[-1]
        sp = self.sampling_params
        if self.num_output_tokens >= sp.min_tokens:
            if not sp.ignore_eos and last in self.eos_token_ids:
                self.stop_reason = None
                return RequestStatus.FINISHED_STOPPED
            if last in sp.stop_token_ids:
                self.stop_reason = last
                return RequestStatus.FINISHED_STOPPED
        if self.num_output_tokens >= self.max_tokens or self.num_tokens >= max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None
