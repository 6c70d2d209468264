"""Iteration-level scheduler (vLLM V1 rule). Decides, each step, how many tokens each
request computes; never touches tensors.

Order: running requests first (decodes and unfinished chunked prefills), then waiting
ones, within `max_num_batched_tokens` and `max_num_seqs`. When KV blocks run out a
victim chosen by the policy is preempted (recompute: its blocks are freed and it is
re-prefilled later; prefix caching usually makes that cheap), so the engine never
deadlocks under memory pressure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from llmservice.server.config import EngineConfig
from llmservice.server.engine import policy
from llmservice.server.engine.block_manager import BlockManager
from llmservice.server.engine.request import Request, RequestStatus
from llmservice.server.engine.swap_space import PreemptionCosts, SwapSpace


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Request, int]] = field(default_factory=list)  # (request, tokens this step)
    preempted: list[Request] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device block, cpu block), copy before the step
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (cpu block, device block), copy before the step

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class SchedulerStats:
    num_preemptions: int = 0
    num_swap_outs: int = 0
    num_swap_ins: int = 0
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0  # of which found


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        block_manager: BlockManager,
        swap_space: SwapSpace | None = None,
        costs: PreemptionCosts | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.config = config
        self.clock = clock
        self.bm = block_manager
        self.swap_space = swap_space or SwapSpace(0)
        self.costs = costs or PreemptionCosts()
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.swapped: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.stats = SchedulerStats()
        self.max_model_len = int(config.max_model_len or 0)

    # ---- queue management ------------------------------------------------------------
    def add(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def finish(self, request: Request, status: RequestStatus) -> None:
        """Finish a request in any state and release everything it holds."""
        if request.is_finished:
            return
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        elif request in self.swapped:
            self.swapped.remove(request)
            self.swap_space.free(request.swap_blocks)
            request.swap_blocks = []
        self.bm.free(request)
        request.status = status
        request.finish_time = self.clock()
        self.requests.pop(request.request_id, None)

    def abort(self, request_id: str) -> Request | None:
        request = self.requests.get(request_id)
        if request is not None:
            self.finish(request, RequestStatus.FINISHED_ABORTED)
        return request

    def _preempt(self, victim: Request, out: SchedulerOutput) -> None:
        self.running.remove(victim)
        victim.num_preemptions += 1
        self.stats.num_preemptions += 1
        n_blocks = self.bm.blocks_needed(victim.num_computed_tokens)
        mode = policy.choose_preemption(
            self.config.preemption_mode,
            victim.num_computed_tokens,
            self.costs,
            n_blocks,
            self.swap_space.num_free,
        )
        if mode == "swap":
            cpu_blocks = self.swap_space.allocate(n_blocks)
            out.swap_out.extend(zip(self.bm.block_ids(victim.request_id)[:n_blocks], cpu_blocks, strict=True))
            victim.swap_blocks = cpu_blocks
            victim.status = RequestStatus.SWAPPED
            self.stats.num_swap_outs += 1
            self.bm.free(victim)
            self.swapped.append(victim)
            return
        self.bm.free(victim)
        victim.status = RequestStatus.WAITING
        victim.num_computed_tokens = 0
        self.waiting.append(victim)

    def _swap_in(self, req: Request, num_new: int, out: SchedulerOutput) -> bool:
        """Bring a swapped request back: fresh device blocks, copy its KV in, keep its progress."""
        if not self.bm.allocate_slots(req, num_new):
            return False
        device_blocks = self.bm.block_ids(req.request_id)[: len(req.swap_blocks)]
        out.swap_in.extend(zip(req.swap_blocks, device_blocks, strict=True))
        self.swap_space.free(req.swap_blocks)
        req.swap_blocks = []
        self.swapped.remove(req)
        self.stats.num_swap_ins += 1
        return True

    # ---- the step decision -----------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        cfg = self.config
        budget = int(cfg.max_num_batched_tokens)
        out = SchedulerOutput()
        scheduled: dict[str, int] = {}

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            num_new = min(num_new, self.max_model_len - req.num_computed_tokens)
            if num_new <= 0:
                i += 1
                continue
            while True:
                if self.bm.allocate_slots(req, num_new):
                    scheduled[req.request_id] = num_new
                    budget -= num_new
                    i += 1
                    break
                victim = policy.pick_victim(self.running, cfg.scheduling_policy)
                victim_index = self.running.index(victim)
                self._preempt(victim, out)
                out.preempted.append(victim)
                budget += scheduled.pop(victim.request_id, 0)
                if victim is req:
                    break
                if victim_index < i:
                    i -= 1

        now = self.clock()
        if not out.preempted:
            # Swapped requests resume before new ones are admitted (their KV is already paid for).
            while self.swapped and budget > 0 and len(self.running) < cfg.max_num_seqs:
                req = policy.next_to_admit(
                    self.swapped, now, cfg.scheduling_policy, cfg.priority_aging_per_s, cfg.max_queue_delay_ms
                )
                num_new = min(req.num_tokens - req.num_computed_tokens, budget)
                if not self._swap_in(req, num_new, out):
                    break
                self.running.append(req)
                req.status = RequestStatus.RUNNING
                scheduled[req.request_id] = num_new
                budget -= num_new

        if not out.preempted and not self.swapped:
            while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
                req = policy.next_to_admit(
                    self.waiting, now, cfg.scheduling_policy, cfg.priority_aging_per_s, cfg.max_queue_delay_ms
                )
                hits, num_cached = self.bm.get_computed_blocks(req)
                num_new = req.num_tokens - num_cached
                if num_new > budget:
                    if not cfg.enable_chunked_prefill:
                        break
                    num_new = budget
                if not self.bm.allocate_slots(req, num_new, hits):
                    break
                self.waiting.remove(req)
                self.running.append(req)
                req.status = RequestStatus.RUNNING
                req.num_computed_tokens = num_cached
                if req.num_cached_tokens < 0:
                    req.num_cached_tokens = num_cached
                    req.first_scheduled_time = now
                if self.bm.enable_prefix_caching:
                    self.stats.prefix_queries += req.num_tokens
                    self.stats.prefix_hits += num_cached
                scheduled[req.request_id] = num_new
                budget -= num_new

        by_id = {r.request_id: r for r in self.running}
        out.scheduled = [(by_id[rid], n) for rid, n in scheduled.items()]
        return out

    def update(self, out: SchedulerOutput, sampled: dict[str, int]) -> list[Request]:
        """Advance computed tokens, append sampled tokens, finish what stopped.
        Returns the requests that got a new token (finished or not)."""
        now = self.clock()
        touched: list[Request] = []
        for req, num_new in out.scheduled:
            req.num_computed_tokens += num_new
            token = sampled.get(req.request_id)
            if token is not None:
                req.append_output(token)
                if req.first_token_time is None:
                    req.first_token_time = now
                req.last_token_time = now
                touched.append(req)
            self.bm.cache_blocks(req)
            if token is not None:
                status = req.check_stop(self.max_model_len)
                if status is not None:
                    self.finish(req, status)
        return touched
