"""One engine step as plain data: what the scheduler decided, in the shape of vLLM V1's
`SchedulerOutput`.

The runner consumes only this, never the scheduler's `Request` objects or the block
manager, so a step can be pickled and sent to other processes (tensor-parallel ranks).
The runner keeps its own copy of each request's block table and sampling parameters:
a step carries only what changed (new block ids, the tokens to compute), not whole
sequences.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmservice.server.engine.sampling_params import SamplingParams

# With overlapped scheduling (overlap.py) a step is planned before the previous step's
# tokens are known: a request's token from the step in flight is this placeholder in
# `token_ids` (always the last one), and the runner fills it from that step's sampled
# tokens where they are (on the device on CUDA), never waiting for the host.
PLACEHOLDER_TOKEN = -1


@dataclass
class ScheduledRequest:
    """One request's share of a step."""

    request_id: str
    # Tokens whose KV this step computes: a prompt chunk, the last sampled token, or a
    # recompute after preemption; at positions start_position, start_position + 1, ...
    # The last may be PLACEHOLDER_TOKEN: the token the previous step samples for it.
    token_ids: list[int]
    start_position: int
    # The runner's block table becomes table[:block_table_start] + new_block_ids: 0 when the
    # table starts over (first scheduling, recompute, swap-in), shorter than the runner's
    # table after a rollback freed blocks, its length when blocks are only appended.
    block_table_start: int
    new_block_ids: list[int]
    # True when the step reaches the end of the request's known tokens, so the last
    # position (and each speculative one) yields a sampled token.
    sample: bool
    output_index: int = 0  # output tokens generated before this step (seeded sampling's position)
    # Draft tokens to verify, computed after token_ids; rejected ones are rolled back.
    spec_token_ids: list[int] = field(default_factory=list)
    # Structured outputs: the packed token bitmask of the allowed next tokens (a torch
    # int32 tensor, filled by the engine's grammar state before the step); None: free.
    grammar_bitmask: Any = None
    lora_slot: int = -1  # --enable-lora: the device slot of its adapter; -1: the base model

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids) + len(self.spec_token_ids)

    @property
    def end_position(self) -> int:
        return self.start_position + self.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    new_requests: dict[str, SamplingParams] = field(default_factory=dict)  # first seen by the runner
    finished_request_ids: list[str] = field(default_factory=list)  # since the last step: forget them
    preempted_request_ids: list[str] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device block, cpu block), before the step
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (cpu block, device block), before the step
    num_prompt_tokens: int = 0  # of the scheduled tokens, those inside a prompt (recompute counts)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled
